from __future__ import annotations

import json

import pytest
import torch

from fl.cli import parse_options
from fl.runlog import RunLog
from fleetbench.cli import main
from harness.store import ProfileStore
from tests.fl.scheduling.profiles import store_lines


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["fl", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


SMALL = ("--dataset", "digits", "--clients", "3", "--batch", "32", "--lr", "0.1")


def test_json_summary_contract_and_resume(tmp_path, capsys):
    db = str(tmp_path / "fl.db")
    rc, out, err = run(capsys, "run", "--strategy", "fedavg", *SMALL, "--rounds", "1", "--db", db, "--json")
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["run_id"] == 1 and summary["rounds"] == 1
    assert list(summary["accuracy"]) == ["1.0"] and 0.0 <= summary["accuracy"]["1.0"] <= 1.0
    assert err.count("round 1/1: clients ok 3 failed 0") == 1
    rc, out, err = run(capsys, "run", "--resume", "1", "--rounds", "2", "--db", db, "--json")
    assert rc == 0, err
    resumed = json.loads(out)
    assert resumed["run_id"] == 1 and resumed["rounds"] == 2 and len(resumed["history"]) == 2
    assert "round 2/2" in err and "round 1/2" not in err  # only the missing round ran
    rc, out, err = run(capsys, "runs", "--db", db, "--json")
    assert rc == 0
    assert json.loads(out) == [
        {
            "id": 1,
            "strategy": "fedavg",
            "model": "fjord-cnn",
            "dataset": "digits",
            "seed": 0,
            "rounds": 2,
            "rounds_done": 2,
            "status": "finished",
        }
    ]


def test_sub_model_strategy_reports_every_width(tmp_path, capsys):
    db = str(tmp_path / "fl.db")
    argv = ("run", "--strategy", "heterofl", *SMALL, "--rounds", "1", "--capacities", "uniform:1,0.5", "--db", db)
    rc, out, err = run(capsys, *argv, "--per-round", "2", "--opt", "weighted=true", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert sorted(summary["accuracy"]) == ["0.5", "1.0"]
    assert summary["history"][0]["clients_ok"] == 2
    rc, out, err = run(capsys, "runs", "--db", db)
    assert rc == 0 and "heterofl" in out and "1/1" in out


def test_text_output_names_the_run_and_how_to_resume(tmp_path, capsys):
    db = str(tmp_path / "fl.db")
    rc, out, err = run(capsys, "run", *SMALL, "--rounds", "1", "--db", db)
    assert rc == 0, err
    assert out.startswith("FL run 1 (fedavg, fjord-cnn on digits, 3 clients, seed 0): 1 rounds")
    assert f"fleetbench fl run --resume 1 --rounds N --db {db}" in out


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (("--strategy", "nope"), "nope"),
        (("--fraction", "2"), "2"),
        (("--fraction", "0.5", "--per-round", "2"), "not allowed with"),
        (("--clients", "0"), "0"),
        (("--rounds", "x"), "'x'"),
        (("--per-round", "9"), "9"),
        (("--opt", "novalue"), "novalue"),
        (("--strategy", "fd", "--opt", "colour=red"), "colour"),
        (("--capacities", "bogus:1"), "bogus"),
        (("--partition", "bogus"), "bogus"),
        (("--dataset", "imagenet"), "imagenet"),
        (("--model", "gpt5"), "gpt5"),
        (("--resume", "5"), "no FL run 5"),
        (("--resume", "1", "--lr", "0.3"), "lr=0.1"),
        (("--optimizer", "adamw"), "needs --fleet"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, word):
    db = str(tmp_path / "fl.db")
    if "--resume" in argv:
        assert run(capsys, "run", *SMALL, "--rounds", "1", "--db", db)[0] == 0
    rc, out, err = run(capsys, "run", *SMALL[:4], *argv, "--db", db)
    assert rc == 2
    assert err.startswith("fleetbench: error:") and len(err.strip().splitlines()) == 1
    assert word in err
    assert "Traceback" not in err


@pytest.fixture
def profiles(tmp_path):
    path = tmp_path / "profiles.db"
    store_lines(path, {"fast": (50.0, 2e-4), "slow": (400.0, 1.5e-3)})
    return str(path)


def test_a_population_run_reports_virtual_seconds_per_round(tmp_path, capsys, profiles):
    db = str(tmp_path / "fl.db")
    pop = ("--population", "fast=0.5,slow=0.5", "--profiles", profiles, "--overcommit", "0.5", "--per-round", "2")
    rc, out, err = run(capsys, "run", *SMALL, "--clients", "4", "--rounds", "2", *pop, "--db", db, "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert [h["clients_ok"] for h in summary["history"]] == [2, 2]
    assert all(h["virtual_seconds"] > 0 for h in summary["history"])
    assert err.count("(virtual ") == 2
    # the stored configuration carries the population: a resume continues on the same clock
    rc, out, err = run(capsys, "run", "--resume", "1", "--rounds", "3", "--db", db, "--json")
    assert rc == 0, err
    assert json.loads(out)["history"][2]["virtual_seconds"] > 0


def test_clock_only_prints_the_schedule(tmp_path, capsys, profiles):
    db = str(tmp_path / "fl.db")
    argv = ("--clients", "500", "--per-round", "20", "--rounds", "5", "--population", "fast=0.3,slow=0.7")
    rc, out, err = run(capsys, "run", *argv, "--profiles", profiles, "--clock-only", "--client-examples", "40",
                       "--deadline", "0.5", "--db", db, "--json")  # fmt: skip
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["accuracy"] == {} and len(summary["history"]) == 5
    assert all(0 < h["virtual_seconds"] <= 0.5 for h in summary["history"])
    rc, out, err = run(capsys, "run", *argv, "--profiles", profiles, "--clock-only", "--client-examples", "40",
                       "--db", db)  # fmt: skip
    assert rc == 0 and "virtual" in out and "resume" not in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--population", "fast=0.5,gpu=0.5"), "unknown device 'gpu'; devices measured in"),
        (("--population", "fast=0.5,slow=0.4"), "shares sum to 0.9, not 1"),
        (("--population", "fast=1", "--model", "cfd-cnn"), "device 'fast' has no profile of model 'cfd-cnn'"),
        (("--population", "fast=1", "--link", "gpu=10"), "device 'gpu' is not in the population"),
        (("--population", "fast=1", "--availability", "0"), "--availability"),
        (("--population", "fast=1", "--fleet", "f.yaml"), "takes neither"),
    ],
)
def test_bad_population_input_is_one_line_and_exit_2_before_anything_is_written(
    tmp_path, capsys, profiles, argv, words
):
    db = tmp_path / "fl.db"
    if "--fleet" in argv:
        (tmp_path / "f.yaml").write_text("devices:\n  - name: a\n    kind: local\n")
        argv = tuple(str(tmp_path / "f.yaml") if a == "f.yaml" else a for a in argv)
    rc, out, err = run(capsys, "run", *SMALL, *argv, "--profiles", profiles, "--db", str(db))
    assert rc == 2 and err.startswith("fleetbench: error:") and len(err.strip().splitlines()) == 1
    assert words in err, err
    assert not db.exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--clock-only",), "--clock-only needs --population SPEC"),
        (("--deadline", "3"), "--deadline needs --population SPEC"),
        (("--population", "fast=1"), "--population needs --profiles DB"),
        (("--population", "fast=1", "--profiles", "missing.db"), "missing.db"),
        (("--ray-address", "127.0.0.1:1"), "--ray-address needs --executor ray"),
    ],
)
def test_virtual_options_without_their_partner_are_refused(tmp_path, capsys, argv, words):
    db = tmp_path / "fl.db"
    rc, out, err = run(capsys, "run", *SMALL, *argv, "--db", str(db))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert not db.exists()


