"""``fleetbench demo``: the three journeys on an emulated fleet, in one command.

1. **Fleet**: the example emulated fleet (fast / mid / slow SSH devices and the phone,
   `devices/fleets/emulated.yaml`) is written into the demo directory on free loopback
   ports and brought up. Without OpenSSH's ``sshd`` (or when ``--local`` is given) the
   demo says so and uses three local devices instead, which run at the host's speed.
   Each device is then asked what it can run and uses its best available runner
   backend (ort > onnx > torch, `harness.backends`; ``--backend`` names one for all;
   the phone, which has no Python, first gets its runtime bundle and so runs onnx,
   `harness.phone_runtime`);
   a device with none is reported with its reason and left out of the rest.
2. **Export**: the default model (``fjord-cnn``) at widths 0.25-1.0 with the SGD
   optimizer graph, which both the profile and the FL rounds train with.
3. **Profile**: every device x width into the demo's store, the devices that share this
   machine's cpus one at a time (the example fleet pins its slowest device to a cpu of its
   own, so two lanes run side by side; the plan is printed), each cell sampled until its
   median is within +-2 % or `DEMO_MAX_SECONDS` (then flagged imprecise).
4. **Tiers**: from the profiles (`fl.scheduling.assign_tiers`): each device's widest width
   whose predicted training time meets the deadline (the median device's full-width
   time), devices clustered into two tiers.
5. **FL**: hardware-in-the-loop rounds on MNIST 5k with the ``devices`` executor, one
   client per device: FjORD with each client's p_max from its tier (width sampled per
   round on a device), then FLuID, which finds the straggler from the measured round
   times and sizes its sub-model from its device's measured latency curve.
6. **Report**: ``report.html`` with the profile and both FL runs.

Everything lands in ``--out`` (default ``./fleetbench-demo``): ``fleetbench.db``,
``report/``, ``artifacts/`` and the fleet's state. The emulated fleet is stopped at
the end unless ``--keep-up``. This module is top-level glue: it calls the
packages the way the individual commands do and holds no logic of its own. Its
arguments are checked before anything is created or started.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Widths the demo exports, profiles and offers to tiers.
DEMO_WIDTHS = (0.25, 0.5, 0.75, 1.0)

#: Training batch of every artifact set the demo uses.
DEMO_BATCH = 20

#: Per-cell cap on warm-up and sampling: a cell on an idle emulated device reaches +-2 % in
#: about a second; a busy machine gets its cells flagged imprecise rather than a longer demo.
DEMO_MAX_SECONDS = 2.0


class Progress:
    """Print numbered steps and indented detail lines with the elapsed time.

    Parameters
    ----------
    steps : int
        Number of steps announced.
    out : callable
        Receives each line (``print`` to stdout by default).
    clock : callable
        Monotonic clock in seconds.
    """

    def __init__(self, steps: int, out: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic):
        self.steps, self.out, self.clock = steps, out, clock
        self.start = clock()
        self.step_no = 0

    def step(self, title: str) -> None:
        """Announce the next step."""
        self.step_no += 1
        self.out(f"[{self.step_no}/{self.steps}] {title}  (+{self.clock() - self.start:.0f} s)")

    def detail(self, line: str) -> None:
        """Print one indented line under the current step."""
        self.out(f"      {line}")

    @property
    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return self.clock() - self.start


def local_fleet_text(directory: Path) -> str:
    """Return a fleet file of three local devices (the demo without ``sshd``)."""
    lines = ["devices:"]
    for name in ("fast", "mid", "slow"):
        lines += [f"  - name: {name}", "    kind: local", "    threads: 1", f"    workdir: {directory / name}"]
    return "\n".join(lines) + "\n"


def prepare_fleet(out: Path, local: bool, progress: Progress) -> tuple[Any, bool]:
    """Write and (for emulated devices) start the demo fleet.

    Returns
    -------
    fleet : devices.fleet.Fleet
    emulated : bool
        Whether emulated devices were started (and must be stopped).
    """
    from devices import emulate
    from devices.fleetfile import load_fleet
    from devices.sshd import SshdError, free_port, sshd_binary
    from exporters.errors import InputError

    if not local:
        try:
            sshd_binary()
        except SshdError as exc:
            progress.detail(f"OpenSSH sshd is not available ({exc}); running on local devices only")
            local = True
    if local:
        path = out / "fleet" / "fleet.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(local_fleet_text(out / "fleet"))
        return load_fleet(path), False
    fleet = load_fleet(emulate.write_example_fleet(out / "fleet", free_port))
    result = emulate.up(fleet, say=progress.detail)
    if result.failed:
        for name, reason in result.failed.items():
            progress.detail(f"{name} did not start: {reason}")
    up = [d for d in fleet.devices if d.name not in result.failed]
    if not up:
        raise InputError("no emulated device started; try `fleetbench demo --local`")
    return dataclasses.replace(fleet, devices=tuple(up)), True


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; return the exit status (0 when every step produced its output)."""
    from devices import emulate
    from exporters.arch import DEFAULT_MODEL
    from exporters.artifacts import check_writable
    from exporters.errors import InputError
    from harness import campaign
    from harness.store import ProfileStore

    if not 0 <= args.precision < 1:
        raise InputError(f"--precision {args.precision:g} must be a fraction in [0, 1) (0.02 is +-2 %)")
    out = check_writable(Path(args.out).resolve())
    db = out / "fleetbench.db"
    artifacts = out / "artifacts"
    report_dir = out / "report"
    from devices.sshd import free_port

    # The demo's own adb server, never a user's running one.
    os.environ.setdefault("ANDROID_ADB_SERVER_PORT", str(free_port()))
    progress = Progress(7)
    model = DEFAULT_MODEL

    progress.step("bringing up the fleet")
    fleet, emulated = prepare_fleet(out, args.local, progress)
    if not emulated:
        progress.steps -= 1  # nothing to stop at the end
    progress.detail("devices: " + ", ".join(f"{d.name} ({d.kind})" for d in fleet.devices))
    status = 0
    started = fleet
    try:
        fleet, backends = choose_backends(fleet, args.backend, progress)
        progress.step(f"exporting {model} at widths {', '.join(f'{w:g}' for w in DEMO_WIDTHS)} and profiling")
        specs = campaign.plan_cells(
            fleet, model, DEMO_WIDTHS, [DEMO_BATCH], backends, args.steps, 20, "sgd", precision=args.precision,
            max_seconds=args.max_seconds,
        )  # fmt: skip
        sets = campaign.export_sets(specs, artifacts)
        progress.detail(f"{len(sets)} artifact sets in {artifacts}")
        with ProfileStore(db) as store:
            result = campaign.run_campaign(
                fleet, specs, store, artifacts_dir=artifacts, timeout=args.timeout,
                progress=lambda event: progress.detail(campaign.format_event(event)), announce=progress.detail,
            )  # fmt: skip
            ok = sum(m.ok for m in result.measurements)
            imprecise = sum(m.imprecise for m in result.measurements)
            progress.detail(
                f"{ok} of {len(result.measurements)} cells measured"
                + (f", {imprecise} imprecise (the machine is busy; see the report)" if imprecise else "")
            )

            progress.step("planning tiers from the profiles")
            from exporters.zoo import get_model
            from fl.data import load_federated

            data = load_federated("mnist5k", get_model(model), len(fleet.devices), "iid", args.seed,
                                  max_examples=args.examples)  # fmt: skip
            examples = {d.name: len(shard[1]) for d, shard in zip(fleet.devices, data.train, strict=True)}
            capacities = plan_capacities(fleet, store, examples, args.epochs, progress, backends)
            if capacities is None:
                status = 1
            else:
                paths = (artifacts, out / "fl-work")
                progress.step(f"hardware-in-the-loop FL: FjORD with the tiers' p_max, {args.rounds} rounds")
                run_fl_rounds("fjord", fleet, store, data, capacities, paths, args, progress, {"k": 4}, backends)
                progress.step(f"hardware-in-the-loop FL: FLuID straggler handling, {args.rounds} rounds")
                run_fl_rounds(
                    "fluid", fleet, store, data, [1.0] * len(capacities), paths, args, progress,
                    {"sizes": list(DEMO_WIDTHS)}, backends,
                )  # fmt: skip

        progress.step("writing the report")
        from reports.report import format_headline, load_sources, write_report

        html, headline = write_report(load_sources(db), report_dir)
        print(format_headline(headline))
    finally:
        if emulated and not args.keep_up:
            progress.step("stopping the emulated fleet")
            for problem in emulate.down(started, say=lambda line: None):
                progress.detail(problem)
    print(f"\nreport:  {html}\nstore:   {db}\nelapsed: {progress.elapsed:.0f} s")
    return status


