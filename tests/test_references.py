"""Paths the docs and the code name for a reader to open exist: a test or script that moved
leaves no pointer behind."""

from __future__ import annotations

import re

from tests.conftest import PROJECT_ROOT

# tests/... or scripts/... files, as the docs and docstrings name them (a ::test suffix allowed)
_PATH = re.compile(r"(?<![\w/.])((?:tests|scripts|benchmarks)/[\w/]+\.(?:py|sh))")


def test_every_test_script_and_benchmark_named_exists() -> None:
    texts = [*PROJECT_ROOT.glob("docs/**/*.md"), PROJECT_ROOT / "README.md",
             *(PROJECT_ROOT / "src").rglob("*.py"), *(PROJECT_ROOT / "scripts").glob("*")]
    named = {(path.relative_to(PROJECT_ROOT), name) for path in texts if path.is_file()
             for name in _PATH.findall(path.read_text(encoding="utf-8"))}
    assert len(named) > 50  # the reading found them
    missing = sorted(f"{path}: {name}" for path, name in named
                     if not (PROJECT_ROOT / name).exists())
    assert missing == []