def test_runs_of_a_missing_store_is_exit_2(tmp_path, capsys):
    rc, out, err = run(capsys, "runs", "--db", str(tmp_path / "none.db"))
    assert rc == 2 and "none.db" in err


def test_an_old_option_key_on_the_command_line_trains_under_its_current_name(tmp_path, capsys):
    db = str(tmp_path / "fl.db")
    rc, out, err = run(capsys, "run", "--strategy", "fd", *SMALL, "--rounds", "1", "--opt", "rate=0.5", "--db", db)
    assert rc == 0, err
    with ProfileStore(db) as store:
        assert RunLog(store).run(1)["config"]["options"] == {"width": 0.5}
    both = ("--opt", "rate=0.5", "--opt", "width=0.25")
    rc, out, err = run(capsys, "run", "--strategy", "fd", *SMALL, *both, "--db", db)
    assert rc == 2 and "'rate' is the old name of 'width'" in err


def test_options_parse_as_json_else_strings():
    assert parse_options(["width=0.5", "mask=per_client", "kd=true", "levels=[1, 0.5]", "name=", "x=a=b"]) == {
        "width": 0.5,
        "mask": "per_client",
        "kd": True,
        "levels": [1, 0.5],
        "name": "",
        "x": "a=b",
    }


def _local_fleet(tmp_path):
    """A fleet file of two local devices, ``a`` and ``b``, running this interpreter."""
    import sys

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        + "".join(
            f"  - name: {name}\n    kind: local\n    python: {sys.executable}\n    workdir: {tmp_path / name}\n"
            for name in ("a", "b")
        )
    )
    return fleet


