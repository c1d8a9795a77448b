"""Reading JSONL robustly: every bad line is named by file and line number."""

from __future__ import annotations

from pathlib import Path

from rl_pipeline.data.records import read_jsonl


def test_reads_records_with_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"q": "one"}\n\n{"q": "two"}\n', encoding="utf-8")
    raw = read_jsonl(path)
    assert raw.records == [{"q": "one"}, {"q": "two"}]
    assert raw.lines == [1, 3]  # the blank line is skipped but still counted
    assert raw.bad == []


def test_accepts_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"q": "caf\xc3\xa9"}\r\n{"q": "two"}\r\n')
    raw = read_jsonl(path)
    assert raw.records == [{"q": "café"}, {"q": "two"}]
    assert raw.bad == []


def test_malformed_json_is_recorded_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"q": "ok"}\n{"q": "broken"\n{"q": "ok again"}\n', encoding="utf-8")
    raw = read_jsonl(path)
    assert [r["q"] for r in raw.records] == ["ok", "ok again"]
    assert len(raw.bad) == 1
    message = raw.bad[0].describe()
    assert str(path) in message and "line 2" in message and "malformed JSON" in message


def test_an_unterminated_string_names_the_column_it_starts_at_once(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    path.write_text('{"q": "cut off\n', encoding="utf-8")
    assert read_jsonl(path).bad[0].describe() == (
        f"{path}, line 1: malformed JSON: Unterminated string starting at column 7")


def test_undecodable_bytes_are_recorded_with_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"q": "fine"}\n{"q": "caf\xe9"}\n')
    raw = read_jsonl(path)
    assert len(raw.records) == 1
    message = raw.bad[0].describe()
    # Byte columns are 1-based: the é byte is the 11th.
    assert "line 2" in message and "not UTF-8" in message and "column 11" in message


def test_a_json_value_that_is_not_an_object_is_bad(tmp_path: Path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text('[1, 2]\n"text"\n', encoding="utf-8")
    raw = read_jsonl(path)
    assert raw.records == []
    assert [b.line for b in raw.bad] == [1, 2]
    assert "expected a JSON object, found list" in raw.bad[0].reason
