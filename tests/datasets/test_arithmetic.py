"""Generated additions: deterministic, GSM8K-shaped, and train and test never share a pair."""

from __future__ import annotations

import pytest
from kedro.io import DatasetError

from rl_pipeline.datasets.arithmetic import AdditionDataset, addition_records


def test_splits_are_disjoint_deterministic_and_gsm8k_shaped() -> None:
    train = addition_records("train", 600, seed=0)
    test = addition_records("test", 200, seed=0)
    assert len(train) == 600 and len(test) == 200
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert train == addition_records("train", 600, seed=0)
    assert train != addition_records("train", 600, seed=1)
    first = train[0]
    a, b = (int(x) for x in first["question"].removeprefix("What is ").rstrip("?").split(" + "))
    assert 10 <= a <= 99 and 10 <= b <= 99
    assert first["answer"] == f"{a} + {b} = {a + b}\n#### {a + b}"
    # Taking more of a split keeps the ones before: a larger test set extends a smaller one.
    assert addition_records("test", 300, seed=0)[:200] == test


def test_the_dataset_loads_numbered_records_and_refuses_too_many() -> None:
    records = AdditionDataset(split="train", rows=5, seed=3).load()
    assert len(records) == 5 and records.lines == [1, 2, 3, 4, 5] and records.unit == "row"
    assert "generated additions [train, seed 3]" in records.origin
    with pytest.raises(DatasetError, match=r"rows=4051: expected 1 to 4050 \(half of the 8100"):
        AdditionDataset(split="test", rows=4051).load()
    with pytest.raises(DatasetError, match="split='val'"):
        AdditionDataset(split="val", rows=5).load()
    with pytest.raises(DatasetError, match="read-only"):
        AdditionDataset(split="train", rows=5).save(records)


def test_boxed_answers_are_read_by_the_math_scorer() -> None:
    """MATH's form for the MATH-style run: the same pairs, the sum in ``\\boxed{}``, which
    the MATH data sources' scorer (math-verify) accepts and a wrong sum does not pass."""
    from rl_pipeline.rewards.scoring import compute_score

    boxed = addition_records("train", 20, seed=0, answer_format="boxed")
    plain = addition_records("train", 20, seed=0)
    assert [r["question"] for r in boxed] == [r["question"] for r in plain]
    record = boxed[0]
    total = record["answer"].split("=")[1].strip().removeprefix("\\boxed{").rstrip("}")
    assert record["answer"].endswith(f"\\boxed{{{total}}}")
    assert compute_score("math", record["answer"], total) == 1.0
    assert compute_score("math", record["answer"], str(int(total) + 1)) == 0.0
    with pytest.raises(ValueError, match="answer_format='latex': expected one of gsm8k, boxed"):
        addition_records("train", 5, answer_format="latex")


def test_inputs_no_stage_writes_say_they_exist_without_kedros_warning(caplog) -> None:
    """A run's check of its inputs asks every input; Kedro's default answer warned."""
    from rl_pipeline.datasets.model_source import ModelSourceDataset
    from rl_pipeline.datasets.raw_records import RawRecordsDataset

    caplog.set_level("WARNING")
    assert AdditionDataset(split="train", rows=4).exists()
    assert ModelSourceDataset(source="Qwen/Qwen2.5-0.5B-Instruct").exists()
    assert RawRecordsDataset(dataset_name="my/dataset").exists()
    assert not [r for r in caplog.records if "not implemented" in r.getMessage()]
