"""Which Python a device's runner starts with, and runtime bundles pushed to phones without one.

An SSH or local device runs the runner with its own ``device.python``. An adb device
(a phone) usually has none: its shell finds no ``python3``. For such a phone
`provision_phone` pushes the runtime bundle of its ABI (`devices.bundle`) into its
workdir and the runner starts through the bundle's own loader (`runner_start`). A phone
whose ``device.python`` runs (Termux) keeps using it; either way the choice is a
`harness.contract.RunnerStart` whose ``detail`` says what was chosen and why.

Layout on the phone (``W`` is ``device.workdir``, ``/data/local/tmp/fleetbench`` by default)::

    W/cas/<sha256>                  the bundle's parts (ustar archives), as any deployed file
    W/runtime/<abi>-<ident>/        the unpacked bundle, verified; the runner's Python
    W/runtime/.tmp-<abi>-<ident>-N  an unpacking in progress (removed by the next one)

Decisions, with the reasons:

* **Parts through the content-addressed cache, one deployment per part**
  (`harness.deploy.deploy_files`): each part is pushed only when missing, verified by
  sha256 on the phone and renamed into place. Deploying the parts one by one (rather
  than as one set) commits every part as soon as it arrived, so a push interrupted in
  the third part resumes there: the next provision finds the first two in the cache.
  A part whose cache entry was corrupted is found by the same check and pushed again.
* **Unpacked once, into a directory renamed into place** after ``sha256sum -c`` of the
  bundle's own file list passed (toybox has ``tar`` and ``sha256sum -c``), so the
  runtime directory is either complete and verified or absent. `provision_phone`
  verifies an existing runtime the same way and unpacks it again from the cached parts
  when a file no longer matches; `runner_start` (every campaign and FL run) only checks
  that the runtime's stamp is there, which costs one command instead of hashing 100 MB.
* **Parts stay in the cache after unpacking.** That doubles the storage (about 240 MB
  for the x86_64 bundle) but lets a corrupted runtime be repaired without pushing again
  and keeps a second provision at zero bytes pushed. Before pushing, the space needed
  (missing parts, plus the unpacked tree when it is absent) is compared with ``df``'s
  free bytes in the workdir; too little is one line with both numbers (`devices.errors.OutOfSpace`),
  and the other devices go on.
* **Backends**: a bundle runs the ``onnx`` backend only (the portable step model on the
  plain onnxruntime package); onnxruntime-training has no wheels for phones. That fact
  is the runtime's (`BUNDLE_BACKENDS`, carried as `RunnerStart.backends`); which backend
  a device uses is decided in one place, `harness.backends` (``why_not``: "a runtime
  bundle runs onnx only"), from the report of `harness.provision`, which chooses each
  device's runtime here (`device_runtime`) and runs its package check through that
  runtime's Python. ``--backend auto`` therefore gives the bundle phone ``onnx``.
* **A phone that has a working Python** (Termux) keeps it; `harness.provision` checks
  and installs its packages as for any device.
* `runner_start` provisions a phone whose runtime is missing, so ``fleetbench profile``,
  ``fl run --fleet`` and the demo work on a fresh phone without a separate provision
  (their backend check, `harness.provision.fleet_backends`, has usually done so already;
  `runner_start` then only finds the runtime's stamp).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devices import bundle as bundles
from devices.errors import OutOfSpace, TransportError, says_out_of_space
from devices.fleet import Device
from devices.transport import Transport
from harness.contract import RunnerStart, python_start
from harness.deploy import DEFAULT_TIMEOUT_S, DeployError, deploy_files

Printer = Callable[[str], None]

#: Directory under the workdir holding unpacked bundles.
RUNTIME_DIR = "runtime"
#: Backends a runtime bundle offers.
BUNDLE_BACKENDS: tuple[str, ...] = ("onnx",)
#: Seconds for unpacking and verifying a bundle on the phone.
UNPACK_TIMEOUT_S = 600.0


class UnsupportedAbiError(TransportError):
    """The phone's ABI has no runtime bundle."""

    kind = "unsupported ABI"


class MissingRuntime(TransportError):
    """The phone has no Python and no runtime bundle (and provisioning was not allowed)."""

    kind = "missing runtime"


