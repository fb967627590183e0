"""Runtime bundles (`devices.bundle`): ABIs, ELF parsing, the built bundle and its cache.

The built bundles come from the session fixtures in ``tests/conftest.py`` (built once
into the user's cache, as ``fleet provision`` would, so later sessions reuse them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from devices import bundle
from devices.bundle import ABIS, Bundle, UnsupportedAbi, abi_of, elf_needed, iter_listing, part_of


@pytest.mark.parametrize(("name", "expected"), [("arm64-v8a", "arm64-v8a"), ("aarch64", "arm64-v8a"),
                                                ("x86_64", "x86_64"), ("amd64", "x86_64")])
def test_abi_names_and_aliases(name: str, expected: str) -> None:
    assert abi_of(name).name == expected


@pytest.mark.parametrize("name", ["armeabi-v7a", "x86", "riscv64", ""])
def test_other_abis_get_one_line_unsupported_abi(name: str) -> None:
    with pytest.raises(UnsupportedAbi) as caught:
        abi_of(name)
    message = str(caught.value)
    assert message.startswith("unsupported ABI") and "\n" not in message


def test_elf_needed_reads_what_the_dynamic_linker_reads() -> None:
    python = Path(os.path.realpath(sys.executable))
    ldd = subprocess.run(["ldd", str(python)], capture_output=True, text=True).stdout
    expected = {line.split()[0] for line in ldd.splitlines() if "=>" in line}
    needed = elf_needed(python)
    # ldd lists the transitive closure; every direct DT_NEEDED entry is in it
    assert needed and set(needed) <= expected
    assert elf_needed(Path(__file__)) == []


def test_recipe_key_changes_with_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    abi = ABIS["x86_64"]
    before = bundle.recipe_key(abi)
    monkeypatch.setattr(bundle, "WHEELS", ("numpy==1.26.3", "onnxruntime==1.19.2"))
    assert bundle.recipe_key(abi) != before
    assert bundle.recipe_key(ABIS["arm64-v8a"]) != bundle.recipe_key(abi)


def test_cache_dir_from_environment(tmp_path: Path) -> None:
    assert bundle.cache_dir({bundle.BUNDLE_ENV: str(tmp_path)}) == tmp_path
    found = bundle.cache_dir({"XDG_CACHE_HOME": str(tmp_path), "HOME": "/nowhere"})
    assert found == tmp_path / "fleetbench" / "bundles"


def _check_built(built: Bundle) -> None:
    listing = dict((rel, digest) for digest, rel in iter_listing((built.tree / bundle.FILE_LIST).read_text()))
    files = {p.relative_to(built.tree).as_posix() for p in built.tree.rglob("*") if p.is_file()}
    assert set(listing) | {bundle.FILE_LIST} == files
    assert built.files == len(files) and built.size == sum((built.tree / f).stat().st_size for f in files)
    assert (built.tree / "lib" / built.abi.loader).is_file() and (built.tree / "bin" / "python3").is_file()
    # every file of the tree is in exactly the part part_of names, with its mode
    seen: dict[str, str] = {}
    for part in built.parts:
        assert bundle._sha256(part.path) == part.sha256 and part.path.stat().st_size == part.size
        with tarfile.open(part.path) as archive:
            for member in archive.getmembers():
                assert member.mtime == 0 and member.uid == 0
                if member.isfile():
                    seen[member.name] = part.name
    assert seen == {rel: part_of(rel) for rel in files}
    assert built.versions["numpy"] == "1.26.4" and built.versions["onnxruntime"] == "1.19.2"
    assert built.versions["python"].startswith("3.11.")
    assert built.checked  # this host runs x86_64 natively and arm64 through qemu's binfmt entry


def test_x86_64_bundle_is_complete_and_its_parts_hold_the_tree(bundle_x86_64: Bundle) -> None:
    _check_built(bundle_x86_64)


def test_arm64_bundle_is_complete_and_holds_aarch64_code(bundle_arm64: Bundle) -> None:
    _check_built(bundle_arm64)
    head = (bundle_arm64.tree / "bin" / "python3").read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64


def test_the_bundle_runs_the_runner_from_another_directory(bundle_x86_64: Bundle, tmp_path: Path) -> None:
    # relocatable: unpack the parts elsewhere, as a phone does, and run python from there
    root = tmp_path / "runtime"
    for part in bundle_x86_64.parts:
        with tarfile.open(part.path) as archive:
            archive.extractall(root, filter="tar")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    argv = bundle.python_argv(str(root), bundle_x86_64.abi.loader)
    code = "import sys, numpy, onnxruntime; print(sys.prefix, numpy.__file__)"
    done = subprocess.run([*argv, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    prefix, numpy_file = done.stdout.split()
    assert prefix == str(root) and numpy_file.startswith(str(root / "site"))
    # nothing is written into the bundle at run time (its files stay as verified)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_a_cached_bundle_is_reused_and_a_changed_stamp_is_not(bundle_x86_64: Bundle, tmp_path: Path) -> None:
    directory = bundle_x86_64.directory.parent
    again = bundle.ensure_bundle("x86_64", directory, say=lambda line: pytest.fail(f"rebuilt: {line}"))
    assert again == bundle_x86_64
    # a stamp from another recipe does not count as built
    copy = tmp_path / bundle_x86_64.directory.name
    copy.mkdir()
    stamp = json.loads((bundle_x86_64.directory / "bundle.json").read_text())
    stamp["recipe"]["wheels"] = ["numpy==0"]
    (copy / "bundle.json").write_text(json.dumps(stamp))
    assert bundle.load_bundle(bundle_x86_64.abi, tmp_path) is None


def test_main_prints_one_line_for_an_unsupported_abi(capsys: pytest.CaptureFixture[str]) -> None:
    assert bundle.main(["path", "armeabi-v7a"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bundle: unsupported ABI: armeabi-v7a") and "\n" not in err


def test_describe_prints_the_size(bundle_x86_64: Bundle) -> None:
    line = bundle_x86_64.describe()
    assert f"{bundle_x86_64.size / 1e6:.1f} MB" in line and "x86_64" in line and "\n" not in line
