"""Import modules in this interpreter (a venv built like the box): what is missing, and what
was only looked for.

    python scripts/import_probe.py --json out.json \
        [--stand-in vllm._C_stable_libtorch ...] [--platform vllm.platforms.cuda.CudaPlatform] \
        [--capability 9.0] [--absent vllm._C_stable_libtorch] MODULE [MODULE ...]

A finder last on the meta path records every top-level module that no finder found, with
the file and line that asked. Each MODULE is then imported in turn, in this one process, and
reported as
    ok        imported; the modules looked for and not found on the way ("guarded") were
              optional: an import in a try block or an availability check
    missing   failed with ModuleNotFoundError: the module, and the file and line importing it
    error     failed otherwise (its exception)

--stand-in: native extensions that cannot load on this machine (vLLM's CUDA kernels against
a CPU torch of another version) become empty modules where their real import fails, so that
the Python that imports them can be traced; each is reported with the reason it failed.
--stub-ops: the torch.ops namespaces those extensions register; an op asked for at import
time answers None (each recorded). Both stand in for the GPU, never for a package: a module
of a distribution that is not installed stays missing.
--absent: a module that is not there, as on a box where the upload that carries it has not
arrived: importing it raises ModuleNotFoundError. A stand-in cannot say whether the Python
needs its extension (an unguarded import, or a try block whose handler raises anyway: both
happened on the lent H100); a probe with it absent can.
--platform: a class set as vLLM's `current_platform` first, so that import-time branches on
the platform take the box's (CUDA) side; --capability: the compute capability it reports
(vLLM picks kernels by it at import time; 9.0 is the H100's).

Standard library only at module level (it runs on the interpreter under test).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import sys
import traceback
import types
from pathlib import Path
from typing import Any


class Recorder(importlib.abc.MetaPathFinder):
    """Last on the meta path: asked only about modules no finder found; records them."""

    def __init__(self) -> None:
        self.tried: list[dict[str, Any]] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if "." not in name:
            self.tried.append({"module": name, "by": _importer()})
        return None


def _importer() -> str:
    """file:line of the frame whose import statement reached the gate."""
    for frame, line in traceback.walk_stack(None):
        file = frame.f_code.co_filename
        if "importlib" not in file and not file.startswith("<frozen") and \
                Path(file).name != "import_probe.py":
            return f"{file}:{line}"
    return "?"


class StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on the meta path, for the named native extensions only: the real extension is
    loaded if it can be; if it is there but cannot load (CUDA kernels on a CPU torch), an
    empty module takes its place and the reason is recorded."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)
        self.reasons: dict[str, str] = {}
        self.real: dict[str, Any] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.names:
            return None
        from importlib.machinery import PathFinder

        real = PathFinder.find_spec(name, path)
        if real is None:
            self.reasons[name] = "missing"
            return None
        self.real[name] = real
        return importlib.util.spec_from_loader(name, self, origin=real.origin)

    def create_module(self, spec: Any) -> types.ModuleType:
        real = self.real[spec.name]
        try:
            module = importlib.util.module_from_spec(real)
            real.loader.exec_module(module)
            self.reasons[spec.name] = "loaded"
            return module
        except ImportError as exc:
            self.reasons[spec.name] = f"stood in: {str(exc).splitlines()[0][:300]}"
            return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class Absent(importlib.abc.MetaPathFinder):
    """First on the meta path: the named modules cannot be found."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (--absent)", name=name)
        return None