@dataclass(frozen=True)
class PhoneState:
    """What a phone said about its runtime (`probe`).

    Attributes
    ----------
    workdir : str
        ``device.workdir``, ``~`` expanded by the phone.
    abi : str
        ``ro.product.cpu.abi``, else ``uname -m``.
    python : str or None
        Version of ``device.python`` when it runs, else None.
    free_bytes : int or None
        Free bytes in the workdir's file system (``df``), None when ``df`` did not say.
    runtimes : tuple of str
        Names of the unpacked runtimes under ``W/runtime`` (``<abi>-<ident>``).
    parts : tuple of str
        sha256 names present in ``W/cas`` among those asked about.
    """

    workdir: str
    abi: str
    python: str | None
    free_bytes: int | None
    runtimes: tuple[str, ...]
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeReport:
    """What `provision_phone` did on one device.

    Attributes
    ----------
    start : RunnerStart
        How the runner starts there.
    pushed_parts : tuple of str
        Parts pushed (missing or corrupt in the phone's cache).
    pushed_bytes : int
    repaired : tuple of str
        Parts whose cache entry was corrupt, and ``"runtime"`` when the unpacked tree was.
    push_seconds : float
        Wall time of checking, pushing and committing the parts.
    unpack_seconds : float
        Wall time of unpacking and verifying (0 when the runtime was already there).
    bundle_bytes : int
        Size of the unpacked bundle (0 for a phone using its own Python).
    """

    start: RunnerStart
    pushed_parts: tuple[str, ...] = ()
    pushed_bytes: int = 0
    repaired: tuple[str, ...] = ()
    push_seconds: float = 0.0
    unpack_seconds: float = 0.0
    bundle_bytes: int = 0

    def describe(self, name: str) -> str:
        """One line: the runtime chosen, and what was pushed."""
        if self.start.runtime != "bundle":
            return f"{name}: runtime: {self.start.detail}"
        pushed = (f"pushed {len(self.pushed_parts)} parts, {self.pushed_bytes / 1e6:.1f} MB in "
                  f"{self.push_seconds:.1f} s" if self.pushed_parts else "nothing pushed (all parts cached)")
        unpacked = f", unpacked and verified in {self.unpack_seconds:.1f} s" if self.unpack_seconds else ""
        repaired = f"; repaired {', '.join(self.repaired)}" if self.repaired else ""
        return f"{name}: runtime: {self.start.detail}; {pushed}{unpacked}{repaired}"


_SH_PROBE = r"""
w="$1"; py="$2"; shift 2
case "$w" in "~"|"~/"*) w="$HOME${w#"~"}";; esac
mkdir -p "$w" 2>/dev/null
echo "workdir $w"
abi=$(getprop ro.product.cpu.abi 2>/dev/null)
[ -n "$abi" ] || abi=$(uname -m 2>/dev/null)
echo "abi $abi"
if command -v "$py" >/dev/null 2>&1; then
  v=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) && echo "python $v"
fi
kb=$(df -Pk "$w" 2>/dev/null | tail -n 1 | { read -r _ _ _ a _; echo "$a"; })
case "$kb" in *[!0-9]*|"") ;; *) echo "free $(( kb * 1024 ))";; esac
for d in "$w/runtime"/*; do
  [ -f "$d/.fleetbench-bundle.json" ] && echo "runtime ${d##*/}"
done
for s in "$@"; do [ -f "$w/cas/$s" ] && echo "part $s"; done
exit 0
"""

_SH_UNPACK = r"""
w="$1"; name="$2"; shift 2
rt="$w/runtime"; tmp="$rt/.tmp-$name-$$"
mkdir -p "$rt" || exit 1
rm -rf "$rt"/.tmp-* 2>/dev/null
mkdir "$tmp" || exit 1
for s in "$@"; do
  tar -xf "$w/cas/$s" -C "$tmp" || { rm -rf "$tmp"; echo "cannot unpack part $s"; exit 1; }
done
bad=$(cd "$tmp" && sha256sum -c .fleetbench-files.sha256 2>&1 | grep -v ': OK$' | head -n 3)
if [ -n "$bad" ]; then rm -rf "$tmp"; echo "verify failed: $bad"; exit 1; fi
if [ -e "$rt/$name" ]; then mv "$rt/$name" "$tmp.old" || { rm -rf "$tmp"; exit 1; }; fi
mv "$tmp" "$rt/$name" || exit 1
rm -rf "$tmp.old"
echo unpacked
"""

