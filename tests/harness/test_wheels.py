"""The wheels a device needs: tags, requirements, pip's output, and a real fetch for a device without wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.wheels import (
    ONNXRUNTIME_REQUIREMENT,
    TRAINING_REQUIREMENT,
    NoWheel,
    Target,
    download_argv,
    downloaded,
    fetch_wheels,
    platform_tags,
    wanted_requirements,
    wheel_distribution,
    wheel_fits,
)

X86 = Target("3.11.2", "x86_64", "2.36")
PI = Target("3.11.2", "aarch64", "2.36")


def test_platform_tags_run_from_the_devices_glibc_down_to_manylinux2014() -> None:
    tags = platform_tags(Target("3.10.12", "aarch64", "2.19"))
    assert tags == ["manylinux_2_19_aarch64", "manylinux_2_18_aarch64", "manylinux_2_17_aarch64",
                    "manylinux2014_aarch64"]
    assert platform_tags(Target("3.11.2", "aarch64", None)) == []  # musl or bionic: no manylinux wheel
    assert platform_tags(Target("3.11.2", "x86_64", "2.12")) == []  # older than manylinux2014


def test_the_training_build_is_wanted_only_where_it_has_a_wheel() -> None:
    nothing = {"numpy": False, "onnxruntime": False, "onnxruntime-training": False}
    assert wanted_requirements(X86, nothing.__getitem__) == ["numpy", TRAINING_REQUIREMENT]
    assert wanted_requirements(PI, nothing.__getitem__) == ["numpy", ONNXRUNTIME_REQUIREMENT]
    py312 = Target("3.12.3", "x86_64", "2.39")  # onnxruntime-training stopped before CPython 3.12
    assert wanted_requirements(py312, nothing.__getitem__) == ["numpy", ONNXRUNTIME_REQUIREMENT]
    plain = {"numpy": True, "onnxruntime": True, "onnxruntime-training": False}
    assert wanted_requirements(X86, plain.__getitem__) == [TRAINING_REQUIREMENT]  # ort is still to be had
    assert wanted_requirements(PI, plain.__getitem__) == []


def test_a_wheel_fits_by_its_python_abi_and_platform_tags() -> None:
    numpy_x86 = Path("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
    assert wheel_fits(numpy_x86, X86) is None
    assert wheel_fits(Path("fb_fake-0.1-py3-none-any.whl"), PI) is None
    assert wheel_fits(Path("x-1.0-cp38-abi3-manylinux_2_17_aarch64.whl"), PI) is None  # stable ABI, older CPython
    why = wheel_fits(numpy_x86, PI)
    assert why == (f"{numpy_x86.name} is built for cp311 on manylinux_2_27_x86_64.manylinux_2_28_x86_64, "
                   "the device has Python 3.11 on aarch64, glibc 2.36")
    assert wheel_fits(Path("numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.whl"), X86) is not None
    assert wheel_fits(Path("numpy-2.4.6-cp311-cp311-manylinux_2_39_x86_64.whl"), X86) is not None  # newer glibc
    training = Path("onnxruntime_training-1.19.2-cp311-cp311-linux_x86_64.whl")
    assert wheel_distribution(training) == "onnxruntime-training"
    with pytest.raises(ValueError):
        wheel_fits(Path("numpy.tar.gz"), X86)


def test_pips_saved_and_cached_lines_name_the_wheels(tmp_path: Path) -> None:
    out = ("Collecting numpy\n  Using cached numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl (16.9 MB)\n"
           "Saved ./cache/numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl\n"
           "File was already downloaded /somewhere/onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_aarch64.whl\n"
           "Successfully downloaded numpy\n")
    assert downloaded(out, tmp_path) == [tmp_path / "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl",
                                         tmp_path / "onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_aarch64.whl"]


def test_the_download_asks_for_the_devices_python_and_platform_only(tmp_path: Path) -> None:
    argv = download_argv(PI, ["numpy"], tmp_path, offline=True)
    assert argv[1:4] == ["-m", "pip", "download"] and argv[-1] == "numpy"
    joined = " ".join(argv)
    assert "--python-version 3.11 --implementation cp --abi cp311" in joined and "--only-binary=:all:" in joined
    assert "--platform manylinux_2_36_aarch64" in joined and "--no-index" in joined and "x86_64" not in joined
    online = download_argv(PI, ["numpy"], tmp_path, offline=False, index_url="file:///srv/index/")
    assert "--no-index" not in online and online[online.index("--index-url") + 1] == "file:///srv/index/"


def test_a_device_with_no_wheel_is_one_line_naming_it_its_platform_and_python(tmp_path: Path) -> None:
    with pytest.raises(NoWheel) as musl:
        fetch_wheels("tiny", Target("3.11.2", "aarch64", None), ["numpy"], tmp_path)
    assert str(musl.value).startswith("tiny: no wheels of numpy exist for Python 3.11 on aarch64, no glibc")
    # a real look-up: the index (and the empty cache) has no onnxruntime for 32-bit ARM
    with pytest.raises(NoWheel) as arm32:
        fetch_wheels("pi-32bit", Target("3.11.2", "armv7l", "2.36"), [ONNXRUNTIME_REQUIREMENT], tmp_path)
    message = str(arm32.value)
    assert message.startswith("pi-32bit: no wheel of onnxruntime>=1.19 for Python 3.11 on armv7l, glibc 2.36")
    assert "\n" not in message and arm32.value.kind == "no wheel"
