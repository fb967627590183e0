"""Deployment through a content-addressed cache (CAS) on the device.

Layout on the device (``W`` is ``device.workdir``, ``~`` expanded on the device)::

    W/cas/<sha256>                 one file per content, verified, read-only (0444)
    W/cas/.tmp-<sha256>-<random>   a push in progress (removed when verified or abandoned)
    W/sets/<set name>/<file>       an artifact set: hard links (copies where links fail) of cas files
    W/runner/<sha256[:16]>/<name>  the on-device runner, the same way

Protocol of one deployment (four remote commands when something is missing, three otherwise;
`deploy_artifact_sets` runs the same steps once for several sets):

1. **check**: one command hashes every wanted entry already in ``W/cas`` on the device;
   an entry whose content does not match its name is deleted and reported as corrupt
   (then pushed again: ``repaired_files``). Abandoned ``.tmp-*`` files older than
   `STALE_TMP_S` are removed. It also says the free bytes of ``W/cas``'s file system.
2. **push** only the missing contents, each to ``W/cas/.tmp-<sha>-<random>``. When their
   bytes exceed the free bytes the check saw, nothing is pushed and `OutOfSpace` says
   both numbers. If a push fails, the temporary files of this deployment are removed
   (best effort) and the transport error propagates: ``W/cas/<sha>`` never exists with
   wrong content.
3. **commit**: one command re-hashes every pushed temporary file on the device, fsyncs it
   and renames it to ``W/cas/<sha>`` (atomic within a directory); a mismatch deletes it
   and raises `DeployError`.
4. **materialise**: one command builds the set directory in ``W/sets/.tmp-<name>-*``
   from the cas entries and renames it into place. An existing set directory is kept
   when every entry is the very cas file (same inode) or hashes right; otherwise it is
   moved aside, the new one renamed in, and the old one deleted, so a reader sees the
   complete old set, briefly no set, or the complete new set -- never a half set.

The device's Python (``device.python``, stdlib only: hashlib, json, os) does the
hashing, started with ``-S``: without the site packages, whose start-up files (``.pth``)
would cost more than a small step's work on every deployment. A device without Python
(Android's toybox shell) needs ``sha256sum``, ``ln`` or ``cp``, ``mv`` and ``mkdir``: when
running the Python fails with status 126/127 (or the local program cannot start) the same
protocol runs as POSIX shell scripts over ``sha256sum``. That fallback always rebuilds the set
directory.

A full file system on the device is `devices.errors.OutOfSpace` (kind ``"out of space"``),
one line naming the device or the path and what failed, whichever step finds it: the
push's own check above, a transport whose write failed with ``ENOSPC``, or a remote
step whose output says "No space left on device" (`devices.errors.says_out_of_space`).

Cas files are shared by hard links with every set directory: nothing may write into a
deployed set (its files are read-only; root ignores that, so the check step re-hashes,
and a set directory holding extra files is rebuilt on the next deployment). Concurrent
deployments to one device never commit wrong content, but two deploying the *same* set
at once may rebuild its directory under each other: deploy a set once per device, then
run cells on it (a campaign runs one cell per device at a time anyway).
Costs: every deployment re-hashes the wanted cache entries on the device (about 2 MB per
small CNN set; a torch wheel of ~200 MB takes seconds on a Pi-class board).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.errors import OutOfSpace, TransportError, says_out_of_space
from devices.fleet import Device
from devices.transport import RunResult, Transport

#: Seconds after which a ``.tmp-*`` entry in ``cas`` or ``sets`` counts as abandoned.
STALE_TMP_S = 3600.0
#: Default seconds one remote command of a deployment may take (hashing large wheels included).
DEFAULT_TIMEOUT_S = 300.0
MANIFEST = "manifest.json"

_PY_COMMON = r"""
import hashlib, json, os, shutil, sys, tempfile, time
A = json.loads(sys.argv[1])
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
def drop(p):
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            os.unlink(p)
        except OSError:
            pass
def sweep(d):
    now = time.time()
    for n in os.listdir(d):
        try:
            if n.startswith(".tmp-") and now - os.lstat(os.path.join(d, n)).st_mtime > A["stale"]:
                drop(os.path.join(d, n))
        except OSError:
            pass
