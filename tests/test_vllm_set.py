"""scripts/vllm_set.py and scripts/import_probe.py: the vLLM set that travels to the GPU box
after the first light, found by importing, in uploads that the box receives as they arrive.

No network and no vLLM here: the import probe runs on small packages made here (a module
missing, one guarded, a native extension that cannot load), the units are small xz tars;
the real build (`make vllm-set`, about 2 minutes with its downloads cached) is recorded in
docs/gpu.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, load_script

vs = load_script("vllm_set")
flb = load_script("first_light_bundle")
PROBE = PROJECT_ROOT / "scripts/import_probe.py"


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# --- the set ------------------------------------------------------------------------------

def test_every_name_in_the_set_is_pinned_in_the_lock_and_none_is_in_the_first_light() -> None:
    names = vs.read_set()
    lock = flb.parse_lock(flb.LOCK.read_text())
    assert names[0] == "vllm"
    assert [n for n in names if n not in lock] == []
    assert set(names) & vs.first_light_names() == set()  # upload 1 carries those


def test_every_probe_module_and_unit_path_names_vllm_or_verl() -> None:
    assert all(m.split(".")[0] in {"vllm", "verl"} for m, _ in vs.PROBE_MODULES)
    assert all(p.startswith("vllm/") for u in vs.UNITS for p in u.paths)
    assert vs.UNITS[0].paths == ()  # the Python: everything the kernel units do not take


# --- the import probe ---------------------------------------------------------------------

def _probe(site: Path, out: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, str(PROBE), "--json", str(out), *args], env=env,
                   capture_output=True, text=True, timeout=120)
    return json.loads(out.read_text())


def test_the_probe_names_the_missing_module_and_where_it_is_imported(tmp_path) -> None:
    site = tmp_path / "site"
    _write(site / "needs_it.py", "import json\nimport not_on_this_box_xyz\n")
    _write(site / "guards_it.py", "try:\n    import optional_thing_xyz\nexcept ImportError:\n"
                                  "    pass\nVALUE = 1\n")
    result = _probe(site, tmp_path / "r.json", "needs_it", "guards_it", "json")
    needs, guards = result["modules"]["needs_it"], result["modules"]["guards_it"]
    assert needs["status"] == "missing" and needs["module"] == "not_on_this_box_xyz"
    assert needs["by"] == f"{site / 'needs_it.py'}:2"
    assert guards == {"status": "ok", "guarded": ["optional_thing_xyz"]}
    assert result["modules"]["json"]["status"] == "ok"
    assert str(site / "guards_it.py") in result["loaded_files"]


def test_a_submodule_its_package_lacks_is_an_error_not_a_missing_package(tmp_path) -> None:
    site = tmp_path / "site"
    _write(site / "pkg/__init__.py", "")
    _write(site / "uses.py", "import pkg.gone\n")
    entry = _probe(site, tmp_path / "r.json", "uses")["modules"]["uses"]
    assert entry["status"] == "error" and "pkg.gone" in entry["error"]


def test_a_native_extension_that_cannot_load_is_stood_in_and_what_imports_it_traced(
        tmp_path) -> None:
    """vLLM's CUDA kernels on a CPU: the .so is there but cannot load; the Python importing it
    is still followed, so a package that Python needs is still found missing."""
    site = tmp_path / "site"
    _write(site / "kern/__init__.py", "")
    _write(site / "kern/_C.abi3.so", b"\x7fELF not really a shared object")
    _write(site / "kern/ops.py", "from kern import _C\nimport not_on_this_box_xyz\n")
    plain = _probe(site, tmp_path / "a.json", "kern.ops")["modules"]["kern.ops"]
    assert plain["status"] == "error"  # the .so stops the trace
    stood = _probe(site, tmp_path / "b.json", "--stand-in", "kern._C", "kern.ops")
    assert stood["stand_ins"]["kern._C"].startswith("stood in: ")
    assert stood["modules"]["kern.ops"]["status"] == "missing"
    assert stood["modules"]["kern.ops"]["module"] == "not_on_this_box_xyz"


def test_an_extension_probed_as_absent_shows_whether_the_python_needs_it(tmp_path) -> None:
    """A stand-in makes every importer look fine; absent, as on a box whose upload with it
    has not arrived, the importers that need it fail: unguarded, or guarded by a handler
    that raises anyway (vLLM's FlashAttention on the lent H100), and the optional one not."""
    site = tmp_path / "site"
    _write(site / "kern/__init__.py", "")
    _write(site / "kern/_C.abi3.so", b"\x7fELF not really a shared object")
    _write(site / "kern/plain.py", "from kern import _C\n")
    _write(site / "kern/strict.py", "try:\n    from kern import _C\nexcept ImportError:\n"
           "    raise ImportError('kern needs its kernels')\n")
    _write(site / "kern/optional.py", "try:\n    from kern import _C\nexcept ImportError:\n"
           "    _C = None\n")
    modules = ["kern.plain", "kern.strict", "kern.optional"]
    stood = _probe(site, tmp_path / "a.json", "--stand-in", "kern._C", *modules)
    assert {m: e["status"] for m, e in stood["modules"].items()} == dict.fromkeys(modules, "ok")
    absent = _probe(site, tmp_path / "b.json", "--stand-in", "kern._C", "--absent", "kern._C",
                    *modules)
    assert absent["absent"] == ["kern._C"] and "kern._C" not in absent["stand_ins"]
    status = {m: e["status"] for m, e in absent["modules"].items()}
    assert status == {"kern.plain": "error", "kern.strict": "error", "kern.optional": "ok"}
    assert "kern needs its kernels" in absent["modules"]["kern.strict"]["error"]
    assert absent["modules"]["kern.plain"]["at"].endswith("kern/plain.py:1")


def test_a_platform_that_needs_an_absent_extension_fails_every_module(tmp_path) -> None:
    # vLLM's CUDA platform imports its core kernels unguarded; unset, vLLM's own detection
    # finds no GPU here and everything would import, as it did not on the lent H100.
    site = tmp_path / "site"
    _write(site / "vllm/__init__.py", "")
    _write(site / "vllm/platforms/__init__.py", "current_platform = None\n")
    _write(site / "vllm/platforms/cuda.py", "import vllm._C\nclass CudaPlatform:\n    pass\n")
    _write(site / "vllm/_C.abi3.so", b"\x7fELF not really a shared object")
    _write(site / "uses_vllm.py", "import vllm.platforms\n")
    args = ["--stand-in", "vllm._C", "--platform", "vllm.platforms.cuda.CudaPlatform"]
    stood = _probe(site, tmp_path / "a.json", *args, "uses_vllm")
    assert stood["modules"]["uses_vllm"]["status"] == "ok", stood
    absent = _probe(site, tmp_path / "b.json", *args, "--absent", "vllm._C", "uses_vllm")
    entry = absent["modules"]["uses_vllm"]
    assert entry["status"] == "error"
    assert "the platform vllm.platforms.cuda.CudaPlatform does not import" in entry["error"]
    assert entry["at"].endswith("vllm/platforms/cuda.py:1")


def test_each_stood_in_extension_belongs_to_a_unit() -> None:
    assert {m: vs.unit_of(m) for m in vs.STAND_INS} == {
        "vllm._C_stable_libtorch": "vllm-core-kernels.txz",
        "vllm.vllm_flash_attn._vllm_fa3_C": "vllm-fa3.txz"}


def test_imports_inside_functions_are_listed_with_where(tmp_path) -> None:
    site = tmp_path / "site"
    file = _write(site / "lib/vllm/x.py", "import os\n\ndef f():\n    import blake3\n"
                                      "    from depyf.explain import y\n")
    other = _write(site / "elsewhere/y.py", "def g():\n    import nope\n")
    found = vs.deferred_imports([str(file), str(other)])
    assert found == {"blake3": ["vllm/x.py:4"], "depyf": ["vllm/x.py:5"]}


# --- stripping, units and uploads ---------------------------------------------------------

def test_strip_removes_other_pythons_extensions_static_libraries_and_other_gpus_kernels(
        tmp_path) -> None:
    site = tmp_path / "site"
    keep = [_write(site / "uvloop/loop.cpython-312-x86_64-linux-gnu.so", "x"),
            _write(site / "vllm/_C_stable_libtorch.abi3.so", "x")]
    gone = [_write(site / "deep/_C.cpython-311-x86_64-linux-gnu.so", "x"),
            _write(site / "xgrammar/lib/libxgrammar.a", "x"),
            _write(site / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "x"),
            _write(site / "vllm/_moe_C_stable_libtorch.abi3.so", "x")]
    vs.strip_other_pythons(site, "3.12")
    removed = vs.strip_vllm(site, keep=["moe"])
    assert all(p.exists() for p in [*keep, site / "vllm/_moe_C_stable_libtorch.abi3.so"])
    assert not any(p.exists() for p in gone[:3])
    assert any("FlashAttention-2" in rule for rule in removed)


def _units(tmp_path: Path, sizes: dict[str, int]) -> list[dict]:
    """Packed units of incompressible files of the given sizes."""
    site = tmp_path / "site"
    units = []
    for unit, size in sizes.items():
        tree = tmp_path / "trees" / unit
        _write(tree / f"{unit}.bin", os.urandom(size))
        path = tmp_path / "packed" / unit
        flb.pack(tree, path, use_xz=False)
        units.append({"unit": unit, "path": path, "tree": tree})
    assert not site.exists()
    return units


def _streamed(tmp_path: Path, sizes: dict[str, int]) -> tuple[list[dict], Path]:
    """Units of these sizes streamed into upload folders of 100,000 bytes under out/."""
    units = _units(tmp_path, sizes)
    vs.stream_into_folders(units, tmp_path / "out", budget=100_000)
    return units, tmp_path / "out"


def test_units_stream_into_uploads_split_only_when_larger_than_one(tmp_path) -> None:
    budget = 100_000
    units = _units(tmp_path, {"vllm-python.txz": 30_000, "vllm-core-kernels.txz": 120_000,
                              "vllm-fa3.txz": 60_000})
    folders = vs.stream_into_folders(units, tmp_path / "out", budget=budget)
    assert [Path(f["folder"]).name for f in folders] == ["v1", "v2", "v3"]
    assert all(f["bytes"] <= budget + 1000 for f in folders)  # + the small .sha256 files
    python, core, fa3 = units
    assert [Path(p).parent.name for p in python["pieces"]] == ["v1"]
    assert [Path(p).name[-7:] for p in core["pieces"]] == ["part-aa", "part-ab"]
    assert [Path(p).parent.name for p in core["pieces"]] == ["v1", "v2"]
    # fits one upload whole: not split over v2's remaining room, but whole in v3
    assert [Path(p).relative_to(tmp_path / "out").as_posix() for p in fa3["pieces"]] == [
        "v3/vllm-fa3.txz"]


def test_the_box_receives_each_unit_when_its_last_piece_arrives(tmp_path) -> None:
    units, out = _streamed(tmp_path, {"vllm-python.txz": 30_000,
                                      "vllm-core-kernels.txz": 120_000, "vllm-fa3.txz": 60_000})
    site = tmp_path / "box-site"

    first = vs.receive([out / "v1"], site)
    assert first["unpacked"] == ["vllm-python.txz"]
    assert first["waiting"] == {"vllm-core-kernels.txz": "have pieces aa of 2"}
    assert (site / "vllm-python.txz.bin").read_bytes() == \
        (units[0]["tree"] / "vllm-python.txz.bin").read_bytes()

    second = vs.receive([out / "v1", out / "v2"], site)
    assert second["unpacked"] == ["vllm-python.txz", "vllm-core-kernels.txz"]
    assert (site / "vllm-core-kernels.txz.bin").read_bytes() == \
        (units[1]["tree"] / "vllm-core-kernels.txz.bin").read_bytes()
    assert second["enables"][1] == "vLLM imports and its CUDA platform loads"

    (site / "vllm-python.txz.bin").unlink()  # once unpacked, not again
    third = vs.receive([out / "v1", out / "v2", out / "v3"], site)
    assert third["unpacked"] == ["vllm-python.txz", "vllm-core-kernels.txz", "vllm-fa3.txz"]
    assert not (site / "vllm-python.txz.bin").exists()


def test_a_unit_whose_pieces_arrived_in_two_folders_each_is_received(tmp_path) -> None:
    # docs/gpu.md's sequence copies each upload's files into /tmp/parts, and the box reads
    # the upload's own folder too: on the lent H100 every piece was there twice and the
    # core kernels waited ("have pieces aa, aa, ab, ab of 2"), so vLLM never imported.
    units, out = _streamed(tmp_path, {"vllm-python.txz": 30_000,
                                      "vllm-core-kernels.txz": 120_000})
    parts = tmp_path / "parts"
    parts.mkdir()
    for folder in ("v1", "v2"):
        for f in (out / folder).iterdir():
            (parts / f.name).write_bytes(f.read_bytes())
    site = tmp_path / "box-site"
    result = vs.receive([out / "v2", parts], site)
    assert result["unpacked"] == ["vllm-python.txz", "vllm-core-kernels.txz"]
    assert result["waiting"] == {}
    assert (site / "vllm-core-kernels.txz.bin").read_bytes() == \
        (units[1]["tree"] / "vllm-core-kernels.txz.bin").read_bytes()


def test_a_corrupt_piece_is_refused_by_name_and_nothing_is_unpacked(tmp_path) -> None:
    _, out = _streamed(tmp_path, {"vllm-core-kernels.txz": 120_000})
    piece = out / "v2/vllm-core-kernels.txz.part-ab"
    piece.write_bytes(piece.read_bytes()[:-10])  # a truncated transfer
    with pytest.raises(ValueError, match="part-ab"):
        vs.receive([out / "v1", out / "v2"], tmp_path / "box-site")
    assert not (tmp_path / "box-site/vllm-core-kernels.txz.bin").exists()


def test_a_whole_unit_with_a_wrong_checksum_waits(tmp_path) -> None:
    _, out = _streamed(tmp_path, {"vllm-python.txz": 40_000})
    archive = out / "v1/vllm-python.txz"
    archive.write_bytes(archive.read_bytes()[:-5])
    result = vs.receive([out / "v1"], tmp_path / "box-site")
    assert result["unpacked"] == []
    assert "sha256 is not the recorded one" in result["waiting"]["vllm-python.txz"]


def test_the_receiving_part_imports_only_the_standard_library() -> None:
    """The box runs it before any package has been unpacked (Python 3.12, nothing extra)."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import vllm_set; "
             "print(sorted({m.split('.')[0] for m in sys.modules} - "
             "set(sys.stdlib_module_names) - {'vllm_set', 'first_light_bundle', '__main__'}))")
    out = subprocess.run([sys.executable, "-S", "-c", probe, str(PROJECT_ROOT / "scripts")],
                         check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
