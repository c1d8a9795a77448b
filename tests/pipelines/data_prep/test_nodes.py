"""data_prep nodes called directly: hygiene, bad input, overlong prompts, report."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from rl_pipeline.data.prompts import DataError, chat_messages
from rl_pipeline.data.records import read_jsonl
from rl_pipeline.params import ConfigError, DataParams, DataPrepParams, RewardParams
from rl_pipeline.pipelines.data_prep.nodes import (
    check_reward,
    clean_prompt_splits,
    fit_prompt_lengths,
    report_data_prep,
)
from tests.conftest import read_gsm8k, write_jsonl


@pytest.fixture
def gsm_files(tmp_path: Path) -> tuple[Path, Path]:
    records = read_gsm8k(n=60)
    return (write_jsonl(tmp_path / "train.jsonl", records[:50]),
            write_jsonl(tmp_path / "val.jsonl", records[50:]))


def _run_all(train: Path, val: Path | None, tokenizer_dir: Path, prep: dict, data: dict):
    prep, data = DataPrepParams.model_validate(prep), DataParams.model_validate(data)
    train_work, val_work, hygiene = clean_prompt_splits(
        read_jsonl(train), read_jsonl(val) if val else None, prep, data)
    train_p, val_p, lengths = fit_prompt_lengths(train_work, val_work, hygiene,
                                                  str(tokenizer_dir), prep, data)
    train_p, val_p, self_test = check_reward(train_p, val_p, RewardParams())
    report, metrics, figure = report_data_prep(hygiene, lengths, self_test, data, prep)
    return train_p, val_p, report, metrics, figure


def test_clean_run_keeps_every_row_with_gsm8k_ground_truths(gsm_files, tokenizer_dir,
                                                            prep_params, data_params) -> None:
    train_p, val_p, report, metrics, figure = _run_all(*gsm_files, tokenizer_dir,
                                                       prep_params, data_params)
    assert (len(train_p), len(val_p)) == (50, 10)
    answers = [r["answer"] for r in read_gsm8k(n=50)]
    assert [gt["ground_truth"] for gt in train_p["reward_model"]] == [
        a.split("#### ")[-1].replace(",", "") for a in answers]
    assert report["rows_in"] == {"train": 50, "val": 10, "total": 60}
    assert set(report["dropped"].values()) == {0}
    assert report["prompt_tokens"]["train"]["sampled"] is False
    assert metrics["rows_out.train"] == {"value": 50.0, "step": 0}
    assert metrics["prompt_tokens.val.p99"]["value"] > 0
    assert isinstance(figure, Figure)


def test_duplicates_and_overlap_are_dropped_and_counted(tmp_path, tokenizer_dir, prep_params,
                                                        data_params) -> None:
    records = read_gsm8k(n=20)
    train = write_jsonl(tmp_path / "t.jsonl", records[:15] + records[:3] + records[16:18])
    val = write_jsonl(tmp_path / "v.jsonl", records[15:18])
    train_p, _, report, _, _ = _run_all(train, val, tokenizer_dir, prep_params, data_params)
    assert report["dropped_by_split"]["train"]["duplicate_prompt"] == 3
    assert report["train_val_overlap"] == 2  # records 16 and 17 are in both
    assert report["dropped_by_split"]["train"]["train_val_overlap"] == 2
    assert len(train_p) == 15

    kept = _run_all(train, val, tokenizer_dir, {**prep_params, "drop_train_val_overlap": False},
                    data_params)[0]
    assert len(kept) == 17


def test_no_validation_input_splits_a_seeded_fraction_off_train(gsm_files, tokenizer_dir,
                                                                prep_params, data_params) -> None:
    params = {**prep_params, "val_fraction": 0.2, "seed": 7}
    first = _run_all(gsm_files[0], None, tokenizer_dir, params, data_params)
    again = _run_all(gsm_files[0], None, tokenizer_dir, params, data_params)
    assert (len(first[0]), len(first[1])) == (40, 10)
    assert list(first[1]["extra_info"]) == list(again[1]["extra_info"])
    assert first[2]["val_source"].startswith("split from train")
    # Where the records came from, and how many became validation, for a reviewer.
    assert first[2]["train_source"] == str(gsm_files[0]) and first[2]["val_split_off"] == 10
    questions = {e["question"] for e in first[0]["extra_info"]}
    assert questions.isdisjoint(e["question"] for e in first[1]["extra_info"])


def test_a_validation_input_without_the_templates_fields_says_it_is_the_validation_input(
        gsm_files, tmp_path, prep_params, data_params) -> None:
    """Only dataset_train_split set: the catalog's default validation input (GSM8K's) lacks
    the user's fields, so the error names that input and the two ways on."""
    train = write_jsonl(tmp_path / "posts.jsonl", [
        {"Body": f"Tom has {i} apples.", "Question": "How many?", "answer": f"#### {i}"}
        for i in range(10)])
    params = DataPrepParams.model_validate({**prep_params,
                                            "prompt_template": "{Body} {Question}"})
    data = DataParams.model_validate(data_params)
    with pytest.raises(DataError) as err:
        clean_prompt_splits(read_jsonl(train), read_jsonl(gsm_files[1]), params, data)
    message = str(err.value)
    assert f"{gsm_files[1]}: column(s) 'Body', 'Question' not found" in message
    assert "not found in any record; columns found: answer, question. Set the data_prep " \
        "parameters (prompt_template, answer_column) to this dataset's columns. This is the " \
        "validation input (dataset_validation_split" in message
    assert "--params dataset_validation_split=" in message
    work, _, _ = clean_prompt_splits(read_jsonl(train), None, params, data)  # split off train
    assert work.loc[0, "question"] == "Tom has 0 apples. How many?"


