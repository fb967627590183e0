"""The virtual environment of the ``onnx-latest`` backend: the newest ``onnxruntime`` and numpy.

The training benchmark runs the portable step model a second time under the newest plain
``onnxruntime`` release from PyPI, next to the ``onnxruntime-training`` build the project pins.
Its environment is made once with ``python -m venv`` (this interpreter's Python) and cached under
``~/.cache/fleetbench/bench/ort-latest-py<major><minor>``; a run asks pip for the newest release
(or takes the version it is given) and reinstalls only when the environment holds another one.
Without an answer from the index, the cached environment is used as it is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

#: The distribution the environment is made for.
PACKAGE = "onnxruntime"


class EnvironmentFailure(RuntimeError):
    """The environment could not be made or filled (its message is one line for the user)."""


def cache_dir() -> Path:
    """Return the directory of the benchmark's cached environments.

    Returns
    -------
    Path
        ``$XDG_CACHE_HOME/fleetbench/bench`` (``~/.cache`` without the variable).
    """
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fleetbench" / "bench"


def env_dir() -> Path:
    """Return the environment's directory for this interpreter's Python version.

    Returns
    -------
    Path
    """
    return cache_dir() / f"ort-latest-py{sys.version_info[0]}{sys.version_info[1]}"


def parse_index_versions(text: str, package: str = PACKAGE) -> str | None:
    """Read the newest version from ``pip index versions PACKAGE``'s output.

    Parameters
    ----------
    text : str
        pip's standard output; its first line is ``PACKAGE (VERSION)``.
    package : str

    Returns
    -------
    str or None
        The version, or None when the output does not name it.
    """
    match = re.search(rf"^{re.escape(package)} \(([^)\s]+)\)", text, flags=re.MULTILINE | re.IGNORECASE)
    return match.group(1) if match else None


def installed_version(python: Path, package: str = PACKAGE) -> str | None:
    """Return the version of ``package`` installed for ``python``, or None.

    Parameters
    ----------
    python : Path
        The environment's interpreter.
    package : str

    Returns
    -------
    str or None
        None when the interpreter is missing or does not hold the package.
    """
    if not python.exists():
        return None
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def newest_version(python: Path, package: str = PACKAGE) -> str | None:
    """Ask the package index (through ``python``'s pip) for the newest release of ``package``.

    Parameters
    ----------
    python : Path
    package : str

    Returns
    -------
    str or None
        None when pip cannot reach the index or names no version.
    """
    done = subprocess.run(
        [str(python), "-m", "pip", "index", "versions", package],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    return parse_index_versions(done.stdout) if done.returncode == 0 else None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _create(target: Path) -> None:
    """Make an empty environment at ``target`` (made aside, then renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        done = subprocess.run([sys.executable, "-m", "venv", str(scratch)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EnvironmentFailure(f"python -m venv {target} failed: {_last_line(done.stderr)}")
        scratch.chmod(0o755)
        os.replace(scratch, target)  # the interpreter finds its pyvenv.cfg relative to itself
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _install(python: Path, version: str | None, say: Callable[[str], None]) -> None:
    """Install ``onnxruntime`` (``version``, else the newest) and the newest numpy for ``python``.

    pip's steps (collecting, downloading, installing) are passed to ``say`` as they come.
    """
    spec = f"{PACKAGE}=={version}" if version else PACKAGE
    argv = [str(python), "-m", "pip", "install", "--upgrade", "--progress-bar", "off", spec, "numpy"]
    steps = ("Collecting", "Downloading", "Installing", "Successfully")
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            line = line.strip()
            if line:
                tail = [*tail[-19:], line]
            if line.startswith(steps):
                say(f"  pip: {line}")
        status = pip.wait()
    if status != 0:
        errors = [line for line in tail if line.startswith("ERROR")] or tail or ["no output"]
        raise EnvironmentFailure(f"pip install {spec} numpy failed: {errors[-1]}")


def ensure(version: str | None = None, say: Callable[[str], None] = print) -> tuple[Path, str]:
    """Return the environment's interpreter and its onnxruntime version, making it where needed.

    Parameters
    ----------
    version : str, optional
        The onnxruntime release to hold; None: the newest the index offers.
    say : callable
        Receives one line per step that takes time (creating, asking the index, installing).

    Returns
    -------
    python : Path
    version : str
        The onnxruntime version it holds.

    Raises
    ------
    EnvironmentFailure
        When the environment cannot be made, or pip fails to fill it.
    """
    target = env_dir()
    python = target / "bin" / "python"
    have = installed_version(python)
    if not python.exists():
        say(f"onnx-latest: creating {target}")
        shutil.rmtree(target, ignore_errors=True)
        _create(target)
    wanted = version
    if wanted is None:
        say("onnx-latest: asking the package index for the newest onnxruntime")
        wanted = newest_version(python)
        if wanted is None and have is not None:
            say(f"onnx-latest: no answer from the index; using the cached onnxruntime {have}")
            return python, have
    if have is None or wanted != have:
        say(f"onnx-latest: installing onnxruntime {wanted or '(newest)'} and numpy into {target}")
        _install(python, wanted, say)
        have = installed_version(python)
        if have is None:
            raise EnvironmentFailure(f"pip installed no onnxruntime into {target}")
    return python, have
