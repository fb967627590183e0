"""`harness.runner.runtimes`: the runtimes imported the runner's way, each in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

REPORT = """
import json, sys
loaded = {name: name in sys.modules and sys.modules[name] is not None
          for name in ("torch", "onnx", "onnxruntime", "onnxruntime.training.api", "onnxruntime.training.ortmodule")}
blocks = sorted(name for name, module in sys.modules.items() if module is None and name.split(".")[0] in
                ("torch", "onnxruntime"))
print(json.dumps({"loaded": loaded, "blocks": blocks, "training_file": getattr(
    sys.modules.get("onnxruntime.training"), "__file__", None)}))
"""


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + REPORT], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_training_api_loads_without_torch_or_onnx_and_leaves_no_block() -> None:
    got = _run("""
        from harness.runner.runtimes import import_ort_training
        ort, api = import_ort_training()
        assert api.CheckpointState.__name__ == "CheckpointState" and ort.__version__
    """)
    assert got["loaded"] == {"torch": False, "onnx": False, "onnxruntime": True, "onnxruntime.training.api": True,
                             "onnxruntime.training.ortmodule": False}
    assert got["blocks"] == []  # neither torch nor the ORTModule check stays blocked
    assert got["training_file"] is None  # the bare namespace: the package's __init__ never ran


def test_plain_onnxruntime_loads_without_torch_or_onnx_and_torch_still_imports_afterwards() -> None:
    got = _run("""
        from harness.runner.runtimes import import_onnxruntime
        import_onnxruntime()
        import torch  # the runner's torch backend, or a user's code, may still load it
    """)
    assert got["loaded"]["onnxruntime"] and not got["loaded"]["onnx"]
    assert got["loaded"]["torch"] and got["blocks"] == []


def test_where_torch_is_loaded_the_training_package_is_imported_whole() -> None:
    got = _run("""
        import torch
        from harness.runner.runtimes import import_ort_training
        ort, api = import_ort_training()
    """)
    assert got["loaded"]["onnxruntime.training.api"] and got["training_file"].endswith("__init__.py")