def test_malformed_line_fails_naming_file_and_line(tmp_path, prep_params, data_params) -> None:
    path = tmp_path / "broken.jsonl"
    lines = [line for line in (Path(__file__).parents[3] / "data/01_raw/gsm8k/train.jsonl")
             .read_text().splitlines()[:5]]
    lines[3] = lines[3][:-5]  # cut the closing of line 4
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        clean_prompt_splits(read_jsonl(path), None, DataPrepParams.model_validate(prep_params),
                            DataParams.model_validate(data_params))
    assert f"{path}, line 4: malformed JSON" in str(err.value)
    assert "on_bad_record=skip" in str(err.value)


def test_a_file_that_is_not_json_lines_says_so(tmp_path, prep_params, data_params) -> None:
    """A CSV under a .jsonl name: a bad record per line, and advice (on_bad_record=skip)
    that would have dropped every one of them."""
    path = tmp_path / "table.jsonl"
    path.write_text("question,answer\nWhat is 1 + 1?,#### 2\nWhat is 2 + 2?,#### 4\n")
    with pytest.raises(DataError) as err:
        clean_prompt_splits(read_jsonl(path), None, DataPrepParams.model_validate(prep_params),
                            DataParams.model_validate(data_params))
    message = str(err.value)
    assert message.startswith(f"3 bad record(s) in {path}:\n  - {path}, line 1: malformed JSON")
    assert message.endswith("No line of it is a JSON object: it is not JSON Lines (one JSON "
                            "object per line). For a CSV, JSON or Parquet file, set "
                            "dataset_name to a folder that holds it (Hugging Face datasets "
                            "reads those).")
    assert "on_bad_record=skip" not in message


def test_bad_records_are_listed_in_the_order_of_their_lines(tmp_path, prep_params,
                                                             data_params) -> None:
    """Unreadable lines were listed before records missing a field, whatever their lines."""
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"question": "q1?", "answer": "#### 1"}\n{"answer": "#### 2"}\n'
                    '{"question": "q3?", "answer": "#### 3"}\n{not json\n')
    with pytest.raises(DataError) as err:
        clean_prompt_splits(read_jsonl(path), None, DataPrepParams.model_validate(prep_params),
                            DataParams.model_validate(data_params))
    message = str(err.value)
    assert message.index(f"{path}, line 2: missing field(s) question") < \
        message.index(f"{path}, line 4: malformed JSON")


def test_skip_drops_bad_lines_and_the_report_counts_them(tmp_path, tokenizer_dir, prep_params,
                                                         data_params) -> None:
    good = [f'{{"question": "q{i}?", "answer": "#### {i}"}}'.encode() for i in range(12)]
    lines = good[:4] + [b"{not json", b'{"question": "caf\xe9", "answer": "#### 1"}',
                        b'{"answer": "#### 5"}'] + good[4:]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    params = {**prep_params, "on_bad_record": "skip"}
    train_p, val_p, report, metrics, _ = _run_all(path, None, tokenizer_dir, params,
                                                  data_params)
    assert len(train_p) + len(val_p) == 12
    assert report["dropped"]["bad_record"] == 3
    assert metrics["dropped.bad_record"]["value"] == 3.0
    skipped = report["bad_records_skipped"]
    assert [s.split(": ")[0].rsplit(" ", 1)[-1] for s in skipped] == ["5", "6", "7"]
    assert "not UTF-8" in skipped[1] and "missing field(s) question" in skipped[2]