def choose_backends(fleet: Any, override: str, progress: Progress) -> tuple[Any, dict[str, str]]:
    """Choose each device's runner backend; return the fleet of usable devices and their backends.

    Parameters
    ----------
    fleet : devices.fleet.Fleet
    override : str
        ``--backend`` (``auto``: each device's best available).
    progress : Progress
        Receives one line per device.

    Returns
    -------
    fleet : devices.fleet.Fleet
        Only the devices with a backend.
    backends : dict of str to str
        Device name -> backend.

    Raises
    ------
    InputError
        When no device can run a backend.
    """
    from exporters.errors import InputError
    from harness.backends import format_choices, usable_devices
    from harness.provision import fleet_backends

    choices = fleet_backends(fleet, override, say=progress.detail)
    for line in format_choices(choices):
        progress.detail(f"backend of {line}")
    backends = usable_devices(choices)
    if not backends:
        raise InputError(f"no device can run a backend; see: fleetbench fleet provision {fleet.path}")
    usable = tuple(d for d in fleet.devices if d.name in backends)
    return dataclasses.replace(fleet, devices=usable), backends


def plan_capacities(
    fleet: Any, store: Any, examples: dict[str, int], epochs: int, progress: Progress,
    backends: dict[str, str] | None = None,
) -> list[float] | None:
    """Give every device the width of its tier, planned from the stored profiles.

    The round deadline is the median device's predicted full-width training time (its
    latency model's, `harness.latency`: the same prediction the tiers are planned with, so
    that the median device meets the deadline at full width exactly, whatever the fit's
    residual at its measured width); each device gets the widest width that meets it (and
    fits its memory budget), and devices are clustered into two tiers
    (`fl.scheduling.assign_tiers`). Each device is planned from the profile of its own
    backend (``backends``; a device it leaves out: ``ort``).

    Returns
    -------
    list of float or None
        One capacity per device, in fleet order; None when no device has a full-width profile.
    """
    from exporters.arch import DEFAULT_MODEL
    from fl import scheduling
    from harness.latency import fit

    def backend_of(name: str) -> str:
        return (backends or {}).get(name, "ort")

    cells = store.latest_cells()
    cells = cells[[backend_of(str(d)) == b for d, b in zip(cells.device, cells.backend, strict=True)]]
    models = fit(cells[(cells.model == DEFAULT_MODEL) & (cells.batch == DEMO_BATCH)])
    full_times = []
    for device in fleet.devices:
        rows = cells[(cells.device == device.name) & (cells.status == "ok") & (cells.width == 1.0)]
        if len(rows) and device.name in models:
            latency = models[device.name].latency_model(DEFAULT_MODEL, DEMO_BATCH, backend_of(device.name))
            full_times.append(latency.predict(1.0).value * examples[device.name] * epochs)
    if not full_times:
        progress.detail("no device has a full-width profile; FL skipped")
        return None
    deadline = sorted(full_times)[len(full_times) // 2] * (1 + 1e-9)  # the median device meets it, rounding aside
    plan = scheduling.assign_tiers(
        cells, DEFAULT_MODEL, DEMO_WIDTHS, deadline_s=deadline, examples_per_round=examples, epochs=epochs,
        batch=DEMO_BATCH, memory_budget_bytes=scheduling.memory_budgets_from_fleet(fleet), k=2, backend=backends,
    )  # fmt: skip
    progress.detail(f"round deadline {deadline:.2f} s of training (the median device at full width)")
    capacities = []
    for device in fleet.devices:
        choice = plan.choice(device.name)
        width = choice.tier_width if choice.tier_width is not None else min(DEMO_WIDTHS)
        capacities.append(width)
        tier = "none" if choice.tier is None else str(choice.tier)
        progress.detail(f"{device.name}: tier {tier}, width {width:g} ({choice.reason or 'meets the deadline'})")
    return capacities


def run_fl_rounds(
    strategy: str,
    fleet: Any,
    store: Any,
    data: Any,
    capacities: list[float],
    paths: tuple[Path, Path],
    args: argparse.Namespace,
    progress: Progress,
    options: dict[str, Any],
    backends: dict[str, str] | None = None,
) -> Any:
    """Run ``strategy`` for ``args.rounds`` rounds on the devices, one client per device.

    ``backends`` (device name -> runner backend) is passed to the executor and logged
    with every client round.

    Returns
    -------
    fl.server.RunSummary
    """
    from devices.connect import connect
    from exporters.arch import DEFAULT_MODEL
    from exporters.zoo import get_model
    from fl.executors.devices import DevicesExecutor
    from fl.server import RunConfig, run_fl

    artifacts, work = paths
    model = get_model(DEFAULT_MODEL)
    placement = {f"c{i}": d for i, d in enumerate(fleet.devices)}
    config = RunConfig(
        strategy=strategy, model=model.name, dataset="mnist5k", clients=len(placement), rounds=args.rounds,
        capacities="explicit:" + ",".join(f"{c:g}" for c in capacities), partition="iid", seed=args.seed,
        epochs=args.epochs, batch_size=DEMO_BATCH, lr=0.05, executor="devices", db=str(store.path),
        options=options,
    )  # fmt: skip
    with DevicesExecutor(
        model, placement, artifacts_dir=artifacts, work_dir=work, batch=DEMO_BATCH, connect=connect,
        timeout_s=args.timeout, backends=backends,
    ) as executor:  # fmt: skip
        summary = run_fl(
            config, store=store, executor=executor, data=data, capacities=capacities,
            placement={cid: d.name for cid, d in placement.items()}, progress=progress.detail,
            backends={cid: (backends or {}).get(d.name, "ort") for cid, d in placement.items()},
        )  # fmt: skip
    accuracy = ", ".join(f"width {w:g}: {a:.1%}" for w, a in sorted(summary.accuracy.items()))
    progress.detail(f"run {summary.run_id} ({strategy}): final accuracy {accuracy}")
    return summary


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``demo`` to the ``fleetbench`` parser."""
    from exporters.cli import non_negative_int, positive_float, positive_int
    from harness.runner import DEFAULT_PRECISION, MIN_SAMPLES

    demo = commands.add_parser("demo", help="profile an emulated fleet, report, and run hardware-in-the-loop FL")
    demo.add_argument("--out", default="fleetbench-demo", help="output directory (default ./fleetbench-demo)")
    demo.add_argument("--rounds", type=positive_int, default=4, help="FL rounds (default 4)")
    demo.add_argument("--epochs", type=positive_int, default=1, help="local epochs per round (default 1)")
    demo.add_argument("--examples", type=positive_int, default=2000, help="MNIST examples used in all (default 2000)")
    demo.add_argument(
        "--steps", type=positive_int, default=MIN_SAMPLES, help=f"fewest timed samples per cell (default {MIN_SAMPLES})"
    )
    demo.add_argument(
        "--precision", type=float, default=DEFAULT_PRECISION,
        help=f"target half-width of each cell's median interval (default {DEFAULT_PRECISION:g})",
    )  # fmt: skip
    demo.add_argument(
        "--max-seconds", type=positive_float, default=DEMO_MAX_SECONDS,
        help=f"per-cell cap on warm-up and sampling (default {DEMO_MAX_SECONDS:g})",
    )  # fmt: skip
    demo.add_argument(
        "--timeout", type=positive_float, default=120.0, help="seconds per device command (default 120)"
    )
    demo.add_argument("--seed", type=non_negative_int, default=0)
    demo.add_argument(
        "--backend",
        choices=("auto", "ort", "onnx", "torch"),
        default="auto",
        help="runner backend on every device (default auto: each device's best available, ort > onnx > torch; "
        "a phone on its runtime bundle: onnx)",
    )
    demo.add_argument("--local", action="store_true", help="use local devices instead of the emulated fleet")
    demo.add_argument("--keep-up", action="store_true", help="leave the emulated fleet running")
    demo.set_defaults(handler="fleetbench.demo:run_demo")
