"""``fleetbench demo``: the three journeys on an emulated fleet, in one command.

Each step prints the command that does it on a user's own fleet (``yourself: ...``).

1. **Fleet**: the example emulated fleet (fast / mid / slow SSH devices, a fresh board
   with only the distribution's Python, and the phone, `devices/fleets/emulated.yaml`)
   is written into the demo directory on free loopback ports, brought up and
   provisioned (`provision_fleet`: the fresh board gets numpy and onnxruntime). Without
   OpenSSH's ``sshd`` (or when ``--local`` is given) the demo says so and uses the local
   fleet instead: local devices ``fast``, ``mid`` and ``slow`` with the same CPU shares,
   memory limits and pins (`devices.emulation.emulate.write_local_fleet`).
   Each device is then asked what it can run and uses its best available runner
   backend (ort > onnx > torch, `harness.backends`; ``--backend`` names one for all;
   the phone, which has no Python, first gets its runtime bundle and so runs onnx,
   `harness.phone_runtime`);
   a device with none is reported with its reason and left out of the rest.
2. **Export and profile**: the default model (``fjord-cnn``) at widths 0.25-1.0 with the
   SGD optimizer graph, which both the profile and the FL rounds train with; every device x
   width into the demo's store, the devices that share this machine's cpus one at a time
   (the example fleet pins its slowest device to a cpu of its own, so two lanes run side
   by side; the plan is printed), each cell sampled until its median is within +-2 % or
   `DEMO_MAX_SECONDS` (then flagged imprecise). After its cells, each device's round cost
   is measured (`harness.roundcost`: the fixed cost of a runner request, the transfer
   time per byte each way).
3. **Plan, then train, per strategy** (`fl.plan`, the planner of ``fleetbench plan`` and
   ``fl run --plan``): FjORD, each device at the widest width whose predicted round meets
   the deadline (the median device's predicted round at full capacity), in two tiers, then
   hardware-in-the-loop rounds on MNIST with the ``devices`` executor, one client per
   device, and each device's predicted against measured rounds; then FLuID, planned with
   its straggler, starting target and the straggler's sub-model width, printed per round
   (straggler, width, time against the target). Each plan is stored with its run and
   revised when the measured rounds drift from it.
4. **Report**: ``report.html`` with the profile and both FL runs.

Everything lands in ``--out`` (default ``./fleetbench-demo``): ``fleetbench.db``,
``report/``, ``artifacts/`` and the fleet's state. The emulated fleet is stopped at
the end unless ``--keep-up``. This module is top-level glue: it calls the
packages the way the individual commands do and holds no logic of its own. Its
arguments are checked before anything is created or started.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Widths the demo exports, profiles and offers to tiers.
DEMO_WIDTHS = (0.25, 0.5, 0.75, 1.0)
#: FLuID's sub-model widths: a 1/32 grid, most of them never measured (the latency model
#: predicts their rounds), fine enough that some width lands the straggler near its target.
DEMO_FLUID_WIDTHS = tuple(i / 32 for i in range(8, 33))

#: Training batch of every artifact set the demo uses.
DEMO_BATCH = 20

#: Optimizer graph of the profile and of the FL rounds (one configuration from profile to round).
DEMO_OPTIMIZER = "sgd"
#: The data set the FL rounds train on, and the profiles' cells too (`fl.data.write_bench_data`).
DEMO_DATASET = "mnist5k"

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


def prepare_fleet(out: Path, local: bool, progress: Progress) -> tuple[Any, bool]:
    """Write and start the demo fleet: the example emulated fleet, or without ``sshd`` the local one.

    The local fleet (`devices.emulation.emulate.write_local_fleet`) keeps the example fleet's CPU
    shares, memory limits and pins on local devices, so ``fast``, ``mid`` and ``slow``
    differ as their names say there too.

    Returns
    -------
    fleet : devices.fleet.Fleet
        The devices that started.
    started : bool
        Whether devices were started (and must be stopped).
    """
    from devices.emulation import emulate
    from devices.emulation.sshd import SshdError, free_port, sshd_binary
    from devices.fleetfile import load_fleet
    from exporters.userinput import InputError

    if not local:
        try:
            sshd_binary()
        except SshdError as exc:
            progress.detail(f"OpenSSH sshd is not available ({exc}); running on local devices only")
            local = True
    directory = out / "fleet"
    path = emulate.write_local_fleet(directory) if local else emulate.write_example_fleet(directory, free_port)
    fleet = load_fleet(path)
    try:
        result = emulate.up(fleet, say=progress.detail)
    except BaseException:  # Ctrl-C or SIGTERM during the start: stop what did start
        emulate.down(fleet, say=lambda line: None)
        raise
    if result.failed:
        for name, reason in result.failed.items():
            progress.detail(f"{name} did not start: {reason}")
    up = [d for d in fleet.devices if d.name not in result.failed]
    if not up:
        hint = "" if local else "; try `fleetbench demo --local`"
        raise InputError(f"no device of {path} started{hint}")
    return dataclasses.replace(fleet, devices=tuple(up)), True


def user_command(
    command: str, fleet: Any, db: Path, strategy: str, args: argparse.Namespace, options: dict[str, Any] | None = None
) -> str:
    """Return the command a user types to do one of the demo's steps on their own fleet."""
    common = f"--fleet {fleet.path} --db {db}"
    widths = ",".join(f"{w:g}" for w in DEMO_WIDTHS)
    if command == "profile":
        return (
            f"fleetbench profile {common} --model fjord-cnn --widths {widths} --batch {DEMO_BATCH} "
            f"--optimizer {DEMO_OPTIMIZER} --data bench-data.npz  (bench-data.npz: fleetbench fl data --out ...)"
        )
    clients = len(fleet.devices)
    opts = "".join(f" --opt {key}={json.dumps(value, separators=(',', ':'))}" for key, value in (options or {}).items())
    if command == "plan":
        return f"fleetbench plan {common} --strategy {strategy} --clients {clients} --epochs {args.epochs}{opts}"
    return (
        f"fleetbench fl run {common} --strategy {strategy} --clients {clients} --rounds {args.rounds} "
        f"--epochs {args.epochs}{opts} --plan"
    )


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; return the exit status (0 when every step produced its output)."""
    from devices.emulation import emulate
    from exporters.arch import DEFAULT_MODEL
    from exporters.artifacts import check_writable
    from exporters.userinput import InputError
    from harness.bench_data import bench_data_label
    from harness.campaign import run_campaign
    from harness.cells import export_sets, plan_cells
    from harness.progress import format_event
    from harness.store import ProfileStore

    if not 0 <= args.precision < 1:
        raise InputError(f"--precision {args.precision:g} must be a fraction in [0, 1) (0.02 is +-2 %)")
    out = check_writable(Path(args.out).resolve())
    db = out / "fleetbench.db"
    artifacts = out / "artifacts"
    report_dir = out / "report"
    from devices.emulation.sshd import free_port

    # The demo's own adb server, never a user's running one.
    os.environ.setdefault("ANDROID_ADB_SERVER_PORT", str(free_port()))
    progress = Progress(7 if args.keep_up else 8)
    model = DEFAULT_MODEL

    progress.step("bringing up the fleet")
    fleet, emulated = prepare_fleet(out, args.local, progress)
    status = 0
    started = fleet
    try:  # from here on, whatever stops the demo (an error, SIGTERM) stops the fleet it started
        progress.detail("devices: " + ", ".join(f"{d.name} ({d.kind})" for d in fleet.devices))
        yourself = f"fleetbench fleet up {fleet.path} && fleetbench fleet provision {fleet.path} --install"
        progress.detail(f"yourself: {yourself}")
        fleet, backends = choose_backends(fleet, args.backend, progress)
        progress.step(f"exporting {model} at widths {', '.join(f'{w:g}' for w in DEMO_WIDTHS)} and profiling")
        progress.detail("yourself: " + user_command("profile", fleet, db, "", args))
        from exporters.zoo import get_model
        from fl.data import write_bench_data

        # the cells train on the FL rounds' data (step time depends on it)
        bench_data = write_bench_data(DEMO_DATASET, get_model(model), out / "bench-data.npz", seed=args.seed)
        specs = plan_cells(
            fleet, model, DEMO_WIDTHS, [DEMO_BATCH], backends, args.steps, 20, DEMO_OPTIMIZER, precision=args.precision,
            max_seconds=args.max_seconds, data=bench_data_label(bench_data),
        )  # fmt: skip
        sets = export_sets(specs, artifacts)
        progress.detail(f"{len(sets)} artifact sets in {artifacts}")
        with ProfileStore(db) as store:
            result = run_campaign(
                fleet, specs, store, artifacts_dir=artifacts, timeout=args.timeout,
                progress=lambda event: progress.detail(format_event(event)), announce=progress.detail,
                round_cost=True, data=bench_data, passes=args.passes,
            )  # fmt: skip
            ok = sum(m.ok for m in result.measurements)
            imprecise = sum(m.imprecise for m in result.measurements)
            progress.detail(
                f"{ok} of {len(result.measurements)} cells measured"
                + (f", {imprecise} imprecise (the machine is busy; see the report)" if imprecise else "")
            )

            from fl.data import load_federated

            data = load_federated(DEMO_DATASET, get_model(model), len(fleet.devices), "iid", args.seed,
                                  max_examples=args.examples)  # fmt: skip
            paths = (artifacts, out / "fl-work")
            runs = (
                ("fjord", f"FjORD with each tier's capacity, {args.rounds} rounds", {"k": len(DEMO_WIDTHS)}),
                ("fluid", f"FLuID straggler handling, {args.rounds} rounds", {"widths": list(DEMO_FLUID_WIDTHS)}),
            )
            for strategy, title, options in runs:
                progress.step(f"planning {strategy} from the profiles")
                progress.detail("yourself: " + user_command("plan", fleet, db, strategy, args, options))
                plan = plan_run(strategy, fleet, store, data, args, progress, backends, options)
                if plan is None:
                    status = 1
                    progress.step(f"hardware-in-the-loop FL: {title} (skipped)")
                    continue
                progress.step(f"hardware-in-the-loop FL: {title}")
                progress.detail("yourself: " + user_command("fl run", fleet, db, strategy, args, options))
                summary = run_fl_rounds(strategy, fleet, store, data, plan, paths, args, progress, options, backends)
                if strategy == "fjord":
                    show_predictions(store, summary.run_id, progress)
                else:
                    show_stragglers(store, summary.run_id, progress)

        progress.step("writing the report")
        progress.detail(f"yourself: fleetbench report --db {db} --out {report_dir}")
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


def provision_fleet(fleet: Any, progress: Progress) -> Any:
    """Install what each device's best backend misses, as ``fleetbench fleet provision FILE --install`` does.

    The example fleet's ``fresh`` board has the distribution's Python and nothing else:
    the host fetches its wheels (from its wheel cache, else the package index) and
    installs them into the board's site. One line per device that got something, or
    could not be provisioned (`choose_backends` then drops a device that can run nothing).
    torch is not asked for: a device with ``ort`` or ``onnx`` never uses it.

    Parameters
    ----------
    fleet : devices.fleet.Fleet
    progress : Progress
        Receives the lines.

    Returns
    -------
    devices.group.FleetResult of harness.backends.ProvisionReport
        Each device's state after provisioning.
    """
    from harness.provision import DEFAULT_PACKAGES, provision
    from harness.provision_cli import install_notes

    packages = [p for p in DEFAULT_PACKAGES if p.name != "torch"]
    result = provision(fleet, packages=packages, install=True, verify_runtime=False, say=progress.detail)
    for name, report in result.successes.items():
        runtime = report.runtime
        if runtime is not None and (runtime.pushed_parts or runtime.unpack_seconds):
            progress.detail(runtime.describe(name))  # a phone's runtime bundle, pushed
        for line in install_notes(name, report):
            progress.detail(line)
    for name, failure in result.failures.items():
        progress.detail(f"{name}: not provisioned: {failure.kind}: {failure.message}")
    return result


def choose_backends(fleet: Any, override: str, progress: Progress) -> tuple[Any, dict[str, str]]:
    """Choose each device's runner backend; return the fleet of usable devices and their backends.

    Parameters
    ----------
    fleet : devices.fleet.Fleet
    override : str
        ``--backend`` (``auto``: each device's best available, after `provision_fleet`).
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
    from exporters.userinput import InputError
    from harness.backends import format_choices, usable_devices
    from harness.provision import choices_from, fleet_backends

    if override in (None, "auto"):  # provisioning asked every device what it runs
        choices = choices_from(provision_fleet(fleet, progress), fleet.devices)
    else:
        choices = fleet_backends(fleet, override, say=progress.detail)
    for line in format_choices(choices):
        progress.detail(f"backend of {line}")
    backends = usable_devices(choices)
    if not backends:
        raise InputError(f"no device can run a backend; see: fleetbench fleet provision {fleet.path}")
    usable = tuple(d for d in fleet.devices if d.name in backends)
    return dataclasses.replace(fleet, devices=usable), backends


def plan_run(
    strategy: str,
    fleet: Any,
    store: Any,
    data: Any,
    args: argparse.Namespace,
    progress: Progress,
    backends: dict[str, str],
    options: dict[str, Any],
) -> Any:
    """Plan one FL run on the profiles, as ``fleetbench plan`` and ``fl run --plan`` do (`fl.plan`).

    One client per device; each device's profile is the one matching the configuration FL
    trains with (SGD, the device's threads and backend, the demo's batch). The deadline is
    ``auto`` (the median device's predicted round at full capacity); FjORD's devices are clustered
    into two tiers. The plan's table is printed.

    Returns
    -------
    fl.plan.RunPlan or None
        None when no device has a profile (FL is skipped).
    """
    from exporters.arch import DEFAULT_MODEL
    from exporters.userinput import InputError
    from fl.plan import PlanRequest, device_examples, format_plan, run_plan
    from fl.scheduling import memory_budgets_from_fleet
    from fl.scheduling.configs import ProfileConfig

    placement = {f"c{i}": d.name for i, d in enumerate(fleet.devices)}
    sizes = {f"c{i}": len(shard[1]) for i, shard in enumerate(data.train)}
    request = PlanRequest(
        model=DEFAULT_MODEL, strategy=strategy, batch=DEMO_BATCH, epochs=args.epochs, optimizer=DEMO_OPTIMIZER,
        examples=device_examples(placement, sizes), deadline="auto", unprofiled="smallest",
        memory=memory_budgets_from_fleet(fleet), options=options,
        configs={
            d.name: ProfileConfig(DEMO_BATCH, backends.get(d.name, "ort"), DEMO_OPTIMIZER, d.threads)
            for d in fleet.devices
        },
    )  # fmt: skip
    try:
        plan = run_plan(store, request, warn=progress.detail)
    except InputError as exc:
        progress.detail(f"cannot plan ({exc}); FL skipped")
        return None
    if not any(d.round_s is not None for d in plan.current.devices):
        progress.detail("no device has a profile; FL skipped")
        return None
    for line in format_plan(plan.current):
        progress.detail(line)
    return plan


def show_predictions(store: Any, run_id: int, progress: Progress) -> None:
    """Print each device's predicted and measured client rounds and the error (``*``: the host disturbed it)."""
    from fl.roundcost import DISTURBANCE_RULES
    from fl.runlog import RunLog
    from reports import tables

    client_rounds = RunLog(store).client_rounds(run_id)
    table = tables.fl_prediction_table(client_rounds)
    if table.empty:
        progress.detail("no client round was predicted (no round-cost model)")
        return
    rounds = tables.fl_predicted_rounds(client_rounds)
    for row in table.itertuples(index=False):
        mine = rounds[rounds.device == row.device]
        marks = ["*" if d else "" for d in mine.disturbed]
        pairs = " ".join(f"{p:.2f}/{m:.2f}{k}" for p, m, k in zip(mine.predicted_s, mine.total_s, marks, strict=True))
        progress.detail(
            f"{row.device}: predicted/measured round s {pairs}; error median {row.median_error:.0%}, "
            f"worst {row.worst_error:.0%}"
        )
    median, worst, n = tables.prediction_errors(client_rounds)
    progress.detail(f"all {n} client rounds: |predicted - measured| / measured median {median:.0%}, worst {worst:.0%}")
    disturbed = int(rounds["disturbed"].sum())
    if disturbed:
        median, worst, n = tables.prediction_errors(client_rounds, skip_disturbed=True)
        progress.detail(
            f"* {disturbed} round(s) the host disturbed ({DISTURBANCE_RULES}); "
            f"the other {n}: median {median:.0%}, worst {worst:.0%}"
        )


def show_stragglers(store: Any, run_id: int, progress: Progress) -> None:
    """Print FLuID's straggler per round: its target, sub-model width and time against the target."""
    from fl.runlog import RunLog
    from reports import tables

    log = RunLog(store)
    table = tables.fl_straggler_table(log.rounds(run_id), log.client_rounds(run_id))
    if table.empty:
        progress.detail("no straggler was calibrated (FLuID needs a round of measured times first)")
        return
    for row in table.itertuples(index=False):
        disturbed = (
            " (the host disturbed this round: more CPU per step than at that width in other rounds or than its"
            " profile's, less of the cpu than in the device's other rounds, or stalled transfers)"
        )
        progress.detail(
            f"round {int(row.round) + 1}: straggler {row.device} ({row.cid}), width {row.width:g}, round "
            f"{row.seconds:.2f} s against target {row.target_s:.2f} s = {row.over_target:.2f} x target"
            + (disturbed if row.disturbed else "")
        )


def run_fl_rounds(
    strategy: str,
    fleet: Any,
    store: Any,
    data: Any,
    plan: Any,
    paths: tuple[Path, Path],
    args: argparse.Namespace,
    progress: Progress,
    options: dict[str, Any],
    backends: dict[str, str] | None = None,
) -> Any:
    """Run ``strategy`` for ``args.rounds`` rounds on the devices, one client per device, with its plan.

    The plan (`fl.plan.RunPlan`) gives the clients' capacities and the strategy's planned
    options, is stored with the run and revised when rounds drift from it, as ``fl run --plan``
    does. ``backends`` (device name -> runner backend) is passed to the executor and logged
    with every client round.

    Returns
    -------
    fl.server.RunSummary
    """
    from devices.connect import connect
    from exporters.arch import DEFAULT_MODEL
    from exporters.zoo import get_model
    from fl.executors.devices import DevicesExecutor
    from fl.plan import strategy_options
    from fl.roundcost import executor_configs
    from fl.server import RunConfig, run_fl
    from harness.isolation import round_isolation

    artifacts, work = paths
    model = get_model(DEFAULT_MODEL)
    placement = {f"c{i}": d for i, d in enumerate(fleet.devices)}
    names = {cid: d.name for cid, d in placement.items()}
    capacities = [plan.capacity(names[cid]) for cid in placement]
    options = {**options, **strategy_options(plan.current, names)}
    config = RunConfig(
        strategy=strategy, model=model.name, dataset=DEMO_DATASET, clients=len(placement), rounds=args.rounds,
        capacities="explicit:" + ",".join(repr(float(c)) for c in capacities), partition="iid", seed=args.seed,
        epochs=args.epochs, batch_size=DEMO_BATCH, lr=0.05, executor="devices", db=str(store.path),
        options=options, optimizer=DEMO_OPTIMIZER,
    )  # fmt: skip
    with DevicesExecutor(
        model, placement, artifacts_dir=artifacts, work_dir=work, batch=DEMO_BATCH, connect=connect,
        timeout_s=args.timeout, backends=backends, optimizer=DEMO_OPTIMIZER, isolation=round_isolation(fleet),
    ) as executor:  # fmt: skip
        summary = run_fl(
            config, store=store, executor=executor, data=data, capacities=capacities, placement=names,
            progress=progress.detail, backends={cid: (backends or {}).get(n, "ort") for cid, n in names.items()},
            device_configs=executor_configs(executor, fleet.devices, DEMO_BATCH), plan=plan, round_cost=plan.cost,
        )  # fmt: skip
    accuracy = ", ".join(f"width {w:g}: {a:.1%}" for w, a in sorted(summary.accuracy.items()))
    progress.detail(f"run {summary.run_id} ({strategy}): final accuracy {accuracy}")
    return summary


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``demo`` to the ``fleetbench`` parser."""
    from exporters.userinput import non_negative_int, positive_float, positive_int
    from harness.cli import add_passes_argument
    from harness.runner.protocol import DEFAULT_PRECISION
    from harness.runner.sampling import MIN_SAMPLES

    demo = commands.add_parser("demo", help="profile an emulated fleet, report, and run hardware-in-the-loop FL")
    demo.add_argument("--out", default="fleetbench-demo", help="output directory (default ./fleetbench-demo)")
    demo.add_argument("--rounds", type=positive_int, default=4, help="FL rounds (default 4)")
    demo.add_argument("--epochs", type=positive_int, default=1, help="local epochs per round (default 1)")
    demo.add_argument("--examples", type=positive_int, default=4000, help="MNIST examples used in all (default 4000)")
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
    add_passes_argument(demo)
    demo.add_argument("--timeout", type=positive_float, default=120.0, help="seconds per device command (default 120)")
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