_SH_VERIFY = r"""
cd "$1" 2>/dev/null || { echo "missing"; exit 0; }
sha256sum -c .fleetbench-files.sha256 2>&1 | grep -v ': OK$' | head -n 3
exit 0
"""


def probe(transport: Transport, device: Device, parts: Sequence[str] = (),
          timeout: float = DEFAULT_TIMEOUT_S) -> PhoneState:
    """Ask a phone for its ABI, Python, free storage, unpacked runtimes and cached parts (one command).

    Parameters
    ----------
    transport : Transport
    device : Device
    parts : sequence of str
        sha256 names of bundle parts to look for in the phone's cache.
    timeout : float

    Returns
    -------
    PhoneState

    Raises
    ------
    TransportError
        The phone did not answer.
    """
    result = transport.run(["sh", "-c", _SH_PROBE, "sh", device.workdir, device.python, *parts], timeout=timeout)
    words = [line.split(" ", 1) for line in result.stdout.splitlines() if " " in line]
    found: dict[str, list[str]] = {}
    for tag, value in words:
        found.setdefault(tag, []).append(value.strip())
    if "workdir" not in found:
        raise TransportError(f"{device.name}: cannot probe the runtime: {result.stdout.strip()[-200:] or 'no output'}")
    expanded = found["workdir"][0] if device.workdir.startswith("~") else device.workdir
    free = (found.get("free") or [""])[0]
    python = found["python"][0] if found.get("python") else None
    return PhoneState(
        expanded.rstrip("/"), (found.get("abi") or [""])[0], python,
        int(free) if free.isdigit() else None, tuple(found.get("runtime", ())), tuple(found.get("part", ())),
    )


def bundle_start(root: str, built: bundles.Bundle) -> RunnerStart:
    """Return the `RunnerStart` of a bundle unpacked at ``root`` on the device.

    Parameters
    ----------
    root : str
        The runtime directory on the device.
    built : devices.bundle.Bundle

    Returns
    -------
    RunnerStart
        ``env PYTHONHOME=root ... root/lib/<loader> --library-path root/lib root/bin/python3``.
    """
    versions = built.versions
    detail = (f"runtime bundle {built.abi.name} (python {versions.get('python')}, onnxruntime "
              f"{versions.get('onnxruntime')}) at {root}, started through its own loader; backend "
              f"{'/'.join(BUNDLE_BACKENDS)}")
    return RunnerStart(tuple(bundles.python_argv(root, built.abi.loader)), "bundle", BUNDLE_BACKENDS, detail)


def _runtime_name(built: bundles.Bundle) -> str:
    return f"{built.abi.name}-{built.ident}"


def _bundle_for(device: Device, state: PhoneState, say: Printer) -> bundles.Bundle:
    try:
        abi = bundles.abi_of(state.abi)
    except bundles.UnsupportedAbi as exc:
        raise UnsupportedAbiError(f"{device.name}: {exc}") from None
    try:
        return bundles.ensure_bundle(abi, say=say)
    except bundles.BundleError as exc:
        raise MissingRuntime(f"{device.name}: no python3 and no runtime bundle: {exc}") from None


