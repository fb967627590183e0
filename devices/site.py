"""Where provisioned packages live on a device, and the command that starts its Python with them.

A device keeps the packages fleetbench installs (numpy, onnxruntime) in
``<workdir>/site``, never in the device's own site-packages: a board stays as its
distribution left it, and removing the workdir removes everything fleetbench put there.
Every Python fleetbench starts on a device with its own interpreter -- the runner in
each mode, the facts probe, provisioning's check -- starts through `python_argv`, so
what one of them sees is what all of them see.

The command is a short POSIX ``sh`` script that puts the site first on ``PYTHONPATH``
and execs the interpreter (the process keeps the shell's pid, so stopping it by
pid stops Python). It runs as ``sh -c SCRIPT fleetbench-python SITE PYTHON ARGS...``:
the site and the interpreter arrive as arguments, never pasted into the script, and a
leading ``~/`` in either is the device's home (a fleet file's ``workdir: ~/.fleetbench``
means the board's home, not the host's). An interpreter that is not there exits with
status 127, as a shell's "command not found" does.
"""

from __future__ import annotations

#: Directory under the device workdir where provisioned packages are installed.
SITE_DIR = "site"

#: The start script (POSIX sh): ``$1`` the site, ``$2`` the interpreter, then its arguments.
START_SCRIPT = """\
site=$1; shift
case $site in "~/"*) site=$HOME/${site#??} ;; esac
case $1 in "~/"*) py=$HOME/${1#??}; shift; set -- "$py" "$@" ;; esac
command -v "$1" >/dev/null 2>&1 || { echo "fleetbench: $1: not found" >&2; exit 127; }
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
exec "$@"
"""


def site_path(workdir: str) -> str:
    """Return where provisioned packages live on a device with ``workdir``.

    Parameters
    ----------
    workdir : str
        The device's workdir as the fleet file gives it (a leading ``~/`` is kept: the
        device expands it).

    Returns
    -------
    str
        ``<workdir>/site``.
    """
    return f"{workdir.rstrip('/')}/{SITE_DIR}"


def python_argv(python: str, workdir: str) -> list[str]:
    """Return the command that starts the device's own ``python`` with its provisioned site importable.

    Parameters
    ----------
    python : str
        The device's interpreter (``Device.python``), a path or a name its shell finds.
    workdir : str
        The device's workdir (``Device.workdir``).

    Returns
    -------
    list of str
        ``["sh", "-c", START_SCRIPT, "fleetbench-python", <workdir>/site, python]``:
        append the interpreter's own arguments (a script, or ``-c CODE``).
    """
    return ["sh", "-c", START_SCRIPT, "fleetbench-python", site_path(workdir), python]

