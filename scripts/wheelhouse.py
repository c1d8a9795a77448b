"""Build a wheelhouse of the locked GPU stack, for a GPU machine with no network.

    python scripts/wheelhouse.py --lock requirements/gpu.lock --python-version 3.12 \\
        --platform manylinux_2_35_x86_64 --exclude-freeze FREEZE.txt --part-size 55M --out DIR

For every requirement of the lock, except those the target already has at the same version
(FREEZE.txt: `python3 -m pip list --format=freeze` run there; `pip freeze` works too; a line
with a name alone means "present at a version not known here" and counts as present, except
for EXACT_VERSION's packages, which are carried unless the target's version is the lock's), it
downloads the wheel for the target Python and platform (`pip download --no-deps
--only-binary=:all:`; the lock is complete, so no dependency is resolved here).
A requirement published as a source distribution only (antlr4-python3-runtime 4.9.3) is
built here with `pip wheel --no-deps`, and only a pure-Python wheel (`none-any`) is accepted
from such a build. A requirement with wheels for other platforms only fails, naming the
platforms it has (llguidance 1.7.6, which vLLM 0.24 needs, starts at manylinux_2_31).

`--platform manylinux_2_N_ARCH` means "glibc 2.N or newer": every manylinux tag up to 2.N is
accepted, as pip on the target would.

DIR receives:
    wheelhouse.tar.part-000, -001, ...   one tar of the wheels, split (each <= --part-size)
    manifest.json                        target, every wheel (name, version, file, size,
                                         sha256), what was left to the target, the tar's and
                                         each part's size and sha256
    SHA256SUMS                           the parts', for `sha256sum -c`
    install_wheelhouse.sh                the installer (scripts/install_wheelhouse.sh)
Copy DIR to the target and run `bash DIR/install_wheelhouse.sh DIR` there (with TARGET=FOLDER,
into FOLDER for PYTHONPATH, leaving the target's environment as it is).
Downloads are kept in DIR/.wheels until the tar is written (so a failed run resumes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_lock import normalize, parse_lock  # noqa: E402

BIG_WHEEL = 50 * 10**6
PART_PREFIX = "wheelhouse.tar.part-"
# The part size: an upload to an offline box carries at most 64 MiB, the repository's working
# tree (about 7 MiB) included, so a part of 55 MiB leaves room for the tree.
DEFAULT_PART_SIZE = "55M"
# A freeze line with a name alone: present on the target at a version not known here.
ANY_VERSION = "*"
# Carried unless the target has the lock's version: verl needs transformers < 5.11 (the lent
# image has 5.17), and tokenizers goes with transformers.
EXACT_VERSION = frozenset({"transformers", "tokenizers"})
INSTALLER = Path(__file__).resolve().parent / "install_wheelhouse.sh"


@dataclass
class Wheel:
    name: str
    version: str
    path: Path
    how: str  # "downloaded" | "built from sdist"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 60M, 1G, 500000)")
    unit = (m.group(2) or "B")[0].upper()
    return int(float(m.group(1)) * {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30}[unit])


def platform_tags(platform: str) -> list[str]:
    """`manylinux_2_35_x86_64` -> every manylinux tag a glibc-2.35 x86_64 system accepts,
    most specific first (pip's --platform matches a tag exactly)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for k in range(minor, 4, -1):
        tags.append(f"manylinux_{major}_{k}_{arch}")
        if major == 2 and k in legacy:
            tags.append(f"{legacy[k]}_{arch}")
    return tags


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def read_freeze(path: Path) -> dict[str, str]:
    """`pip freeze` (or `pip list --format=freeze`) output -> {normalised name: version}.

    `name @ file:///.../name-1.0-py3-none-any.whl` (installed from a file) gives the wheel's
    version; a `name @ URL` line of another kind gives "" (a direct-URL install); a name alone
    (the package is there, its version is not known) gives ANY_VERSION."""
    found: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "-")):
            continue
        alone = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:#.*)?", line)
        if alone:
            found[normalize(alone.group(1))] = ANY_VERSION
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s#;]+)|@\s*(\S+))", line)
        if not m:
            continue
        version = m.group(2) or ""
        url = (m.group(3) or "").split("#", 1)[0]
        if url.endswith(".whl"):
            try:
                version = str(parse_wheel_filename(url.rsplit("/", 1)[-1])[1])
            except ValueError:
                pass
        found[normalize(m.group(1))] = version
    return found