def provision_phone(transport: Transport, device: Device, *, verify: bool = True, say: Printer = print,
                    timeout: float = DEFAULT_TIMEOUT_S) -> RuntimeReport:
    """Choose a phone's runtime; push, unpack and verify the runtime bundle when it has no Python.

    Parameters
    ----------
    transport : Transport
        An open transport to the phone.
    device : Device
    verify : bool
        Hash an existing runtime against its file list (and unpack it again when a file
        no longer matches); False trusts a runtime whose stamp is there.
    say : callable
        Receives progress lines (a bundle build on the host).
    timeout : float
        Seconds per remote command (unpacking gets at least `UNPACK_TIMEOUT_S`).

    Returns
    -------
    RuntimeReport

    Raises
    ------
    devices.errors.OutOfSpace
        Too little free storage: one line with the bytes needed and free.
    UnsupportedAbiError
        The phone's ABI has no bundle.
    TransportError
        The phone failed (`harness.deploy.DeployError` when content did not verify).
    """
    state = probe(transport, device, timeout=timeout)
    if state.python is not None:
        detail = f"the device's own {device.python} (Python {state.python})"
        return RuntimeReport(python_start(device.python, device.workdir, detail))
    built = _bundle_for(device, state, say)
    name = _runtime_name(built)
    root = f"{state.workdir}/{RUNTIME_DIR}/{name}"
    shas = [p.sha256 for p in built.parts]
    state = probe(transport, device, shas, timeout=timeout)
    present = name in state.runtimes
    repaired: list[str] = []
    if present and verify:
        bad = transport.run(["sh", "-c", _SH_VERIFY, "sh", root], timeout=max(timeout, UNPACK_TIMEOUT_S))
        if bad.stdout.strip():
            present = False
            repaired.append("runtime")
    if present:
        return RuntimeReport(bundle_start(root, built), bundle_bytes=built.size, repaired=tuple(repaired))
    missing = [p for p in built.parts if p.sha256 not in state.parts]
    needed = sum(p.size for p in missing) + built.size
    if state.free_bytes is not None and state.free_bytes < needed:
        raise OutOfSpace(f"{device.name}: the runtime bundle needs {needed} bytes in {state.workdir}, "
                      f"{state.free_bytes} bytes are free")
    started = time.monotonic()
    pushed: list[str] = []
    pushed_bytes = 0
    for part in built.parts:
        done = deploy_files(transport, device, [part.path], timeout=timeout)
        if done.pushed_files:
            pushed.append(part.name)
            pushed_bytes += done.pushed_bytes
        repaired.extend(part.name for _ in done.repaired_files)
    push_seconds = time.monotonic() - started
    started = time.monotonic()
    result = transport.run(["sh", "-c", _SH_UNPACK, "sh", state.workdir, name, *shas],
                           timeout=max(timeout, UNPACK_TIMEOUT_S))
    if "unpacked" not in result.stdout:
        tail = (result.stdout.strip() or result.stderr.strip() or f"exit {result.rc}").splitlines()[-1]
        failure = OutOfSpace if says_out_of_space(tail) else DeployError
        raise failure(f"{device.name}: cannot unpack the runtime bundle in {root}: {tail}")
    return RuntimeReport(bundle_start(root, built), tuple(pushed), pushed_bytes, tuple(repaired), push_seconds,
                         time.monotonic() - started, built.size)


def device_runtime(transport: Transport, device: Device, *, verify: bool = True, say: Printer = print,
                   timeout: float = DEFAULT_TIMEOUT_S) -> RuntimeReport:
    """Choose the runtime of any device: its own Python, or for a phone without one its bundle, provisioned.

    Parameters
    ----------
    transport : Transport
        An open transport to the device (not used for SSH and local devices).
    device : Device
    verify : bool
        As for `provision_phone`.
    say : callable
        Receives progress lines (a bundle build on the host).
    timeout : float

    Returns
    -------
    RuntimeReport
        For an SSH or local device, ``device.python`` and nothing pushed.

    Raises
    ------
    devices.errors.OutOfSpace, UnsupportedAbiError, TransportError
        As `provision_phone`.
    """
    if device.kind != "adb":
        return RuntimeReport(python_start(device.python, device.workdir))
    return provision_phone(transport, device, verify=verify, say=say, timeout=timeout)


def runner_start(transport: Transport, device: Device, *, provision: bool = True, say: Printer = print,
                 timeout: float = DEFAULT_TIMEOUT_S) -> RunnerStart:
    """Return how ``device`` starts the runner's Python.

    Parameters
    ----------
    transport : Transport
        An open transport to the device.
    device : Device
    provision : bool
        Push the runtime bundle to a phone that has neither Python nor the bundle (else
        `MissingRuntime`).
    say : callable
        Receives progress lines when a bundle is built or pushed.
    timeout : float

    Returns
    -------
    RunnerStart
        ``device.python`` for every device but a phone without a working Python.
    """
    if device.kind != "adb":
        return python_start(device.python, device.workdir)
    if not provision:
        state = probe(transport, device, timeout=timeout)
        if state.python is not None:
            return python_start(device.python, device.workdir)
        built = _bundle_for(device, state, say)
        if _runtime_name(built) not in state.runtimes:
            raise MissingRuntime(f"{device.name}: no Python and no runtime bundle; run `fleetbench fleet provision`")
        return bundle_start(f"{state.workdir}/{RUNTIME_DIR}/{_runtime_name(built)}", built)
    report = device_runtime(transport, device, verify=False, say=say, timeout=timeout)
    if report.pushed_parts or report.unpack_seconds:
        say(report.describe(device.name))
    return report.start
