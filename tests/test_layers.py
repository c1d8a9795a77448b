"""The package layering, read from every import in the source (function-level ones included):
the parameters import nothing above them, no engine imports another, and train and merge
meet only in the neutral training-result record."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "rl_pipeline"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each project module and the project modules it imports (anywhere in its body)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        module, names = _module(path), set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module
                if node.level:  # relative: from .nodes import x
                    package = module.split(".")[:len(module.split(".")) - node.level
                                                 + (path.name == "__init__.py")]
                    base = ".".join([*package, node.module])
                names |= {base, *(f"{base}.{a.name}" for a in node.names)}
        found[module] = {n for n in names if n.startswith("rl_pipeline")}
    return found


IMPORTS = _imports()


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(importers: str, imported: str) -> list[str]:
    return sorted(f"{m} imports {n}" for m, names in IMPORTS.items() if _under(m, importers)
                  for n in names if _under(n, imported))


def test_the_imports_were_read() -> None:
    # Guards the checks below against passing on an empty reading.
    assert "rl_pipeline.engines.verl.engine" in IMPORTS
    assert "rl_pipeline.engines.base" in IMPORTS["rl_pipeline.engines.verl.engine"]
    assert "rl_pipeline.merge.standalone" in IMPORTS["rl_pipeline.pipelines.merge.nodes"]


@pytest.mark.parametrize(("importers", "imported"), [
    ("rl_pipeline.engines.verl", "rl_pipeline.engines.trl"),
    ("rl_pipeline.engines.trl", "rl_pipeline.engines.verl"),
    # train and merge meet only in rl_pipeline.training_result
    ("rl_pipeline.engines", "rl_pipeline.merge"),
    ("rl_pipeline.engines", "rl_pipeline.pipelines"),
    ("rl_pipeline.pipelines.train", "rl_pipeline.merge"),
    ("rl_pipeline.merge", "rl_pipeline.engines"),
    ("rl_pipeline.pipelines.merge", "rl_pipeline.engines"),
    ("rl_pipeline.pipelines.merge", "rl_pipeline.pipelines.train"),
    ("rl_pipeline.pipelines.train", "rl_pipeline.pipelines.merge"),
])
def test_no_import_crosses(importers: str, imported: str) -> None:
    assert _violations(importers, imported) == []


# The bottom layer: modules that import nothing of the project's but the errors' base class.
BOTTOM = ("rl_pipeline.errors",)


@pytest.mark.parametrize("package", ["rl_pipeline.errors", "rl_pipeline.params",
                                     "rl_pipeline.training_result"])
def test_the_lowest_layers_import_nothing_above_them(package: str) -> None:
    above = sorted(f"{m} imports {n}" for m, names in IMPORTS.items() if _under(m, package)
                   for n in names
                   if not _under(n, package) and not any(_under(n, b) for b in BOTTOM))
    assert above == []


def test_the_engines_core_imports_no_engine() -> None:
    core = {m for m in IMPORTS if _under(m, "rl_pipeline.engines")
            and not _under(m, "rl_pipeline.engines.verl")
            and not _under(m, "rl_pipeline.engines.trl")}
    assert "rl_pipeline.engines.lookup" in core
    crossing = sorted(f"{m} imports {n}" for m in core for n in IMPORTS[m]
                      if _under(n, "rl_pipeline.engines.verl")
                      or _under(n, "rl_pipeline.engines.trl"))
    assert crossing == []


def test_the_lookup_names_each_engine_package() -> None:
    """An engine is found by name, through the lookup's import path, not by an import."""
    from rl_pipeline.params.train import ENGINES

    assert {name: target.split(":")[0] for name, target in ENGINES.items()} == {
        "verl": "rl_pipeline.engines.verl.engine", "trl": "rl_pipeline.engines.trl.engine"}
    for target in ENGINES.values():
        assert target.split(":")[0] in IMPORTS


def test_no_test_module_imports_another() -> None:
    """Shared test code lives in helper modules (tests/conftest.py, tests/projects.py, ...),
    so that a test module can be read, run and deleted alone."""
    tests = PACKAGE.parents[1] / "tests"
    crossing = []
    for path in tests.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            crossing += [f"{path.relative_to(tests)} imports {n}" for n in names
                         if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")]
    assert crossing == []
