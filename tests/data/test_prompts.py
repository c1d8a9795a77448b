"""Column mapping, templates and ground-truth extraction."""

from __future__ import annotations

import pytest

from rl_pipeline.data.prompts import (
    DataError,
    chat_messages,
    extract_ground_truth,
    extract_work_frame,
    to_verl_frame,
)
from rl_pipeline.data.records import RawRecords
from rl_pipeline.params import ConfigError, DataPrepParams


def _raw(records: list[dict], source: str = "in.jsonl") -> RawRecords:
    return RawRecords(source=source, records=records, lines=list(range(1, len(records) + 1)))


@pytest.mark.parametrize(("answer", "expected"), [
    ("Step one.\n#### 72", "72"),
    ("so #### 1,234,567", "1234567"),
    ("#### -3.5", "-3.5"),
    ("no marker 42", None),
    # A full stop or comma ends the sentence, not the number ('72.' scored no response right).
    ("The answer:\n#### 72.", "72"),
    ("#### 1,000. Done", "1000"),
    ("#### 5 apples", "5"),
    # verl's pattern read these as '1': GSM8K's scorer cannot read their number whole.
    ("#### 1/2", None),
    ("#### 1e5", None),
    ("#### 72%", None),
])
def test_gsm8k_ground_truth_is_the_number_after_hashes(answer: str, expected: str | None) -> None:
    params = DataPrepParams(answer_extraction="gsm8k")
    assert extract_ground_truth(answer, params) == expected


def test_whole_and_regex_extraction() -> None:
    assert extract_ground_truth("  B  ", DataPrepParams(answer_extraction="whole")) == "B"
    params = DataPrepParams(answer_extraction="regex", answer_regex=r"\\boxed\{([^}]*)\}")
    assert extract_ground_truth(r"so \boxed{17}", params) == "17"
    assert extract_ground_truth("nothing", params) is None


def test_template_over_several_fields_and_system_prompt() -> None:
    params = DataPrepParams(prompt_template="{Body} {Question}", answer_column="Answer",
                            system_prompt="Be brief.", instruction="Answer after ####.")
    raw = _raw([{"Body": "Tom has 3 apples.", "Question": "How many?", "Answer": 3}])
    work, dropped, bad, _ = extract_work_frame(raw, params, "images")
    assert not dropped and not bad
    assert work.loc[0, "question"] == "Tom has 3 apples. How many?"
    assert work.loc[0, "ground_truth"] == "3"
    assert chat_messages(work.loc[0, "question"], params) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tom has 3 apples. How many? Answer after ####."},
    ]


def test_missing_column_names_it_and_lists_the_columns_found() -> None:
    params = DataPrepParams()  # spec default prompt column: "problem"
    with pytest.raises(DataError) as err:
        extract_work_frame(_raw([{"question": "q", "answer": "a"}], "gsm.jsonl"), params,
                           "images")
    message = str(err.value)
    assert "gsm.jsonl" in message and "'problem'" in message
    assert "columns found: answer, question" in message


def test_field_missing_from_some_records_makes_them_bad_records() -> None:
    params = DataPrepParams(dataset_prompt_column="question")
    raw = _raw([{"question": "q1", "answer": "a"}, {"answer": "b"}])
    work, _, bad, _ = extract_work_frame(raw, params, "images")
    assert len(work) == 1
    assert len(bad) == 1 and bad[0].line == 2 and "missing field(s) question" in bad[0].reason


@pytest.mark.parametrize(("question", "found"), [
    (12345, "int (12345)"),
    (1.5, "float (1.5)"),
    (True, "bool (True)"),
    (None, "null"),
    (["What", "is 2+2?"], "list (['What', 'is 2+2?'])"),
    ({"text": "What is 2+2?"}, "dict ({'text': 'What is 2+2?'})"),
])
def test_a_prompt_field_that_is_not_a_string_makes_a_bad_record(question, found) -> None:
    params = DataPrepParams(dataset_prompt_column="question")
    raw = _raw([{"question": "q1", "answer": "a"}, {"question": question, "answer": "b"}])
    work, dropped, bad, _ = extract_work_frame(raw, params, "images")
    assert list(work["question"]) == ["q1"] and not dropped
    assert [b.describe() for b in bad] == [
        f"in.jsonl, line 2: field 'question' is {found}, expected a string"]


def test_template_fields_and_answer_are_type_checked_too() -> None:
    params = DataPrepParams(prompt_template="{Body} {Question}", answer_column="Answer")
    raw = _raw([{"Body": "Tom has 3.", "Question": 3, "Answer": False},
                {"Body": "x" * 60, "Question": "How many?", "Answer": 2.0},
                {"Body": "Ann has 2.", "Question": "How many?", "Answer": 2}])
    work, _, bad, _ = extract_work_frame(raw, params, "images")
    assert [b.reason for b in bad] == [
        "field 'Question' is int (3), expected a string; "
        "field 'Answer' is bool (False), expected a string or an integer",
        "field 'Answer' is float (2.0), expected a string or an integer"]
    # An integer answer is exact as text: Hugging Face math sets store answers as int64.
    assert list(work["ground_truth"]) == ["2"] and list(work["answer"]) == ["2"]