class _StubOp:
    """An op packet: calling it answers None; its overloads (`.default`) are itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> _StubOp:
        if name.startswith("__"):
            raise AttributeError(name)
        return self


def stub_ops(namespaces: list[str], asked: list[str]) -> None:
    """torch.ops.<namespace>.<op> that the stood-in extensions would have registered answer
    a function returning None, and each op asked for is recorded: vLLM queries a few at
    import time (e.g. whether cutlass supports fp8)."""
    from torch import _ops

    original = _ops._OpNamespace.__getattr__

    def getattr_(self: Any, op: str) -> Any:
        try:
            return original(self, op)
        except AttributeError:
            if self.name not in namespaces:
                raise
            asked.append(f"{self.name}.{op}")
            return _StubOp()

    _ops._OpNamespace.__getattr__ = getattr_

    import torch.library

    register_fake = torch.library.register_fake

    def register_fake_(op: Any, fn: Any = None, /, **kwargs: Any) -> Any:
        # vLLM registers fake (meta) versions of its kernels at import: for a stood-in
        # namespace there is no real op to attach one to.
        if not (isinstance(op, str) and op.split("::")[0] in namespaces):
            return register_fake(op, fn, **kwargs)

        def attach(f: Any) -> Any:
            try:
                return register_fake(op, f, **kwargs)
            except RuntimeError:
                asked.append(f"{op} (fake)")
                return f

        return attach(fn) if fn is not None else attach

    torch.library.register_fake = register_fake_


def probe(modules: list[str], stand_ins: list[str], platform: str | None,
          capability: str | None = None, op_namespaces: list[str] | None = None,
          absent: list[str] | None = None) -> dict[str, Any]:
    absent = absent or []
    gate = Recorder()
    sys.meta_path.append(gate)
    result: dict[str, Any] = {"python": sys.version.split()[0], "stand_ins": {},
                              "modules": {}, "absent": sorted(absent)}
    stand = StandIn(stand_ins)
    sys.meta_path.insert(0, stand)
    sys.meta_path.insert(0, Absent(absent))  # ahead of the stand-ins: absent wins
    asked: list[str] = []
    if op_namespaces:
        stub_ops(op_namespaces, asked)
    if platform:
        module, _, cls = platform.rpartition(".")
        try:
            import vllm.platforms as platforms  # type: ignore[import-not-found]

            platform_cls = getattr(importlib.import_module(module), cls)
            if capability:  # vLLM asks the GPU's compute capability at import in places
                from vllm.platforms.interface import (  # type: ignore[import-not-found]
                    DeviceCapability,
                )

                major, minor = (int(x) for x in capability.split("."))
                platform_cls.get_device_capability = classmethod(
                    lambda _cls, device_id=0: DeviceCapability(major, minor))
            platforms.current_platform = platform_cls()
            result["platform"] = platform + (f" (compute capability {capability})"
                                             if capability else "")
        except Exception as exc:  # noqa: BLE001 (whatever the platform's import raises)
            # On the box vLLM resolves this platform as it is first used: every module that
            # uses vLLM fails there as this did (without it, vLLM's own detection finds no
            # GPU here and everything imports).
            result["platform"] = f"not set: {type(exc).__name__}: {exc}"
            for name in modules:
                result["modules"][name] = {
                    "status": "error", "guarded": [], "at": _origin(exc),
                    "error": f"the platform {platform} does not import: "
                             f"{type(exc).__name__}: {exc}"[:500]}
            modules = []
    for name in modules:
        before = len(gate.tried)
        entry: dict[str, Any]
        try:
            importlib.import_module(name)
            entry = {"status": "ok"}
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if missing in sys.modules or not exc.name:  # a submodule its package lacks
                entry = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500],
                         "at": _origin(exc), "guarded": []}
                result["modules"][name] = entry
                continue
            tried = [r for r in gate.tried[before:] if r["module"] == missing]
            entry = {"status": "missing", "module": missing,
                     "by": tried[-1]["by"] if tried else _origin(exc),
                     "message": str(exc)}
        except BaseException as exc:  # noqa: BLE001 (a module may raise anything at import)
            entry = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500],
                     "at": _origin(exc)}
        entry["guarded"] = sorted({r["module"] for r in gate.tried[before:]}
                                  - {entry.get("module")})
        result["modules"][name] = entry
    result["tried"] = gate.tried
    result["loaded_files"] = sorted({f for m in list(sys.modules.values())
                                     if isinstance(f := getattr(m, "__file__", None), str)
                                     and f.endswith(".py")})
    result["stand_ins"] = stand.reasons
    result["ops_asked"] = sorted(set(asked))
    return result


def _origin(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [f for f in frames if "importlib" not in f.filename
               and not f.filename.startswith("<frozen")
               and Path(f.filename).name != "import_probe.py"]
    last = (outside or frames or [None])[-1]
    return f"{last.filename}:{last.lineno}" if last else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--stand-in", action="append", default=[])
    parser.add_argument("--stub-ops", action="append", default=[],
                        help="a torch.ops namespace the stood-in extensions register")
    parser.add_argument("--absent", action="append", default=[],
                        help="a module to treat as not there (its upload not yet arrived)")
    parser.add_argument("--platform")
    parser.add_argument("--capability", help="the GPU's compute capability the platform "
                        "reports, e.g. 9.0 (Hopper): vLLM asks it at import in places")
    args = parser.parse_args(argv)
    result = probe(args.modules, args.stand_in, args.platform, args.capability,
                   args.stub_ops, args.absent)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    bad = [m for m, e in result["modules"].items() if e["status"] != "ok"]
    print(f"import_probe: {len(args.modules) - len(bad)} of {len(args.modules)} imported"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