def split_by_target(pins: dict[str, str], freeze: dict[str, str],
                    exact: frozenset[str] = EXACT_VERSION):
    """(to fetch, on the target already, notes). A package the freeze names without a version
    counts as present, except those in ``exact``, which are carried unless the target's
    version is known to be the lock's."""
    fetch, present, notes = {}, {}, []
    for name, version in sorted(pins.items()):
        have = freeze.get(name)
        if have is None:
            fetch[name] = version
        elif have == ANY_VERSION and name in exact:
            fetch[name] = version
            notes.append(f"{name}: the target has it at a version not known here; the "
                         f"wheelhouse brings the lock's {version}")
        elif have == ANY_VERSION:
            present[name] = have
            notes.append(f"{name}: left to the target (there at a version not known here; "
                         f"the lock has {version})")
        elif have and same_version(have, version):
            present[name] = have
        elif have and "+" in have and "+" not in version and same_version(
            Version(have).public, version
        ):
            # torch==2.11.0+cu130 in the image is the build the lock's torch==2.11.0 names
            present[name] = have
            notes.append(f"{name}: the target's {have} counts as the lock's {version} (PEP 440 ==)")
        else:
            fetch[name] = version
            notes.append(f"{name}: the target has {have or 'a direct-URL install'}, "
                         f"the wheelhouse brings {version}")
    return fetch, present, notes


def _pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--no-input",
                           "--progress-bar", "off", "--no-cache-dir"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def _target_args(python_version: str, platforms: list[str]) -> list[str]:
    args = ["--python-version", python_version, "--implementation", "cp"]
    for tag in platforms:
        args += ["--platform", tag]
    return args


def _links_of(log: str, name: str, version: str) -> tuple[list[str], bool]:
    """From pip -vv: the tags of the wheels of name==version that were skipped, and
    whether a source distribution of it exists."""
    tags, sdist = set(), False
    for line in log.splitlines():
        m = re.search(r"none of the wheel's tags \((.*?)\) are compatible.*?(\S+\.whl)", line)
        if m:
            try:
                wname, wver, _, _ = parse_wheel_filename(m.group(2).rsplit("/", 1)[-1])
            except ValueError:
                continue
            if normalize(str(wname)) == name and same_version(str(wver), version):
                tags.update(t.strip() for t in m.group(1).split(","))
        m = re.search(r"No sources permitted for \S+: (\S+)", line)
        if m:
            fname = m.group(1).split("#", 1)[0].rsplit("/", 1)[-1]
            stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", fname)
            if "-" in stem:
                sname, sver = stem.rsplit("-", 1)
                if normalize(sname) == name and same_version(sver, version):
                    sdist = True
    return sorted(tags), sdist


def fetch_one(name: str, version: str, stage: Path, python_version: str,
              platforms: list[str]) -> Wheel | str:
    """The wheel of name==version for the target, or an error message."""
    dest = stage / name
    dest.mkdir(parents=True, exist_ok=True)
    req = f"{name}=={version}"
    common = ["--no-deps", "-d", str(dest), req]
    proc = _pip("download", "--only-binary=:all:", *_target_args(python_version, platforms),
                *common)
    if proc.returncode == 0:
        # the file pip chose (an earlier run for another platform may have left another)
        chosen = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", proc.stdout)
        for other in dest.glob("*.whl"):
            if chosen and other.name != Path(chosen[-1]).name:
                other.unlink()
        return _the_wheel(dest, name, version, "downloaded")
    # Why not? Wheels for other platforms only, or a source distribution only.
    diag = _pip("download", "-vv", "--only-binary=:all:",
                *_target_args(python_version, platforms), *common)
    tags, sdist = _links_of(diag.stdout + diag.stderr, name, version)
    if tags:
        arch = platforms[0].split("_")[-1]
        here = [t for t in tags if t.endswith(arch)] or tags
        return (f"{req}: no wheel for CPython {python_version} on {platforms[0]}; "
                f"its {arch} wheels are for: {', '.join(here[:12])}"
                + (" ..." if len(here) > 12 else ""))
    if not sdist:
        tail = "\n    ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        return f"{req}: pip found nothing to download:\n    {tail}"
    for old in dest.iterdir():
        old.unlink()
    # SOURCE_DATE_EPOCH: the same wheel, byte for byte, on every run (so the same tar)
    build = _pip("wheel", "--no-deps", "--no-binary", name, "-w", str(dest), req,
                 env={"SOURCE_DATE_EPOCH": "315532800"})
    if build.returncode != 0:
        tail = "\n    ".join(build.stderr.strip().splitlines()[-6:])
        return f"{req}: has a source distribution only, and building it failed:\n    {tail}"
    wheel = _the_wheel(dest, name, version, "built from sdist")
    if isinstance(wheel, str):
        return wheel
    _, _, _, wtags = parse_wheel_filename(wheel.path.name)
    pure = {f"py{python_version.replace('.', '')}", "py3", "py2"}
    if not all(t.abi == "none" and t.platform == "any" and t.interpreter in pure for t in wtags):
        wheel.path.unlink()
        return (f"{req}: has a source distribution only, and it builds a platform wheel "
                f"here ({wheel.path.name}): build it on the target instead")
    return wheel