def test_fleet_runs_clients_on_its_devices_with_the_runner(tmp_path, capsys):
    import sqlite3

    fleet = _local_fleet(tmp_path)
    db = str(tmp_path / "fl.db")
    argv = ["run", "--fleet", str(fleet), "--artifacts", str(tmp_path / "artifacts"), "--model", "fjord-cnn"]
    rc, out, err = run(capsys, *argv, "--dataset", "digits", "--clients", "3", "--rounds", "1", "--db", db, "--json")
    assert rc == 0, err
    assert json.loads(out)["rounds"] == 1
    rows = sqlite3.connect(db).execute("SELECT cid, device, status FROM fl_client_rounds ORDER BY cid").fetchall()
    assert rows == [("c0", "a", "ok"), ("c1", "b", "ok"), ("c2", "a", "ok")]
    assert (tmp_path / "a" / "cas").is_dir() and (tmp_path / "b" / "cas").is_dir()  # the runner ran on each device


def test_resume_of_a_store_that_does_not_exist_creates_nothing(tmp_path, capsys):
    typo = tmp_path / "typo.db"
    rc, out, err = run(capsys, "run", "--resume", "1", "--db", str(typo))
    assert rc == 2 and f"no profile store at {typo}" in err and len(err.strip().splitlines()) == 1
    assert not typo.exists() and list(tmp_path.iterdir()) == []


def test_fjord_capacity_below_the_smallest_width_is_refused_before_the_run_is_logged(tmp_path, capsys):
    db = tmp_path / "fl.db"
    argv = ["run", "--strategy", "fjord", *SMALL, "--capacities", "explicit:1,0.5,0.1", "--opt", "k=4"]
    rc, out, err = run(capsys, *argv, "--db", str(db))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "client c2 has capacity 0.1, below the smallest width 1/k = 0.25" in err
    assert not db.exists()  # no store, so no "failed" run left behind


def _unreachable_fleet(tmp_path):
    from devices.emulation.sshd import free_port

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        + "".join(
            f"  - {{name: {name}, kind: ssh, host: 127.0.0.1, port: {free_port()}, user: nobody, "
            f"trust_on_first_use: true, workdir: /tmp/{name}}}\n"
            for name in ("a", "b")
        )
    )
    return fleet


