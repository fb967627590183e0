"""A runner that lies: a test double for a broken or compromised device, speaking the real serve protocol.

Run as ``python lying_runner.py PLAN.json [serve options]`` in place of ``runner.pyz serve``
(of the options only ``--cwd`` is read: request paths start there). It prints a
ready line, then answers each request line with one reply line, as
`harness.runner.protocol` describes, except where the plan says to lie. The plan (JSON)::

    ready     the ready line's keys merged over the honest ones, or a string: the raw line
    replies   request id -> how to answer that request (default: honestly):
                patch     keys merged over the honest reply
                raw       the raw reply line instead (a string)
                params    the trained parameters written to the request's ``out``:
                          "nan", "inf", "float64", "short", "matrix"; absent: the
                          request's own parameters, unchanged

An honest train reply reports one step and writes the request's parameters back as
trained, so a test sees exactly what the lie changed.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

PROTOCOL_VERSION = 1


def _ready() -> dict:
    return {
        "mode": "serve", "event": "ready", "protocol": PROTOCOL_VERSION, "pid": os.getpid(), "cwd": os.getcwd(),
        "status": "ok", "error": None, "startup_seconds": 0.01, "peak_memory_bytes": 1 << 20,
        "peak_memory_source": "VmHWM", "peak_memory_scope": "process", "max_sessions": 8,
    }  # fmt: skip


def _write_params(request: dict, how: str | None) -> int:
    flat = np.load(request["params"], allow_pickle=False)
    if how == "nan":
        flat[len(flat) // 2] = np.nan
    elif how == "inf":
        flat[0] = np.inf
    elif how == "float64":
        flat = flat.astype(np.float64)
    elif how == "short":
        flat = flat[:-1]
    elif how == "matrix":
        flat = flat.reshape(1, -1)
    np.save(request["out"], flat, allow_pickle=False)
    return int(flat.size)


def _honest(request: dict, size: int | None) -> dict:
    return {
        "mode": request.get("mode"), "status": "ok", "error": None, "id": request.get("id"),
        "backend": request.get("backend"), "batch": 20, "epochs": request.get("epochs"), "lr": request.get("lr"),
        "step_seconds": [0.01], "loss": [1.5], "examples": 20, "step_examples": [20], "num_parameters": size,
        "out": request.get("out"), "request_seconds": 0.02, "load_seconds": 0.001, "save_seconds": 0.001,
        "loop_seconds": 0.01, "loop_cpu_seconds": 0.01, "peak_memory_bytes": 1 << 20,
        "sessions": {"opened": 1, "reused": 0, "open_seconds": 0.001},
    }  # fmt: skip


def _line(doc: object) -> str:
    return doc if isinstance(doc, str) else json.dumps(doc)


def main(plan_path: str) -> int:
    with open(plan_path) as handle:
        plan = json.load(handle)
    if "--cwd" in sys.argv:
        os.chdir(sys.argv[sys.argv.index("--cwd") + 1])
    ready = plan.get("ready") or {}
    out = sys.stdout
    out.write(_line(ready if isinstance(ready, str) else {**_ready(), **ready}) + "\n")
    out.flush()
    for raw in sys.stdin:
        if not raw.strip():
            continue
        request = json.loads(raw)
        if request.get("mode") == "exit":
            return 0
        lie = plan.get("replies", {}).get(str(request.get("id")), {})
        size = _write_params(request, lie.get("params")) if request.get("mode") == "train" else None
        reply = lie["raw"] if "raw" in lie else {**_honest(request, size), **lie.get("patch", {})}
        out.write(_line(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