def _the_wheel(dest: Path, name: str, version: str, how: str) -> Wheel | str:
    found = []
    for path in dest.glob("*.whl"):
        wname, wver, _, _ = parse_wheel_filename(path.name)
        if normalize(str(wname)) == name and same_version(str(wver), version):
            found.append(path)
    if len(found) != 1:
        return f"{name}=={version}: expected one wheel in {dest}, found {[p.name for p in found]}"
    return Wheel(name, version, found[0], how)


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class SplitWriter:
    """A write-only file that spreads its bytes over parts of at most `part_size` bytes."""

    def __init__(self, out: Path, part_size: int, prefix: str = PART_PREFIX):
        self.out, self.part_size, self.prefix = out, part_size, prefix
        self.parts: list[dict] = []
        self.total = hashlib.sha256()
        self.size = 0
        self._f = None
        self._h = None

    def _next(self):
        self._close_part()
        name = f"{self.prefix}{len(self.parts):03d}"
        self._f = open(self.out / name, "wb")
        self._h = hashlib.sha256()
        self.parts.append({"file": name, "size": 0})

    def _close_part(self):
        if self._f is not None:
            self._f.close()
            self.parts[-1]["sha256"] = self._h.hexdigest()
            self._f = None

    def write(self, data) -> int:
        view = memoryview(data)
        while view.nbytes:
            if self._f is None or self.parts[-1]["size"] == self.part_size:
                self._next()
            room = self.part_size - self.parts[-1]["size"]
            chunk = view[:room]
            self._f.write(chunk)
            self._h.update(chunk)
            self.total.update(chunk)
            self.parts[-1]["size"] += chunk.nbytes
            self.size += chunk.nbytes
            view = view[chunk.nbytes:]
        return len(data)

    def close(self):
        self._close_part()


