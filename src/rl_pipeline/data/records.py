"""Raw records as they come from a file or a Hugging Face dataset, with their provenance.

JSONL is read line by line by hand rather than with ``pandas.read_json``: only a line
reader can say which line of which file is broken, accept a BOM and CRLF endings, and
carry on past a bad line when the user asks it to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class BadRecord:
    """A line or row that could not be read; ``line`` is 1-based."""

    source: str
    line: int
    reason: str
    unit: str = "line"

    def describe(self) -> str:
        return f"{self.source}, {self.unit} {self.line}: {self.reason}"


@dataclass
class RawRecords:
    """Records of one input, each with the line (JSONL) or row number (datasets) it came from."""

    source: str
    records: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    bad: list[BadRecord] = field(default_factory=list)
    unit: str = "line"

    @property
    def origin(self) -> str:
        """Where a record came from, short of its number: ``train.jsonl, line``."""
        return f"{self.source}, {self.unit}"

    def __len__(self) -> int:
        return len(self.records)


def read_jsonl(path: str | Path) -> RawRecords:
    """Read a JSON Lines file, recording each unreadable line instead of stopping at it.

    Blank lines are ignored. A UTF-8 BOM and CRLF line endings are accepted.
    """
    path = Path(path)
    data = path.read_bytes()
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    out = RawRecords(source=str(path))
    for number, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            out.bad.append(BadRecord(
                out.source, number,
                f"bytes that are not UTF-8 at column {exc.start + 1} ({raw[exc.start:exc.end]!r})",
            ))
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            # json's "Unterminated string starting at" names its column itself.
            at = "" if exc.msg.endswith(" at") else " at"
            out.bad.append(BadRecord(out.source, number, f"malformed JSON: {exc.msg}{at} "
                                     f"column {exc.colno}"))
            continue
        if not isinstance(record, dict):
            out.bad.append(BadRecord(out.source, number, "expected a JSON object, found "
                                     f"{type(record).__name__}"))
            continue
        out.records.append(record)
        out.lines.append(number)
    return out
