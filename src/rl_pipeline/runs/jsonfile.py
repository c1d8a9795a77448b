"""The small JSON files the stages leave for each other (run identities, training runs,
model and merge metadata): read forgivingly, written whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_pipeline.runs.staging import staged


def read_object(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when the file is missing, unreadable or holds
    something else (callers then treat it as not recorded)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_object(path: str | Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON at ``path``: the old file or the new one, never half of one."""
    with staged(path) as staging:
        staging.write_text(json.dumps(data, indent=2))