def pack(out: Path, files: list[tuple[Path, str]], part_size: int,
         prefix: str = PART_PREFIX) -> SplitWriter:
    """One uncompressed tar of `files` (wheels are zip files already), written straight into
    parts named `prefix`NNN; reproducible: sorted, mtime 0, root-owned."""
    for old in out.glob(prefix + "*"):
        old.unlink()
    writer = SplitWriter(out, part_size, prefix)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, arcname in files:
            with open(path, "rb") as f:  # the file itself, where `path` is a symlink
                info = tar.gettarinfo(arcname=arcname, fileobj=f)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
                info.mode = 0o644
                tar.addfile(info, f)
    writer.close()
    return writer


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--python-version", required=True, help="the target's, e.g. 3.12")
    parser.add_argument("--platform", required=True,
                        help="e.g. manylinux_2_35_x86_64 (the target's glibc, 2.35, or newer)")
    parser.add_argument("--exclude-freeze", type=Path,
                        help="the target's `pip list --format=freeze` (or `pip freeze`): what "
                             "it has at the locked version, or names without a version, is "
                             "left out (transformers and tokenizers only at the lock's version)")
    parser.add_argument("--part-size", type=parse_size, default=parse_size(DEFAULT_PART_SIZE),
                        help=f"largest part of the split tar (default {DEFAULT_PART_SIZE}iB: "
                             "an upload of 64 MiB with the working tree beside it)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=8, help="parallel downloads (default 8)")
    parser.add_argument("--keep-wheels", action="store_true",
                        help="keep the downloaded wheels in OUT/.wheels after packing")
    args = parser.parse_args(argv)

    start = time.monotonic()
    lock_text = args.lock.read_text()
    pins = parse_lock(lock_text)
    freeze = read_freeze(args.exclude_freeze) if args.exclude_freeze else {}
    fetch, present, notes = split_by_target(pins, freeze)
    platforms = platform_tags(args.platform)
    out = args.out.resolve()
    stage = out / ".wheels"
    stage.mkdir(parents=True, exist_ok=True)
    print(f"wheelhouse: {len(pins)} locked, {len(present)} on the target already, "
          f"{len(fetch)} to fetch for CPython {args.python_version} / {args.platform}")
    for note in notes:
        print(f"  {note}")

    wheels: list[Wheel] = []
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(fetch_one, name, version, stage, args.python_version,
                               platforms): name for name, version in fetch.items()}
        for n, future in enumerate(futures, 1):
            result = future.result()
            if isinstance(result, str):
                errors.append(result)
                print(f"  [{n}/{len(fetch)}] FAILED {result.splitlines()[0]}", flush=True)
            else:
                wheels.append(result)
                if result.how != "downloaded" or n % 25 == 0 or n == len(fetch):
                    print(f"  [{n}/{len(fetch)}] {result.path.name} ({result.how})", flush=True)
    if errors:
        print(f"wheelhouse: {len(errors)} of {len(fetch)} requirements have no wheel for the "
              "target; nothing was packed:", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1

    wheels.sort(key=lambda w: w.name)
    entries = []
    for w in wheels:
        entries.append({"name": w.name, "version": w.version, "file": w.path.name,
                        "size": w.path.stat().st_size, "sha256": sha256_of(w.path),
                        "how": w.how})
    total = sum(e["size"] for e in entries)
    manifest = {
        "target": {"python_version": args.python_version, "platform": args.platform,
                   "platform_tags": platforms},
        "lock": {"file": args.lock.name, "sha256": hashlib.sha256(lock_text.encode()).hexdigest(),
                 "packages": len(pins)},
        "wheels": entries,
        "on_target": [{"name": n, "version": v, "locked": pins[n]}
                      for n, v in sorted(present.items())],
        "wheels_size": total,
    }
    inner = stage / "manifest.json"
    inner.write_text(json.dumps(manifest, indent=1) + "\n")
    reqs = stage / "requirements.txt"
    reqs.write_text("".join(f"{e['name']}=={e['version']}\n" for e in entries))
    files = [(inner, "wheelhouse/manifest.json"), (reqs, "wheelhouse/requirements.txt")]
    files += [(w.path, f"wheelhouse/wheels/{w.path.name}") for w in wheels]
    writer = pack(out, files, args.part_size)
    manifest["tar"] = {"size": writer.size, "sha256": writer.total.hexdigest()}
    manifest["part_size"] = args.part_size
    manifest["parts"] = writer.parts
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "SHA256SUMS").write_text("".join(f"{p['sha256']}  {p['file']}\n"
                                            for p in writer.parts))
    shutil.copyfile(INSTALLER, out / INSTALLER.name)
    os.chmod(out / INSTALLER.name, 0o755)
    if not args.keep_wheels:
        shutil.rmtree(stage)

    big = sorted((e for e in entries if e["size"] > BIG_WHEEL), key=lambda e: -e["size"])
    built = [e["file"] for e in entries if e["how"] != "downloaded"]
    print(f"wheelhouse: {len(entries)} wheels, {mb(total)}; tar {mb(writer.size)} in "
          f"{len(writer.parts)} parts of at most {args.part_size / 2**20:g} MiB in {out}")
    if built:
        print(f"  built here from source distributions: {', '.join(built)}")
    print(f"  wheels over {mb(BIG_WHEEL)}: {len(big)}")
    for e in big:
        print(f"    {mb(e['size']):>12}  {e['file']}")
    print(f"wheelhouse: {time.monotonic() - start:.0f} s; on the target: "
          f"bash {out.name}/{INSTALLER.name} {out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
