"""The runner's failures with a known status (`harness.runner.failures`)."""

from __future__ import annotations

import pytest

from harness.runner.failures import is_oom


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (MemoryError(), True),
        (
            RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer"),
            True,
        ),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes"), True),
        (RuntimeError("std::bad_alloc"), True),
        (RuntimeError("shape mismatch"), False),
    ],
)
def test_allocation_failures_are_recognised(exc: BaseException, oom: bool) -> None:
    assert is_oom(exc) is oom