def test_a_long_mistyped_value_is_shortened_in_the_message() -> None:
    params = DataPrepParams(dataset_prompt_column="question")
    work, _, bad, _ = extract_work_frame(_raw([{"question": list(range(100)), "answer": "a"}]),
                                      params, "images")
    assert work.empty
    assert bad[0].reason.startswith("field 'question' is list ([0, 1, 2, 3")
    assert "...), expected a string" in bad[0].reason and len(bad[0].reason) < 100


def test_empty_prompt_and_missing_ground_truth_are_dropped_with_reasons() -> None:
    params = DataPrepParams(dataset_prompt_column="question", answer_extraction="gsm8k")
    raw = _raw([{"question": "  ", "answer": "#### 1"},
                {"question": "ok", "answer": "no number"},
                {"question": "fine", "answer": "#### 2"}])
    work, dropped, _, filtered = extract_work_frame(raw, params, "images")
    assert list(work["question"]) == ["fine"]
    assert dropped == {"empty_prompt": 1, "no_ground_truth": 1}
    # Each named by where it is and why, for the report (the counts alone named neither).
    assert [f.describe() for f in filtered] == [
        "in.jsonl, line 1: empty_prompt: field(s) question hold no text",
        "in.jsonl, line 2: no_ground_truth: field 'answer' is 'no number', expected a "
        "'#### <number>' line whose number is plain (72, -3, 1,000, 3.5) and ends at a space "
        "or the line's end (answer_extraction 'gsm8k')"]


def test_empty_input_says_so() -> None:
    with pytest.raises(DataError, match="empty.jsonl: the input is empty"):
        extract_work_frame(_raw([], "empty.jsonl"), DataPrepParams(), "images")


def test_verl_schema_and_images_column() -> None:
    params = DataPrepParams(dataset_prompt_column="q", answer_column="a",
                            data_source="geo", ability="vision")
    images = [{"bytes": b"\x89PNG", "path": None}]
    raw = _raw([{"q": "<image>What angle?", "a": "30", "images": images}])
    work, _, _, _ = extract_work_frame(raw, params, "images")
    frame = to_verl_frame(work, params, "train", "images")
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model",
                                   "extra_info", "images"]
    row = frame.iloc[0]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "30"}
    assert row["extra_info"] == {"split": "train", "index": 0, "question": "<image>What angle?",
                                 "answer": "30"}
    assert row["images"] == images


def test_an_images_field_that_is_not_a_list_makes_a_bad_record() -> None:
    """One record's images a number: the parquet save of its split failed after the other
    split's had been saved, with pyarrow's "cannot mix list and non-list" and no line."""
    params = DataPrepParams(dataset_prompt_column="q", answer_column="a")
    images = [{"bytes": b"\x89PNG", "path": None}]
    raw = _raw([{"q": "a?", "a": "1", "images": images}, {"q": "b?", "a": "2", "images": 5},
                {"q": "c?", "a": "3", "images": None}])
    work, _, bad, _ = extract_work_frame(raw, params, "images")
    assert list(work["q" if "q" in work else "question"]) == ["a?", "c?"]
    assert [b.describe() for b in bad] == [
        "in.jsonl, line 2: field 'images' is int (5), expected a list of images (or null), as "
        "verl's multimodal data holds them"]


def test_text_only_data_has_no_image_column() -> None:
    params = DataPrepParams(dataset_prompt_column="q", answer_column="a")
    work, _, _, _ = extract_work_frame(_raw([{"q": "x", "a": "1"}]), params, "images")
    assert "images" not in to_verl_frame(work, params, "val", "images").columns


def test_few_shot_examples_come_first_as_earlier_chat_turns() -> None:
    params = DataPrepParams(system_prompt="Be brief.", instruction='End with "#### <number>".',
                            few_shot=[{"question": "What is 7 + 25?",
                                       "answer": "7 + 25 = 32\n#### 32"}])
    assert chat_messages("What is 57 + 26?", params) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": 'What is 7 + 25? End with "#### <number>".'},
        {"role": "assistant", "content": "7 + 25 = 32\n#### 32"},
        {"role": "user", "content": 'What is 57 + 26? End with "#### <number>".'}]
    with pytest.raises(ConfigError, match=r"data_prep.few_shot.0.answer"):
        DataPrepParams.model_validate({"few_shot": [{"question": "q", "answer": ""}]})