def test_a_round_in_which_no_client_trained_fails_the_run_with_every_reason(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "fl.db"
    argv = ["run", "--fleet", str(_unreachable_fleet(tmp_path)), "--artifacts", str(tmp_path / "artifacts")]
    rc, out, err = run(capsys, *argv, *SMALL[:4], "--rounds", "3", "--db", str(db))
    assert rc == 1, (out, err)
    assert "failed after 1 round(s)" in err
    for cid in ("c0", "c1", "c2"):
        assert f"round 1: {cid} unreachable" in err
    assert "accuracy" not in out  # no success summary for a failed run
    con = sqlite3.connect(db)
    status, error = con.execute("SELECT status, error FROM fl_runs").fetchone()
    assert status == "failed" and "c0 unreachable" in error and "c2 unreachable" in error
    assert con.execute("SELECT COUNT(*) FROM fl_rounds").fetchone()[0] == 1  # stopped after the first failed round
    reasons = con.execute("SELECT DISTINCT status FROM fl_client_rounds").fetchall()
    assert reasons == [("unreachable",)]


def test_json_of_a_failed_run_carries_the_reasons_and_max_failed_rounds_is_honoured(tmp_path, capsys):
    db = tmp_path / "fl.db"
    argv = ["run", "--fleet", str(_unreachable_fleet(tmp_path)), "--artifacts", str(tmp_path / "artifacts")]
    argv += [*SMALL[:4], "--rounds", "3", "--max-failed-rounds", "2", "--db", str(db), "--json"]
    rc, out, err = run(capsys, *argv)
    assert rc == 1
    summary = json.loads(out)
    assert summary["status"] == "failed" and summary["rounds"] == 2
    assert [h["failed"] for h in summary["history"]] == [True, True]
    failures = summary["history"][1]["failures"]
    assert [f["cid"] for f in failures] == ["c0", "c1", "c2"] and {f["reason"] for f in failures} == {"unreachable"}
    assert all(f["message"] for f in failures)


def test_no_device_with_a_backend_is_refused_before_the_run_is_logged(tmp_path, capsys):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"devices:\n  - {{name: nopy, kind: local, python: /nonexistent/python3, workdir: {tmp_path}}}\n")
    db = tmp_path / "fl.db"
    rc, out, err = run(capsys, "run", "--fleet", str(fleet), *SMALL[:4], "--db", str(db))
    assert rc == 2 and "no device of" in err and "nopy: no usable backend" in err
    assert not db.exists()


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_feddrop_on_a_fleet_with_a_backend_without_mask_inputs_is_refused(tmp_path, capsys, backend):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"devices:\n  - name: a\n    kind: local\n    workdir: {tmp_path / 'a'}\n")
    db = tmp_path / "fl.db"
    argv = ["run", "--fleet", str(fleet), "--strategy", "feddrop", "--backend", backend, "--db", str(db)]
    rc, out, err = run(capsys, *argv, "--artifacts", str(tmp_path / "artifacts"))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--backend {backend} has no mask inputs (use --backend onnx or auto)" in err
    assert not db.exists() and not (tmp_path / "a").exists()


def plan_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_prints_each_devices_width_and_the_fleet_round(capsys, profiles):
    argv = ("--population", "fast=0.5,slow=0.5", "--db", profiles, "--strategy", "heterofl", "--clients", "4",
            "--deadline", "p50")  # fmt: skip
    rc, out, err = plan_cli(capsys, *argv, "--examples", "400", "--optimizer", "adamw")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["device", "status", "level"]
    assert sorted(line.split()[0] for line in lines[1:3]) == ["fast", "slow"]
    assert any(line.startswith("deadline ") and "(p50)" in line for line in lines)
    assert any(line.startswith("predicted fleet round") and "FedAvg at full width" in line for line in lines)
    rc, out, err = plan_cli(capsys, *argv, "--examples", "400", "--optimizer", "adamw", "--json")
    assert rc == 0, err
    plan = json.loads(out)
    widths = {d["device"]: d["width"] for d in plan["devices"]}
    assert widths["fast"] == 1.0 and widths["slow"] < 1.0  # p50 of two: fast's full round, which slow misses
    assert {d["examples"] for d in plan["devices"]} == {400}
    # planned with SGD on profiles measured with AdamW: the difference is named
    rc, out, err = plan_cli(capsys, *argv, "--examples", "400")
    assert rc == 0 and "profile differs from the run in optimizer adamw (run: sgd)" in err


def test_plan_with_an_energy_budget_names_the_devices_without_energy(capsys, profiles):
    argv = ("--population", "fast=0.5,slow=0.5", "--db", profiles, "--strategy", "heterofl", "--clients", "4")
    rc, out, err = plan_cli(capsys, *argv, "--examples", "400", "--optimizer", "adamw", "--energy-budget", "2.5")
    assert rc == 0, err
    assert "energy J" in out.splitlines()[0]
    assert "no deadline" in out and "energy budget 2.5 J per client round" in out
    assert "--plan none --energy-budget 2.5" in out
    for device in ("fast", "slow"):
        assert f"no energy per image of fjord-cnn on {device}" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--population", "fast=0.5,gpu=0.5"), "device 'gpu' has no profile of fjord-cnn"),
        (("--population", "fast=1", "--model", "fluid-cnn"), "no profile of model 'fluid-cnn'"),
        (("--population", "fast=1", "--deadline", "soon"), "--deadline 'soon'"),
    ],
)
def test_plan_bad_input_is_one_line(capsys, profiles, argv, words):
    rc, out, err = plan_cli(capsys, *argv, "--db", profiles, "--examples", "100")
    assert rc == 2 and err.startswith("fleetbench: error:") and len(err.strip().splitlines()) == 1
    assert words in err