"""

_PY_CHECK = _PY_COMMON + r"""
w = os.path.expanduser(A["workdir"])
cas = os.path.join(w, "cas")
os.makedirs(cas, exist_ok=True)
out = {"workdir": w, "present": [], "corrupt": []}
for s in A["want"]:
    p = os.path.join(cas, s)
    if not os.path.lexists(p):
        continue
    try:
        good = os.path.isfile(p) and not os.path.islink(p) and sha(p) == s
    except OSError:
        good = False
    if good:
        out["present"].append(s)
    else:
        out["corrupt"].append(s)
        drop(p)
sweep(cas)
try:
    st = os.statvfs(cas)
    out["free"] = st.f_bavail * st.f_frsize
except (OSError, AttributeError):
    out["free"] = None
print(json.dumps(out))
"""

_PY_COMMIT = _PY_COMMON + r"""
bad = []
for tmp, s in A["pushed"]:
    p = os.path.join(A["cas"], tmp)
    try:
        good = sha(p) == s
    except OSError:
        good = False
    if not good:
        bad.append(s)
        drop(p)
        continue
    with open(p, "rb") as f:
        os.fsync(f.fileno())
    os.chmod(p, 0o444)
    os.replace(p, os.path.join(A["cas"], s))
print(json.dumps({"bad": bad}))
"""

_PY_MATERIALISE = _PY_COMMON + r"""
def build(cas, parent, name, entries):
    target = os.path.join(parent, name)
    def same(n, s):
        p, c = os.path.join(target, n), os.path.join(cas, s)
        a, b = os.stat(p), os.stat(c)
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) or sha(p) == s
    def intact():
        try:
            return (os.path.isdir(target) and not os.path.islink(target)
                    and sorted(os.listdir(target)) == sorted(entries)
                    and all(same(n, s) for n, s in entries.items()))
        except OSError:
            return False
    if intact():
        return False
    os.makedirs(parent, exist_ok=True)
    sweep(parent)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + name + "-", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        for n, s in entries.items():
            try:
                os.link(os.path.join(cas, s), os.path.join(tmp, n))
            except OSError:
                shutil.copyfile(os.path.join(cas, s), os.path.join(tmp, n))
                os.chmod(os.path.join(tmp, n), 0o444)
        old = None
        if os.path.lexists(target):
            old = tmp + ".old"
            os.rename(target, old)
        os.rename(tmp, target)
        if old is not None:
            drop(old)
    except BaseException:
        drop(tmp)
        raise
    return True
print(json.dumps({"rebuilt": [build(A["cas"], d["parent"], d["name"], d["entries"]) for d in A["dirs"]]}))
"""

# The same three steps for a device without Python: POSIX sh + sha256sum (toybox has both).
_SH_CHECK = r"""
w="$1"; shift
case "$w" in "~"|"~/"*) w="$HOME${w#"~"}";; esac
mkdir -p "$w/cas" && cd "$w/cas" || exit 1
printf 'workdir %s\n' "$w"
for s in "$@"; do
  if [ -e "$s" ] || [ -L "$s" ]; then
    h=$(sha256sum < "$s" 2>/dev/null | cut -d' ' -f1)
    if [ -f "$s" ] && [ ! -L "$s" ] && [ "$h" = "$s" ]; then echo "present $s"
    else rm -rf -- "$s"; echo "corrupt $s"; fi
  fi