def test_rows_dropped_for_no_ground_truth_are_named_in_the_log_and_the_report(
        tmp_path, tokenizer_dir, prep_params, data_params, caplog) -> None:
    records = [{"question": f"q{i}?", "answer": f"#### {i}"} for i in range(12)]
    records[7]["answer"] = "ten"
    path = write_jsonl(tmp_path / "answers.jsonl", records)
    caplog.set_level("WARNING")
    _, _, report, _, _ = _run_all(path, None, tokenizer_dir, prep_params, data_params)
    why = (f"{path}, line 8: no_ground_truth: field 'answer' is 'ten', expected a "
           "'#### <number>' line whose number is plain (72, -3, 1,000, 3.5) and ends at a "
           "space or the line's end (answer_extraction 'gsm8k')")
    assert report["dropped"]["no_ground_truth"] == 1 and report["rows_filtered"] == [why]
    assert f"train: dropped 1 row(s) with no usable prompt or ground truth (the report lists " \
           f"them), e.g. {why}" in caplog.text


def test_nothing_left_after_cleaning_names_rows_reasons_and_parameters(tmp_path, prep_params,
                                                                       data_params) -> None:
    path = write_jsonl(tmp_path / "noanswers.jsonl",
                       [{"question": f"q{i}", "answer": "no number"} for i in range(5)]
                       + [{"question": "  ", "answer": "#### 1"}, {"question": 7, "answer": "1"}])
    params = DataPrepParams.model_validate({**prep_params, "on_bad_record": "skip"})
    with pytest.raises(DataError) as err:
        clean_prompt_splits(read_jsonl(path), None, params,
                            DataParams.model_validate(data_params))
    message = str(err.value)
    assert "no train prompts left: 7 train row(s) came in, dropped:" in message
    assert "    bad_record: 1 - " in message
    assert ("    no_ground_truth: 5 - no ground truth found by data_prep.answer_extraction="
            "'gsm8k' in answer_column='answer'") in message
    assert "    empty_prompt: 1 - empty text in the prompt field(s)" in message
    assert "val prompts" not in message  # no validation input: nothing to say about val


def _prompt_tokens(tokenizer, questions: list[str], params: DataPrepParams) -> list[int]:
    """Each prompt's tokens as verl counts them: the chat template with the generation prompt."""
    return [len(tokenizer.apply_chat_template(chat_messages(q, params), add_generation_prompt=True,
                                              tokenize=True)["input_ids"]) for q in questions]


def test_a_split_left_empty_by_the_length_filter_fails_counting_both_stages(
        tmp_path, tokenizer_dir, tokenizer, prep_params, data_params) -> None:
    records = read_gsm8k(n=60)
    train = write_jsonl(tmp_path / "train.jsonl", records[:50] + records[:3])  # 3 duplicates
    val = write_jsonl(tmp_path / "val.jsonl", records[50:])
    data = {**data_params, "data_max_prompt_length": 5}
    with pytest.raises(DataError) as err:
        _run_all(train, val, tokenizer_dir, prep_params, data)
    message = str(err.value)
    params = DataPrepParams.model_validate(prep_params)
    shortest = {split: min(_prompt_tokens(tokenizer, [r["question"] for r in rows], params))
                for split, rows in (("train", records[:50]), ("val", records[50:]))}
    assert message.startswith("every row of a split was dropped; nothing was written:")
    assert "no train prompts left: 53 train row(s) came in, dropped:" in message
    assert "    duplicate_prompt: 3 - " in message  # cleaning's drop, from data_prep_hygiene
    assert (f"    overlong_prompt: 50 - longer than data.data_max_prompt_length=5; the shortest "
            f"has {shortest['train']} tokens: raise it to at least {shortest['train']}, or "
            "shorten prompts instead with data.data_filter_overlong_prompts=false") in message
    assert "no val prompts left: 10 val row(s) came in, dropped:" in message
    assert (f"    overlong_prompt: 10 - longer than data.data_max_prompt_length=5; the shortest "
            f"has {shortest['val']} tokens") in message
    assert "bad_record" not in message  # reasons that dropped nothing are not listed


def test_an_empty_split_off_validation_says_where_its_rows_came_from(
        gsm_files, tokenizer_dir, prep_params, data_params) -> None:
    prep = DataPrepParams.model_validate({**prep_params, "val_fraction": 0.2})
    data = DataParams.model_validate({**data_params, "data_max_prompt_length": 5})
    train_work, val_work, hygiene = clean_prompt_splits(read_jsonl(gsm_files[0]), None, prep,
                                                        data)
    with pytest.raises(DataError) as err:
        fit_prompt_lengths(train_work, val_work, hygiene, str(tokenizer_dir), prep, data)
    message = str(err.value)
    assert ("no train prompts left: 50 train row(s) came in (10 of them split off as val), "
            "dropped:\n    overlong_prompt: 40 - ") in message
    assert ("no val prompts left: 10 val row(s) came in (split off train), dropped:\n"
            "    overlong_prompt: 10 - ") in message