def test_fl_run_plan_trains_with_the_plan_and_stores_it(tmp_path, capsys, profiles):
    db = str(tmp_path / "fl.db")
    pop = ("--population", "fast=0.5,slow=0.5", "--profiles", profiles)
    argv = ("--strategy", "heterofl", *SMALL, "--clients", "4", "--rounds", "1", *pop, "--plan", "p50")
    rc, out, err = run(capsys, "run", *argv, "--db", db)
    assert rc == 0, err
    assert "fleetbench: plan: deadline" in err

    with ProfileStore(db) as store:
        log = RunLog(store)
        stored = log.plans(1)
        clients = log.clients(1)
        config = log.run(1)["config"]
    assert [p["revision"] for p in stored] == [0]
    width = {d["device"]: d["width"] for d in stored[0]["plan"]["devices"]}
    assert list(clients.capacity) == [width[d] for d in clients.device]
    assert config["capacities"].startswith("explicit:")
    assert width["slow"] < width["fast"]


def test_fl_run_plan_needs_devices(tmp_path, capsys):
    rc, out, err = run(capsys, "run", *SMALL, "--plan", "--db", str(tmp_path / "fl.db"))
    assert rc == 2 and "--plan needs the devices it plans for" in err


# --------------------------------------------------------------------------- a user's own model


def test_your_model_trains_with_fjord_heterofl_and_fedrolex_and_resumes(tmp_path, capsys):
    from tests.exporters.examples import SMALL_CNN

    db = str(tmp_path / "fl.db")
    names = set()
    for strategy in ("fjord", "heterofl", "fedrolex"):
        argv = ("run", "--strategy", strategy, "--model", SMALL_CNN, *SMALL, "--rounds", "1", "--db", db, "--json")
        extra = () if strategy == "fjord" else ("--capacities", "uniform:1,0.5")
        rc, out, err = run(capsys, *argv, *extra)
        assert rc == 0, err
        summary = json.loads(out)
        assert summary["history"][0]["clients_ok"] == 3
        widths = set(summary["accuracy"])
        assert widths == ({"0.2", "0.4", "0.6", "0.8", "1.0"} if strategy == "fjord" else {"0.5", "1.0"})
        names.add(err.split("model ", 1)[1].split(":", 1)[0])
    (name,) = names  # one definition, one name
    assert name.startswith("small_cnn@")
    with ProfileStore(db) as store:
        runs = RunLog(store).runs()
        assert set(runs["model"]) == {name}
        (record,) = store.models()
    assert record.name == name and record.source == SMALL_CNN
    assert record.groups == (("features.0", 16), ("features.4", 32), ("hidden", 64))
    rc, out, err = run(capsys, "run", "--resume", "1", "--rounds", "2", "--db", db, "--json")
    assert rc == 0, err
    assert json.loads(out)["rounds"] == 2


def test_your_model_is_profiled_planned_and_trained_on_a_fleet(tmp_path, capsys):
    from tests.exporters.examples import SMALL_CNN

    fleet = _local_fleet(tmp_path)
    db = str(tmp_path / "fl.db")
    artifacts = str(tmp_path / "artifacts")
    profile = ["profile", "--fleet", str(fleet), "--model", SMALL_CNN, "--widths", "0.25,0.5,1", "--db", db]
    rc = main([*profile, "--artifacts", artifacts, "--optimizer", "sgd", "--max-seconds", "2", "--passes", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count(" ok") >= 6
    rc = main(["plan", "--fleet", str(fleet), "--db", db, "--model", SMALL_CNN, "--strategy", "fjord", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    plan = json.loads(out)
    assert {d["device"] for d in plan["devices"]} == {"a", "b"}
    argv = ["run", "--fleet", str(fleet), "--artifacts", artifacts, "--model", SMALL_CNN, "--strategy", "fjord"]
    rc, out, err = run(capsys, *argv, "--plan", "--dataset", "digits", "--clients", "2", "--rounds", "1", "--db", db)
    assert rc == 0, err
    assert "round 1/1: clients ok 2 failed 0" in err
