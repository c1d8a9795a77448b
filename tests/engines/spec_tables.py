"""Reading parameter names and defaults out of the component specs' Markdown tables."""

from __future__ import annotations

import re

from tests.conftest import PROJECT_ROOT

SPEC = PROJECT_ROOT.parent / "shared" / "spec"


def spec_defaults(name: str) -> dict[str, str]:
    """Parameter name -> default, from a component spec's Markdown tables."""
    rows = {}
    for line in (SPEC / name).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"[A-Za-z_]+", cells[0]) and cells[0] != "Name":
            rows[cells[0]] = cells[3]
    return rows


def same_default(default: str, value) -> bool:
    """Whether our value equals the spec's default as written in its table ('-': none)."""
    if default == "-":
        return value is None
    if isinstance(value, bool):
        return default.lower() == str(value).lower()
    if isinstance(value, int | float):
        return float(default) == float(value)
    return default == str(value)
