"""``fleetbench demo``: the three journeys on an emulated fleet, in one command.

1. **Fleet**: the example emulated fleet (fast / mid / slow SSH devices and the phone,
   `devices/fleets/emulated.yaml`) is written into the demo directory on free loopback
   ports and brought up. Without OpenSSH's ``sshd`` (or when ``--local`` is given) the
   demo says so and uses three local devices instead, which run at the host's speed.
2. **Export**: the default model (``fjord-cnn``) at widths 0.25-1.0 with the SGD
   optimizer graph, which both the profile and the FL rounds train with.
3. **Profile**: every device x width, a few timed steps each, into the demo's store.
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
    from harness import campaign
    from harness.store import ProfileStore

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
    try:
        progress.step(f"exporting {model} at widths {', '.join(f'{w:g}' for w in DEMO_WIDTHS)} and profiling")
        backends = provision_runtimes(fleet, progress)
        specs = [
            spec
            for device in fleet.devices
            for spec in campaign.plan_cells([device], model, DEMO_WIDTHS, [DEMO_BATCH], [backends[device.name]],
                                            args.steps, 2, "sgd")
        ]  # fmt: skip
        sets = campaign.export_sets(specs, artifacts)
        progress.detail(f"{len(sets)} artifact sets in {artifacts}")
        with ProfileStore(db) as store:
            result = campaign.run_campaign(
                fleet, specs, store, artifacts_dir=artifacts, timeout=args.timeout,
                progress=lambda event: progress.detail(campaign.format_event(event)),
            )  # fmt: skip
            ok = sum(m.ok for m in result.measurements)
            progress.detail(f"{ok} of {len(result.measurements)} cells measured")

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
            for problem in emulate.down(fleet, say=lambda line: None):
                progress.detail(problem)
    print(f"\nreport:  {html}\nstore:   {db}\nelapsed: {progress.elapsed:.0f} s")
    return status


def provision_runtimes(fleet: Any, progress: Progress) -> dict[str, str]:
    """Give every phone without Python its runtime bundle; return each device's runner backend.

    A phone running the bundle trains with ``onnx`` (the portable step model on the plain
    onnxruntime), every other device with ``ort``.
    """
    from devices.connect import connect
    from harness.phone_runtime import format_reports, provision_phones

    phones = provision_phones(fleet, connect, say=progress.detail)
    for line in format_reports(phones, fleet.devices):
        progress.detail(line)
    on_bundle = {name for name, report in phones.successes.items() if report.start.runtime == "bundle"}
    return {d.name: "onnx" if d.name in on_bundle else "ort" for d in fleet.devices}


def plan_capacities(
    fleet: Any, store: Any, examples: dict[str, int], epochs: int, progress: Progress,
    backends: dict[str, str] | None = None,
) -> list[float] | None:
    """Give every device the width of its tier, planned from the stored profiles.

    The round deadline is the median device's predicted full-width training time; each
    device gets the widest width that meets it (and fits its memory budget), and devices
    are clustered into two tiers (`fl.scheduling.assign_tiers`).

    Returns
    -------
    list of float or None
        One capacity per device, in fleet order; None when no device has a full-width profile.
    """
    from exporters.arch import DEFAULT_MODEL
    from fl import scheduling

    cells = store.latest_cells()
    full_times = []
    for device in fleet.devices:
        rows = cells[(cells.device == device.name) & (cells.status == "ok") & (cells.width == 1.0)]
        if len(rows):
            full_times.append(float(rows.median_us.iloc[0]) * 1e-6 * examples[device.name] * epochs)
    if not full_times:
        progress.detail("no device has a full-width profile; FL skipped")
        return None
    deadline = sorted(full_times)[len(full_times) // 2]
    plan = scheduling.assign_tiers(
        cells, DEFAULT_MODEL, DEMO_WIDTHS, deadline_s=deadline, examples_per_round=examples, epochs=epochs,
        batch=DEMO_BATCH, memory_budget_bytes=scheduling.memory_budgets_from_fleet(fleet), k=2,
        backend=backends or "ort",
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
        )  # fmt: skip
    accuracy = ", ".join(f"width {w:g}: {a:.1%}" for w, a in sorted(summary.accuracy.items()))
    progress.detail(f"run {summary.run_id} ({strategy}): final accuracy {accuracy}")
    return summary


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``demo`` to the ``fleetbench`` parser."""
    from exporters.cli import non_negative_int, positive_float, positive_int

    demo = commands.add_parser("demo", help="profile an emulated fleet, report, and run hardware-in-the-loop FL")
    demo.add_argument("--out", default="fleetbench-demo", help="output directory (default ./fleetbench-demo)")
    demo.add_argument("--rounds", type=positive_int, default=4, help="FL rounds (default 4)")
    demo.add_argument("--epochs", type=positive_int, default=1, help="local epochs per round (default 1)")
    demo.add_argument("--examples", type=positive_int, default=2000, help="MNIST examples used in all (default 2000)")
    demo.add_argument("--steps", type=positive_int, default=5, help="timed steps per profiled cell (default 5)")
    demo.add_argument(
        "--timeout", type=positive_float, default=120.0, help="seconds per device command (default 120)"
    )
    demo.add_argument("--seed", type=non_negative_int, default=0)
    demo.add_argument("--local", action="store_true", help="use local devices instead of the emulated fleet")
    demo.add_argument("--keep-up", action="store_true", help="leave the emulated fleet running")
    demo.set_defaults(handler="fleetbench.demo:run_demo")