done
kb=$(df -Pk . 2>/dev/null | tail -n 1 | { read -r _ _ _ a _; echo "$a"; })
case "$kb" in *[!0-9]*|"") ;; *) echo "free $(( kb * 1024 ))";; esac
exit 0
"""

_SH_COMMIT = r"""
cd "$1" || exit 1; shift
while [ $# -ge 2 ]; do
  t="$1"; s="$2"; shift 2
  h=$(sha256sum < "$t" 2>/dev/null | cut -d' ' -f1)
  if [ "$h" = "$s" ]; then chmod 444 "$t"; mv -f -- "$t" "$s" || echo "bad $s"; else rm -f -- "$t"; echo "bad $s"; fi
done
exit 0
"""

_SH_MATERIALISE = r"""
cas="$1"; parent="$2"; name="$3"; shift 3
mkdir -p "$parent" || exit 1
tmp="$parent/.tmp-$name-$$"
rm -rf -- "$tmp" "$tmp.old"; mkdir "$tmp" || exit 1
while [ $# -ge 2 ]; do
  ln "$cas/$2" "$tmp/$1" 2>/dev/null || cp "$cas/$2" "$tmp/$1" || { rm -rf -- "$tmp"; exit 1; }
  shift 2
done
if [ -e "$parent/$name" ]; then mv -- "$parent/$name" "$tmp.old" || { rm -rf -- "$tmp"; exit 1; }; fi
mv -- "$tmp" "$parent/$name" || exit 1
rm -rf -- "$tmp.old"
echo rebuilt
"""


class DeployError(TransportError):
    """Content did not arrive intact on the device, or the device could not store it."""

    kind = "deploy failed"


@dataclass(frozen=True)
class DeployResult:
    """What one deployment did on one device.

    Attributes
    ----------
    remote_dir : str
        The deployed directory on the device (``~`` expanded): the set directory for
        `deploy_artifact_set`, the runner's directory for `deploy_runner`, ``<workdir>/cas``
        for `deploy_files`.
    pushed_files : tuple of str
        Names of the files whose content was pushed (missing or corrupt on the device).
    pushed_bytes : int
        Bytes pushed; 0 when everything was already in the cache.
    reused_files : tuple of str
        Names of the files whose content was already in the cache, verified.
    repaired_files : tuple of str
        Names of the files whose cache entry was corrupt, deleted and pushed again
        (also listed in ``pushed_files``).
    remote_paths : dict of str to str
        File name to its path on the device.
    workdir : str
        ``device.workdir`` as the device expanded it.
    """

    remote_dir: str
    pushed_files: tuple[str, ...]
    pushed_bytes: int
    reused_files: tuple[str, ...]
    repaired_files: tuple[str, ...]
    remote_paths: dict[str, str] = field(default_factory=dict)
    workdir: str = ""


@dataclass(frozen=True)
class _CasState:
    workdir: str
    python: str | None  # None: the shell + sha256sum fallback
    present: frozenset[str]
    corrupt: frozenset[str]
    device: str = ""
    free: int | None = None  # free bytes of the cas directory's file system, None when unknown

    @property
    def cas(self) -> str:
        return f"{self.workdir}/cas"


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a local file.

    Parameters
    ----------
    path : pathlib.Path

    Returns
    -------
    str
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def deploy_files(
    transport: Transport,
    device: Device,
    files: Sequence[Path],
    python: str | None = None,
    *,
    into: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> DeployResult:
    """Make sure the device's cache holds the content of every file in ``files``.

    Parameters
    ----------
    transport : Transport
        An open transport to ``device``.
    device : Device
        Supplies ``workdir`` (and ``python`` when ``python`` is None).
    files : sequence of pathlib.Path
        Local files; equal contents are pushed once.
    python : str, optional
        Python on the device used for hashing (``device.python`` by default); the
        ``sha256sum`` shell fallback is used when it cannot run.
    into : str, optional
        A directory relative to the workdir (e.g. ``"wheels/abc"``): the files are also
        materialised there under their own names, atomically, like an artifact set.
    timeout : float
        Seconds per remote command.

    Returns
    -------
    DeployResult
        ``remote_dir`` is ``<workdir>/cas`` (or ``<workdir>/<into>``); ``remote_paths`` maps
        each file's name to ``<workdir>/cas/<sha256>`` (or ``<workdir>/<into>/<name>``).

    Raises
    ------
    ValueError
        Two files have the same name but different contents.
    TransportError
        The device failed (`DeployError` when content did not verify on it).
    """
    paths = [Path(f) for f in files]
    hashes = [sha256_file(p) for p in paths]
    named = dict(zip((p.name for p in paths), hashes, strict=True))
    if len(named) != len(set(zip((p.name for p in paths), hashes, strict=True))):
        raise ValueError("two files of the same name with different contents")
    sources = dict(zip(hashes, paths, strict=True))
    state = _check(transport, device, python or device.python, sorted(sources), timeout)
    outcome = _sync(transport, state, sources, timeout)
    if into is None:
        return _result(state.cas, named, state, outcome, {n: f"{state.cas}/{sha}" for n, sha in named.items()})
    parent, _, name = f"{state.workdir}/{into.strip('/')}".rpartition("/")
    remote_dir = _materialise(transport, state, parent, name, named, timeout)
    return _result(remote_dir, named, state, outcome, {n: f"{remote_dir}/{n}" for n in named})


def deploy_artifact_set(
    transport: Transport,
    device: Device,
    set_dir: Path,
    *,
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> DeployResult:
    """Deploy an artifact set as ``<workdir>/sets/<set_dir.name>/`` on the device.

    Parameters
    ----------
    transport : Transport
        An open transport to ``device``.
    device : Device
        Supplies ``workdir`` and ``python``.
    set_dir : pathlib.Path
        A local artifact set directory (``manifest.json`` listing the sha256 of each file).
    python : str, optional
        Overrides ``device.python``.
    timeout : float
        Seconds per remote command.

    Returns
    -------
    DeployResult
        ``remote_dir`` is the set directory on the device; ``pushed_bytes`` is 0 when the
        device already held every file intact.

    Raises
    ------
    ValueError
        The local set has no readable manifest or a file does not match it.
    TransportError
        The device failed (`DeployError` when content did not verify on it).
    """
    set_dir = Path(set_dir)
    named = _local_set(set_dir)
    sources = {sha: set_dir / name for name, sha in named.items()}
    state = _check(transport, device, python or device.python, sorted(sources), timeout)
    outcome = _sync(transport, state, sources, timeout)
    remote_dir = _materialise(transport, state, f"{state.workdir}/sets", set_dir.name, named, timeout)
    return _result(remote_dir, named, state, outcome, {n: f"{remote_dir}/{n}" for n in named})


def deploy_set_for(
    transport: Transport,
    device: Device,
    set_dir: Path,
    backend: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> DeployResult:
    """Deploy an artifact set as ``backend`` runs it.

    A torch run needs ``model.pt`` beside the set's files, which the manifest does not
    list: such a set goes as ``<workdir>/sets/<set>+torch`` through the same
    content-addressed cache (`deploy_files`); every other backend takes the set as
    `deploy_artifact_set` lays it out.

    Parameters
    ----------
    transport : Transport
    device : Device
    set_dir : pathlib.Path
        The local set (with ``model.pt`` for torch, `exporters.torchscript`).
    backend : str
    timeout : float
        Seconds per remote command.

    Returns
    -------
    DeployResult
    """
    if backend != "torch":
        return deploy_artifact_set(transport, device, set_dir, timeout=timeout)
    files = sorted(p for p in Path(set_dir).iterdir() if p.is_file() and not p.name.startswith("."))
    return deploy_files(transport, device, files, into=f"sets/{Path(set_dir).name}+torch", timeout=timeout)


def deploy_artifact_sets(
    transport: Transport,
    device: Device,
    set_dirs: Sequence[Path],
    *,
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[DeployResult]:
    """Deploy several artifact sets at once: one check, one push, one commit, one materialise.

    The same protocol as `deploy_artifact_set`, with the steps shared by the sets: three
    remote commands in all (with Python on the device) instead of three or four per set,
    which matters on a slow device, where starting a remote command costs about a second.

    Parameters
    ----------
    transport : Transport
    device : Device
    set_dirs : sequence of pathlib.Path
        Local artifact set directories (distinct names).
    python : str, optional
        Overrides ``device.python``.
    timeout : float
        Seconds per remote command.

    Returns
    -------
    list of DeployResult
        One per set, in order; a content shared by several sets counts as pushed (files
        and bytes) in the first of them only.

    Raises
    ------
    ValueError
        Two sets of the same name, or a local set that does not match its manifest.
    TransportError
        The device failed (`DeployError` when content did not verify on it).
    """
    dirs = [Path(d) for d in set_dirs]
    if len({d.name for d in dirs}) != len(dirs):
        raise ValueError("two artifact sets of the same name")
    named_sets = [_local_set(d) for d in dirs]
    sources = {sha: d / name for d, named in zip(dirs, named_sets, strict=True) for name, sha in named.items()}
    state = _check(transport, device, python or device.python, sorted(sources), timeout)
    pushed, _ = _sync(transport, state, sources, timeout)
    parent = f"{state.workdir}/sets"
    remote = _materialise_all(transport, state, [(parent, d.name, n) for d, n in zip(dirs, named_sets, strict=True)],
                              timeout)
    results = []
    counted: set[str] = set()
    for remote_dir, named in zip(remote, named_sets, strict=True):
        mine = {sha for sha in named.values() if sha in pushed and sha not in counted}
        counted |= mine
        outcome = (mine, sum(sources[sha].stat().st_size for sha in mine))
        results.append(_result(remote_dir, named, state, outcome, {n: f"{remote_dir}/{n}" for n in named}))
    return results


def deploy_runner(
    transport: Transport,
    device: Device,
    runner_path: Path,
    *,
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Deploy the on-device runner file through the cache and return its path on the device.

    Parameters
    ----------
    transport : Transport
    device : Device
    runner_path : pathlib.Path
        The local runner file (its name is kept).
    python : str, optional
        Overrides ``device.python``.
    timeout : float
        Seconds per remote command.

    Returns
    -------
    str
        ``<workdir>/runner/<sha256[:16]>/<runner file name>`` (``~`` expanded); a changed
        runner gets a new directory, so a running old runner is never overwritten.

    Raises
    ------
    TransportError
        The device failed (`DeployError` when content did not verify on it).
    """
    runner_path = Path(runner_path)
    into = f"runner/{sha256_file(runner_path)[:16]}"
    result = deploy_files(transport, device, [runner_path], python, into=into, timeout=timeout)
    return result.remote_paths[runner_path.name]


# --------------------------------------------------------------------------- steps


def _local_set(set_dir: Path) -> dict[str, str]:
    """Return ``{file name: sha256}`` of a local set, checked against its manifest."""
    try:
        manifest = json.loads((set_dir / MANIFEST).read_text())
        listed = {name: entry["sha256"] for name, entry in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{set_dir}: no readable {MANIFEST} listing files ({exc})") from None
    named = {name: sha256_file(set_dir / name) for name in listed}
    wrong = sorted(name for name in listed if named[name] != listed[name])
    if wrong:
        raise ValueError(f"{set_dir}: {', '.join(wrong)} do not match the manifest; re-export the set")
    named[MANIFEST] = sha256_file(set_dir / MANIFEST)
    return named


def _python_missing(result: RunResult) -> bool:
    return result.rc in (126, 127)


def _run_python(transport: Transport, python: str, script: str, args: Mapping[str, Any],
                timeout: float) -> RunResult:
    payload = json.dumps({**args, "stale": STALE_TMP_S})
    return transport.run([python, "-S", "-c", script, payload], timeout=timeout)


def _check(transport: Transport, device: Device, python: str, want: Sequence[str],
           timeout: float) -> _CasState:
    """Expand the workdir (step 1),, verify wanted cas entries, delete corrupt ones."""
    try:
        result: RunResult | None = _run_python(transport, python, _PY_CHECK,
                                               {"workdir": device.workdir, "want": list(want)}, timeout)
    except TransportError as exc:
        if type(exc) is not TransportError:  # only "cannot start the program" falls back
            raise
        result = None
    if result is not None and not _python_missing(result):
        data = _json_or_fail(result, device, "check the cache")
        return _state(device, data["workdir"], python, data["present"], data["corrupt"], data.get("free"))
    result = transport.run(["sh", "-c", _SH_CHECK, "sh", device.workdir, *want], timeout=timeout)
    if not result.ok:
        raise _failure(f"{device.name}: cannot check the cache", result)
    words = [line.split(" ", 1) for line in result.stdout.splitlines() if " " in line]
    expanded = next((rest for tag, rest in words if tag == "workdir"), device.workdir)
    free = next((int(rest) for tag, rest in words if tag == "free" and rest.isdigit()), None)
    return _state(device, expanded, None,
                  [s for tag, s in words if tag == "present"], [s for tag, s in words if tag == "corrupt"], free)


def _state(device: Device, expanded: str, python: str | None, present: Iterable[str],
           corrupt: Iterable[str], free: Any = None) -> _CasState:
    # Only a leading ``~`` takes the device's word: other paths stay as written (on the
    # emulated phone the device answers with its sandbox's host path, which sync refuses).
    workdir = expanded if device.workdir.startswith("~") else device.workdir
    return _CasState(workdir.rstrip("/") or "/", python, frozenset(present), frozenset(corrupt), device.name,
                     int(free) if isinstance(free, int) and not isinstance(free, bool) else None)


def _sync(transport: Transport, state: _CasState, sources: Mapping[str, Path], timeout: float) -> tuple[set[str], int]:
    """Push (step 2) and commit (step 3) the missing contents; return (pushed shas, bytes).

    Contents larger than the free bytes the check saw are refused before anything is pushed.
    """
    missing = sorted(set(sources) - state.present)
    needed = sum(sources[sha].stat().st_size for sha in missing)
    if state.free is not None and needed > state.free:
        raise OutOfSpace(f"{state.device}: pushing {len(missing)} file(s) to {state.cas} needs {needed} bytes, "
                         f"{state.free} bytes are free there")
    pushed: list[tuple[str, str]] = []
    try:
        for sha in missing:
            tmp = f".tmp-{sha}-{secrets.token_hex(4)}"
            pushed.append((tmp, sha))
            transport.put(sources[sha], f"{state.cas}/{tmp}")
    except BaseException:
        _discard(transport, state, [tmp for tmp, _ in pushed], timeout)
        raise
    if pushed:
        _commit(transport, state, pushed, timeout)
    return set(missing), needed


def _commit(transport: Transport, state: _CasState, pushed: Sequence[tuple[str, str]],
            timeout: float) -> None:
    if state.python is not None:
        result = _run_python(transport, state.python, _PY_COMMIT,
                             {"cas": state.cas, "pushed": [list(p) for p in pushed]}, timeout)
        bad = _json_or_fail(result, state.device, "commit pushed files")["bad"]
    else:
        flat = [item for pair in pushed for item in pair]
        result = transport.run(["sh", "-c", _SH_COMMIT, "sh", state.cas, *flat], timeout=timeout)
        if not result.ok:
            raise _failure(f"{state.device}: cannot commit pushed files", result)
        bad = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("bad ")]
    if bad:
        raise DeployError(f"{len(bad)} pushed file(s) did not verify on the device (sha256 {', '.join(bad)})")


def _discard(transport: Transport, state: _CasState, tmps: Sequence[str], timeout: float) -> None:
    """Best effort: remove this deployment's temporary files after a failed push."""
    if not tmps:
        return
    try:
        transport.run(["rm", "-f", "--", *(f"{state.cas}/{t}" for t in tmps)], timeout=min(timeout, 30.0))
    except TransportError:
        pass  # the device is gone; the next check removes them once stale


def _materialise(transport: Transport, state: _CasState, parent: str, name: str,
                 named: Mapping[str, str], timeout: float) -> str:
    """Build (step 4) ``parent/name`` from cas entries and rename it into place."""
    return _materialise_all(transport, state, [(parent, name, named)], timeout)[0]


def _materialise_all(transport: Transport, state: _CasState, dirs: Sequence[tuple[str, str, Mapping[str, str]]],
                     timeout: float) -> list[str]:
    """Build (step 4) every ``(parent, name, entries)`` directory: one remote command with Python."""
    if state.python is not None:
        listed = [{"parent": parent, "name": name, "entries": dict(named)} for parent, name, named in dirs]
        what = f"materialise {', '.join(name for _, name, _ in dirs)}"
        _json_or_fail(_run_python(transport, state.python, _PY_MATERIALISE, {"cas": state.cas, "dirs": listed},
                                  timeout), state.device, what)
    else:
        for parent, name, named in dirs:
            flat = [item for pair in named.items() for item in pair]
            result = transport.run(["sh", "-c", _SH_MATERIALISE, "sh", state.cas, parent, name, *flat],
                                   timeout=timeout)
            if not result.ok:
                raise _failure(f"{state.device}: cannot materialise {name} in {parent}", result)
    return [f"{parent}/{name}" for parent, name, _ in dirs]


def _result(remote_dir: str, named: Mapping[str, str], state: _CasState,
            outcome: tuple[set[str], int], paths: dict[str, str]) -> DeployResult:
    pushed, nbytes = outcome
    return DeployResult(
        remote_dir=remote_dir,
        pushed_files=tuple(n for n, sha in named.items() if sha in pushed),
        pushed_bytes=nbytes,
        reused_files=tuple(n for n, sha in named.items() if sha not in pushed),
        repaired_files=tuple(n for n, sha in named.items() if sha in state.corrupt),
        remote_paths=paths,
        workdir=state.workdir,
    )


def _json_or_fail(result: RunResult, device: Device | str, what: str) -> dict[str, Any]:
    name = device.name if isinstance(device, Device) else device
    where = f"{name}: " if name else ""
    if not result.ok:
        raise _failure(f"{where}cannot {what}", result)
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeployError(f"{where}cannot {what}: unreadable answer {_tail(result)}") from None
    if not isinstance(data, dict):
        raise DeployError(f"{where}cannot {what}: unreadable answer {_tail(result)}")
    return data


def _failure(what: str, result: RunResult) -> TransportError:
    """Return the error of a failed remote step: `OutOfSpace` when its output says the disk is full, else `DeployError`.

    Parameters
    ----------
    what : str
        The device and the step that failed (``"pi: cannot check the cache"``).
    result : RunResult
        The step's command.

    Returns
    -------
    TransportError
        Its message is ``what`` and the end of the command's output.
    """
    error = OutOfSpace if says_out_of_space(result.stderr + result.stdout) else DeployError
    return error(f"{what}: {_tail(result)}")


def _tail(result: RunResult) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return f"exit {result.rc}: {text[-1] if text else 'no output'}"
