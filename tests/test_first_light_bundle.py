"""scripts/first_light_bundle.py: the GPU first-light bundle (what the image lacks for verl +
TRL + kedro without vLLM, stripped and xz-packed for one upload) and the model in parts.

No network: the plan, the Requires-Dist report, the strip rules, packing and unpacking, the
split and join and the upload-size check run on small files made here."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, load_script

SCRIPTS = PROJECT_ROOT / "scripts"
MiB = 1 << 20



fl = load_script("first_light_bundle")


def _write(path: Path, data: bytes = b"x", mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        path.chmod(mode)
    return path


# --- inputs -------------------------------------------------------------------------------

def test_the_image_list_reads_versions_name_only_lines_and_normalises_names() -> None:
    image = fl.parse_image(
        "# a comment\n"
        "\n"
        "torch==2.11.0+cu130\n"
        "huggingface_hub==1.33.0\n"
        "Foo.Bar_baz===1.0  # inline comment\n"
        "peft\n"
        "Accelerate\n"
        "-e git+https://example.invalid/x.git#egg=x\n"
        "wheelpkg @ file:///w/wheelpkg-2.0-py3-none-any.whl\n"
        "gitpkg @ git+https://example.invalid/gitpkg.git\n")
    assert image == {"torch": "2.11.0+cu130", "huggingface-hub": "1.33.0",
                     "foo-bar-baz": "1.0", "peft": None, "accelerate": None,
                     "wheelpkg": "2.0", "gitpkg": None}
    with pytest.raises(ValueError, match="cannot read"):
        fl.parse_image("torch>=2\n")


def test_the_real_image_list_parses() -> None:
    image = fl.parse_image(fl.DEFAULT_IMAGE.read_text())
    assert image["torch"] == "2.11.0+cu130"
    assert image["transformers"] == "5.17.0"
    assert image["huggingface-hub"] == "1.33.0"  # huggingface_hub in the file


def test_the_bundle_list_has_sections_and_names_only() -> None:
    text = "# intro\n# [A] verl path\nverl\n# why\nHydra_Core\n\n# [K] kedro\nkedro  # x\n"
    assert fl.parse_bundles(text) == {"A": ["verl", "hydra-core"], "K": ["kedro"]}
    with pytest.raises(ValueError, match="line 2: a name only"):
        fl.parse_bundles("# [A] x\nray==2.60.0\n")
    with pytest.raises(ValueError, match="before any"):
        fl.parse_bundles("ray\n# [A] x\n")


def test_every_name_in_first_light_txt_is_pinned_in_gpu_lock() -> None:
    bundles = fl.parse_bundles(fl.BUNDLE_LIST.read_text())
    lock = fl.parse_lock(fl.LOCK.read_text())
    assert set(bundles) == {"A", "K"}
    names = [n for ns in bundles.values() for n in ns]
    assert len(names) == len(set(names)), "a name in two places"
    assert [n for n in names if n not in lock] == []
    for required in ("verl", "ray", "transferqueue", "antlr4-python3-runtime", "transformers",
                     "tokenizers", "trl", "pyvers"):
        assert required in bundles["A"]
    for required in ("kedro", "kedro-mlflow", "mlflow", "sqlalchemy", "math-verify"):
        assert required in bundles["K"]


def test_every_dependency_of_the_project_reaches_the_box() -> None:
    # The first GPU box had no pebble (a dependency of the project, not of any bundled
    # wheel, so the Requires-Dist check never saw it): every reward scored 0 there.
    from packaging.requirements import Requirement

    image = fl.parse_image(fl.DEFAULT_IMAGE.read_text())
    plan = fl.make_plan(fl.parse_bundles(fl.BUNDLE_LIST.read_text()),
                        fl.parse_lock(fl.LOCK.read_text()), image)
    there = {i.name for i in plan.items} | set(image)
    names = [fl.normalize(Requirement(line).name) for line in fl.project_requires()]
    assert {"pebble", "scipy", "verl"} <= set(names)
    assert [n for n in names if n not in there and n not in fl.KNOWN_UNNEEDED] == []


def test_the_report_names_a_project_dependency_that_nothing_provides(tmp_path) -> None:
    owner = _fake_wheel(tmp_path, "owner", "1.0", ["carried"])
    report = fl.requires_report({"owner": ("1.0", owner)}, {"owner": "1.0", "carried": "1"},
                                {}, "3.12", project=["pebble>=5.1", "carried", "wandb"])
    assert list(report["unresolved"]) == ["pebble"]
    assert report["unresolved"]["pebble"]["required_by"] == [
        "the project (pyproject.toml) (>=5.1)"]
    assert report["known_unneeded"]["wandb"]["required_by"] == [
        "the project (pyproject.toml) (any)"]


def test_the_real_plan_replaces_the_images_transformers_with_the_locked_one() -> None:
    from packaging.version import Version

    plan = fl.make_plan(fl.parse_bundles(fl.BUNDLE_LIST.read_text()),
                        fl.parse_lock(fl.LOCK.read_text()),
                        fl.parse_image(fl.DEFAULT_IMAGE.read_text()))
    carried = {i.name: i.version for i in plan.items}
    assert Version(carried["transformers"]) < Version("5.11")  # verl 0.9.1's bound
    assert Version(carried["tokenizers"]) <= Version("0.23.0")
    assert {k["name"] for k in plan.kept} >= {"transformers", "tokenizers"}
    assert "torch" not in carried


def test_the_plan_is_the_bundles_minus_the_image_at_the_locked_versions() -> None:
    bundles = {"A": ["transformers", "tokenizers", "ray", "peft", "pydantic", "torch"],
               "K": ["kedro", "ray"]}
    lock = {"transformers": "5.9.0", "tokenizers": "0.22.2", "ray": "2.60.0", "peft": "0.21.2",
            "pydantic": "2.14.3", "torch": "2.11.0", "kedro": "1.7.0"}
    image = {"transformers": "5.17.0", "tokenizers": "0.22.2", "pydantic": "2.14.3",
             "peft": None, "torch": "2.11.0+cu130"}
    plan = fl.make_plan(bundles, lock, image)
    assert [(i.bundle, i.name, i.version) for i in plan.items] == [
        ("A", "transformers", "5.9.0"), ("A", "ray", "2.60.0"), ("A", "peft", "0.21.2"),
        ("K", "kedro", "1.7.0")]
    assert {s["name"] for s in plan.skipped} == {"tokenizers", "pydantic", "torch"}
    why = {k["name"]: k["reason"] for k in plan.kept}
    assert "5.17.0" in why["transformers"] and "5.11" in why["transformers"]
    assert "unknown version" in why["peft"]
    assert "earlier bundle" in why["ray"]


def test_the_plan_refuses_names_the_lock_does_not_pin() -> None:
    with pytest.raises(ValueError, match="not pinned in gpu.lock: nosuch, other"):
        fl.make_plan({"A": ["ray", "nosuch"], "K": ["other"]}, {"ray": "2.60.0"}, {})


# --- wheels and their Requires-Dist -------------------------------------------------------

def test_manylinux_platforms_go_from_2_28_down_with_the_legacy_names() -> None:
    tags = fl.manylinux_platforms("2.28")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_31_x86_64" not in tags


def test_the_cache_is_reused_with_the_wheel_the_target_accepts(tmp_path, monkeypatch) -> None:
    for name in ("ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
                 "ray-2.60.0-cp312-cp312-macosx_11_0_arm64.whl",
                 "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl",
                 "ray-2.59.0-cp312-cp312-manylinux2014_x86_64.whl",
                 "pylatexenc-2.11-py2.py3-none-any.whl",
                 "pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl"):
        _write(tmp_path / name)
    monkeypatch.setattr(fl, "_pip", lambda *a, **k: pytest.fail(f"pip ran: {a}"))
    items = [fl.Item("ray", "2.60.0", "A"), fl.Item("pylatexenc", "2.11", "A"),
             fl.Item("pyzmq", "27.3.0", "A")]
    found = fl.fetch_wheels(items, tmp_path, "3.12", fl.manylinux_platforms("2.28"))
    assert found["ray"].name == "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    assert found["pylatexenc"].name == "pylatexenc-2.11-py2.py3-none-any.whl"
    assert found["pyzmq"].name.startswith("pyzmq-27.3.0-cp312-abi3")
    # a wheel for a newer glibc than the target's is not taken
    assert fl.find_wheel(tmp_path, "pyzmq", "27.3.0", "3.12",
                         fl.manylinux_platforms("2.17")) is None


def _fake_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    dist = f"{name}-{version}.dist-info"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
        z.writestr(f"{name}/__init__.py", "")
    return path


def test_the_requires_dist_report_names_what_nothing_provides(tmp_path, monkeypatch) -> None:
    owner = _fake_wheel(tmp_path, "owner", "1.0", [
        "carried>=1", "Image_Pkg", "missing-pkg>=2", "wandb",
        "extra-only ; extra == 'x'", "win-only ; sys_platform == 'win32'",
        "old-py ; python_version < '3.10'", "new-py ; python_version >= '3.12'",
        "tooold>=9", "unknown-version>=100", "name-only"])
    other = _fake_wheel(tmp_path, "carried", "1.5", ["missing-pkg"])
    report = fl.requires_report(
        {"owner": ("1.0", owner), "carried": ("1.5", other)}, {"owner": "1.0", "carried": "1.5"},
        {"image-pkg": "3.0", "tooold": "1.0", "unknown-version": None, "name-only": None},
        "3.12")
    assert list(report["unresolved"]) == ["missing-pkg", "new-py"]
    assert report["unresolved"]["missing-pkg"]["required_by"] == [
        "carried 1.5 (any)", "owner 1.0 (>=2)"]
    assert report["conflicts"] == [{"name": "tooold", "have": "1.0", "where": "image",
                                    "needs": ">=9", "required_by": "owner 1.0"}]
    assert list(report["known_unneeded"]) == ["wandb"]


def test_a_requirement_the_carried_version_breaks_is_a_conflict(tmp_path) -> None:
    owner = _fake_wheel(tmp_path, "owner", "1.0", ["dep<2"])
    report = fl.requires_report({"owner": ("1.0", owner)}, {"owner": "1.0", "dep": "2.1"}, {},
                                "3.12")
    assert report["conflicts"] == [{"name": "dep", "have": "2.1", "where": "bundle",
                                    "needs": "<2", "required_by": "owner 1.0"}]
    assert report["unresolved"] == {}


# --- strip, pack, unpack ------------------------------------------------------------------

def _fake_site(site: Path) -> None:
    _write(site / "ray/__init__.py", b"ray")
    _write(site / "ray/jars/ray_dist.jar", b"j" * 3000)
    _write(site / "ray/dashboard/client/build/static/js/main.js", b"js")
    _write(site / "ray/dashboard/client/build/static/js/main.js.map", b"m" * 500)
    _write(site / "ray/core/src/ray/raylet/raylet", b"\x7fELF raylet", mode=0o755)
    _write(site / "bin/ray", b"#!/usr/bin/python3\n", mode=0o755)
    for stray in ("scripts", "tests", "recipe", "tutorial", "examples"):
        _write(site / stray / "__init__.py", b"stray" * 10)
    _write(site / "mlflow/server/js/build/index.html", b"h" * 700)
    _write(site / "mlflow/server/__init__.py", b"server")
    _write(site / "verl/__init__.py", b"verl")
    _write(site / "verl/trainer/__pycache__/main.cpython-312.pyc", b"p" * 40)
    _write(site / "verl-0.9.1.dist-info/METADATA", b"Name: verl")
    _write(site / "typing_inspection/__init__.py", b"ti")


def test_strip_removes_what_a_run_never_loads_and_keeps_the_rest(tmp_path) -> None:
    site = tmp_path / "site"
    _fake_site(site)
    removed = fl.strip_site(site)
    left = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert left == ["mlflow/server/__init__.py", "ray/__init__.py",
                    "ray/core/src/ray/raylet/raylet",
                    "ray/dashboard/client/build/static/js/main.js",
                    "typing_inspection/__init__.py", "verl-0.9.1.dist-info/METADATA",
                    "verl/__init__.py"]
    assert not (site / "verl/trainer/__pycache__").exists()
    assert removed["ray/jars (Java workers)"] == 3000
    assert removed["ray dashboard *.map (source maps)"] == 500
    assert removed["mlflow/server/js/build (web UI)"] == 700
    assert removed["__pycache__"] == 40
    assert removed["top-level tests (would shadow the project's)"] == 50
    assert sum(removed.values()) == 3000 + 500 + 700 + 40 + 5 * 50 + len(b"#!/usr/bin/python3\n")
    assert fl.strip_site(site) == {}  # nothing left to strip


@pytest.mark.parametrize("use_xz", [True, False], ids=["xz", "lzma"])
def test_pack_and_unpack_keep_contents_and_the_executable_bit(tmp_path, use_xz) -> None:
    if use_xz and not fl.shutil.which("xz"):
        pytest.skip("no xz on PATH")
    site = tmp_path / "site"
    _fake_site(site)
    fl.strip_site(site)
    out = tmp_path / "out/a/siteA.txz"
    packed = fl.pack(site, out, threads=1, use_xz=use_xz)
    assert packed["bytes"] == out.stat().st_size > 0
    assert packed["tool"].startswith("xz" if use_xz else "tarfile")
    assert os.listdir(out.parent) == ["siteA.txz"]  # no temporary file left
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert all(not m.name.startswith(("/", "./", "..")) for m in members)
    assert {m.uid for m in members} == {0} and {m.uname for m in members} == {""}

    unpacked = fl.unpack(out, tmp_path / "box/site")
    raylet = unpacked / "ray/core/src/ray/raylet/raylet"
    assert raylet.read_bytes() == b"\x7fELF raylet"
    assert os.stat(raylet).st_mode & stat.S_IXUSR, "raylet must stay executable"
    assert not os.stat(unpacked / "ray/__init__.py").st_mode & stat.S_IXUSR
    before = {p.relative_to(site): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    after = {p.relative_to(unpacked): p.read_bytes() for p in unpacked.rglob("*") if p.is_file()}
    assert before == after


def test_the_box_one_liner_unpacks_a_bundle(tmp_path) -> None:
    site = tmp_path / "site"
    _write(site / "pkg/__init__.py", b"VALUE = 7\n")
    _write(site / "pkg/tool", b"#!/bin/sh\n", mode=0o755)
    out = fl.pack(site, tmp_path / "siteA.txz")
    assert out["bytes"] > 0
    box = tmp_path / "box"
    subprocess.run([sys.executable, "-c", "import tarfile,sys; tarfile.open(sys.argv[1])"
                    ".extractall(sys.argv[2], filter='tar')", str(tmp_path / "siteA.txz"),
                    str(box)], check=True)
    value = subprocess.run([sys.executable, "-c", "import pkg; print(pkg.VALUE)"],
                           env={**os.environ, "PYTHONPATH": str(box)}, check=True,
                           capture_output=True, text=True).stdout
    assert value.strip() == "7"
    assert os.access(box / "pkg/tool", os.X_OK)


def test_the_module_imports_only_the_standard_library() -> None:
    """The box's runner imports unpack and join_parts from it (Python 3.12, nothing extra)."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import first_light_bundle; "
             "print(sorted({m.split('.')[0] for m in sys.modules} - "
             "set(sys.stdlib_module_names) - {'first_light_bundle', '__main__'}))")
    out = subprocess.run([sys.executable, "-S", "-c", probe, str(SCRIPTS)], check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "[]"


# --- the model in parts -------------------------------------------------------------------

def test_split_and_join_round_trip_with_sha256(tmp_path) -> None:
    data = os.urandom(2500)
    model = _write(tmp_path / "m.gguf", data)
    out = tmp_path / "gpu"
    parts = fl.split_file(model, out, part_size=1000)
    assert [str(p.relative_to(out)) for p in parts] == [
        "b/m.gguf.part-aa", "c/m.gguf.part-ab", "d/m.gguf.part-ac"]
    assert [p.stat().st_size for p in parts] == [1000, 1000, 500]
    for p in parts:
        digest, name = (p.parent / f"{p.name}.sha256").read_text().split()
        assert (digest, name) == (hashlib.sha256(p.read_bytes()).hexdigest(), p.name)
        assert (p.parent / "m.gguf.sha256").read_text().split() == [
            hashlib.sha256(data).hexdigest(), "m.gguf"]
    # on the box the parts arrive in one folder, in any order
    joined = fl.join_parts(list(reversed(parts)), tmp_path / "joined.gguf")
    assert joined.read_bytes() == data


def test_a_whole_number_of_parts_leaves_no_empty_part_and_a_resplit_no_stale_one(
        tmp_path) -> None:
    model = _write(tmp_path / "m.gguf", os.urandom(2000))
    out = tmp_path / "gpu"
    assert len(fl.split_file(model, out, part_size=500)) == 4
    parts = fl.split_file(model, out, part_size=1000)
    assert [p.name for p in parts] == ["m.gguf.part-aa", "m.gguf.part-ab"]
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert left == ["b", "b/m.gguf.part-aa", "b/m.gguf.part-aa.sha256", "b/m.gguf.sha256",
                    "c", "c/m.gguf.part-ab", "c/m.gguf.part-ab.sha256", "c/m.gguf.sha256"]


def test_join_refuses_a_corrupt_part_naming_it(tmp_path) -> None:
    model = _write(tmp_path / "m.gguf", os.urandom(2500))
    parts = fl.split_file(model, tmp_path / "gpu", part_size=1000)
    raw = bytearray(parts[1].read_bytes())
    raw[10] ^= 0xFF
    parts[1].write_bytes(bytes(raw))
    out = tmp_path / "joined.gguf"
    with pytest.raises(ValueError, match=r"m\.gguf\.part-ab: sha256 .* corrupt"):
        fl.join_parts(parts, out)
    assert sorted(os.listdir(tmp_path)) == ["gpu", "m.gguf"]  # no joined or temporary file


def test_join_refuses_a_missing_part_or_a_wrong_whole(tmp_path) -> None:
    model = _write(tmp_path / "m.gguf", os.urandom(2500))
    parts = fl.split_file(model, tmp_path / "gpu", part_size=1000)
    with pytest.raises(ValueError, match="part-ab is missing"):
        fl.join_parts([parts[0], parts[2]], tmp_path / "j")
    with pytest.raises(ValueError, match="joined file's sha256"):
        fl.join_parts(parts, tmp_path / "j", whole_sha256="0" * 64)
    (parts[0].parent / "m.gguf.part-aa.sha256").unlink()
    with pytest.raises(ValueError, match="part-aa.sha256 is missing"):
        fl.join_parts(parts, tmp_path / "j")
    assert not (tmp_path / "j").exists()


# --- the upload-size check ----------------------------------------------------------------

def test_an_upload_over_64_mib_with_the_tree_fails() -> None:
    tree = int(6.6 * MiB)
    rows, ok = fl.check_uploads({".gpu/a": 52 * MiB, ".gpu/b": 47 * MiB}, tree)
    assert ok and [r["status"] for r in rows] == ["ok", "ok"]
    rows, ok = fl.check_uploads({".gpu/a": 56 * MiB}, tree)
    assert ok and rows[0]["status"] == "WARN"  # 62.6 MiB: above 62
    rows, ok = fl.check_uploads({".gpu/a": 58 * MiB, ".gpu/b": 47 * MiB}, tree)
    assert not ok and [r["status"] for r in rows] == ["FAIL", "ok"]
    assert rows[0]["with_tree"] == 58 * MiB + tree
    rows, ok = fl.check_uploads({".gpu/a": 64 * MiB - tree}, tree)
    assert ok  # exactly the cap is allowed
    table = fl.format_table(fl.check_uploads({".gpu/a": 58 * MiB}, tree)[0], tree)
    assert "FAIL" in table and ".gpu/a" in table


def test_the_tree_measure_counts_tracked_and_untracked_files(tmp_path) -> None:
    repo = tmp_path / "repo"
    _write(repo / "tracked.txt", b"t" * 100)
    _write(repo / ".gitignore", b"/.gpu/\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "tracked.txt", ".gitignore"], check=True)
    _write(repo / "new.txt", b"n" * 30)
    _write(repo / ".gpu/a/siteA.txz", b"z" * 1000)
    tree = fl.repo_tree_bytes(repo)
    assert tree == {"tracked": 107, "untracked": 30, "total": 137, "files": 3}