def test_wrongly_typed_fields_fail_naming_file_line_field_and_types(tmp_path, prep_params,
                                                                   data_params) -> None:
    good = read_gsm8k(n=1)[0]
    path = write_jsonl(tmp_path / "train.jsonl", [
        good, {"question": 12345, "answer": "... #### 5"},
        {"question": "How many?", "answer": ["#### 1", "#### 2"]}])
    with pytest.raises(DataError) as err:
        clean_prompt_splits(read_jsonl(path), None, DataPrepParams.model_validate(prep_params),
                            DataParams.model_validate(data_params))
    message = str(err.value)
    assert f"2 bad record(s) in {path}:" in message
    assert f"{path}, line 2: field 'question' is int (12345), expected a string" in message
    assert (f"{path}, line 3: field 'answer' is list (['#### 1', '#### 2']), expected a string "
            "or an integer") in message
    assert "on_bad_record=skip" in message


def test_skip_drops_wrongly_typed_records_and_the_report_counts_them(
        tmp_path, tokenizer_dir, prep_params, data_params) -> None:
    records = read_gsm8k(n=11)
    train = write_jsonl(tmp_path / "train.jsonl", [
        records[0], {"question": 12345, "answer": "... #### 5"},
        {"question": "How many?", "answer": ["#### 1", "#### 2"]}])
    val = write_jsonl(tmp_path / "val.jsonl", records[1:])
    params = {**prep_params, "on_bad_record": "skip"}
    train_p, val_p, report, _, _ = _run_all(train, val, tokenizer_dir, params, data_params)
    assert list(train_p["extra_info"].map(lambda e: e["question"])) == [records[0]["question"]]
    assert len(val_p) == 10
    assert report["rows_in"]["train"] == 3
    assert report["dropped_by_split"]["train"]["bad_record"] == 2
    assert report["bad_records_skipped"] == [
        f"{train}, line 2: field 'question' is int (12345), expected a string",
        f"{train}, line 3: field 'answer' is list (['#### 1', '#### 2']), expected a string "
        "or an integer"]


def test_overlong_prompts_are_dropped_and_counted(gsm_files, tokenizer_dir, tokenizer,
                                                  prep_params, data_params) -> None:
    limit = 150
    data = {**data_params, "data_max_prompt_length": limit}
    train_p, _, report, _, _ = _run_all(*gsm_files, tokenizer_dir, prep_params, data)
    # Independent count: the chat template applied to each prompt, as verl does it.
    params = DataPrepParams.model_validate(prep_params)
    lengths = [len(tokenizer.apply_chat_template(chat_messages(r["question"], params),
                                                 add_generation_prompt=True,
                                                 tokenize=True)["input_ids"])
               for r in read_gsm8k(n=50)]
    expected = sum(n > limit for n in lengths)
    assert 0 < expected < 50
    assert report["dropped_by_split"]["train"]["overlong_prompt"] == expected
    assert len(train_p) == 50 - expected


def test_truncation_error_names_rows_and_lengths(gsm_files, tokenizer_dir, prep_params,
                                                 data_params) -> None:
    data = {**data_params, "data_max_prompt_length": 150,
            "data_filter_overlong_prompts": False, "data_truncation": "error"}
    with pytest.raises(DataError) as err:
        _run_all(*gsm_files, tokenizer_dir, prep_params, data)
    message = str(err.value)
    assert "train prompt(s) longer than data_max_prompt_length=150 tokens" in message
    assert f"{gsm_files[0]}, line " in message and " tokens)" in message


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncation_keeps_every_row_within_the_limit(gsm_files, tokenizer_dir, tokenizer,
                                                     prep_params, data_params, side) -> None:
    data = {**data_params, "data_max_prompt_length": 150,
            "data_filter_overlong_prompts": False, "data_truncation": side}
    train_p, _, report, _, _ = _run_all(*gsm_files, tokenizer_dir, prep_params, data)
    assert len(train_p) == 50 and report["truncated"]["train"] > 0
    lengths = [len(tokenizer.apply_chat_template(list(p), add_generation_prompt=True,
                                                 tokenize=True)["input_ids"])
               for p in train_p["prompt"]]
    assert max(lengths) <= 150
    # The original question is kept for reference.
    assert train_p["extra_info"].iloc[0]["question"] == read_gsm8k(n=1)[0]["question"]


def test_invalid_parameters_are_named_with_value_and_allowed(gsm_files, prep_params,
                                                             data_params) -> None:
    bad_data = {**data_params, "data_truncation": "sideways", "data_max_prompt_length": 0}
    with pytest.raises(ConfigError) as err:
        DataParams.model_validate(bad_data)
    message = str(err.value)
    assert "data.data_truncation='sideways'" in message
    assert "'error', 'left', 'right' or 'middle'" in message
    assert "data.data_max_prompt_length=0" in message and "greater than 0" in message

    with pytest.raises(ConfigError, match="data_prep.promt_template: unknown parameter"):
        DataPrepParams.model_validate({**prep_params, "promt_template": "{x}"})
