"""The training questions a model carries, and eval leaving them out of its comparisons."""

from __future__ import annotations

import pandas as pd
import pytest

from rl_pipeline.data.prompts import to_verl_frame
from rl_pipeline.params import DataPrepParams
from rl_pipeline.pipelines.eval.nodes import TrainedOnError, held_out_prompts
from rl_pipeline.trained_questions import (
    FILE,
    question_digests,
    read_trained_questions,
    trained_on,
    write_trained_questions,
)


def _prompts(questions: list[str], instruction: str = "Answer after ####.") -> pd.DataFrame:
    work = pd.DataFrame({"question": questions, "answer": ["#### 1"] * len(questions),
                         "ground_truth": ["1"] * len(questions)})
    return to_verl_frame(work, DataPrepParams(instruction=instruction), "val",
                         "images")


def test_a_question_is_known_under_another_prompt_template(tmp_path) -> None:
    write_trained_questions(tmp_path, _prompts(["What is 2 + 2?", "What is 3 + 5?"]))
    # The same questions with another instruction, and one new one.
    val = _prompts(["What is 3 + 5?", "What is 9 + 9?", "What is 2 + 2?"], "Box it.")
    assert val["prompt"][0] != _prompts(["What is 3 + 5?"])["prompt"][0]
    assert list(trained_on(val, tmp_path)) == [True, False, True]
    assert len(read_trained_questions(tmp_path)) == 2


def test_a_model_that_records_nothing_leaves_every_prompt_in(tmp_path) -> None:
    val = _prompts(["What is 3 + 5?"])
    assert read_trained_questions(tmp_path) is None and not trained_on(val, tmp_path).any()
    (tmp_path / FILE).write_text('{"format": 99, "questions": []}')  # a format we do not read
    assert read_trained_questions(tmp_path) is None
    assert held_out_prompts(val, str(tmp_path), "the trained model") is val


def test_digests_follow_the_question_not_the_row() -> None:
    digests = question_digests(_prompts(["a", "b", "a"]))
    assert digests[0] == digests[2] != digests[1] and len(digests[0]) == 16
    # Prompts made elsewhere, without extra_info: keyed by their chat messages.
    bare = pd.DataFrame({"prompt": [[{"role": "user", "content": "a"}],
                                    [{"role": "user", "content": "b"}]]})
    assert len(set(question_digests(bare))) == 2


def test_eval_leaves_out_what_the_model_trained_on_and_says_so(tmp_path, caplog) -> None:
    val = _prompts(["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"])
    write_trained_questions(tmp_path, _prompts(["What is 2 + 2?"]))
    held_out = held_out_prompts(val, str(tmp_path), "the trained model")
    assert list(held_out.index) == [0, 2]  # the positions in val, for pairing answers
    assert "1 of the 3 validation prompts ask a question the trained model" in caplog.text
    assert "'What is 2 + 2?'" in caplog.text


def test_a_model_trained_on_every_validation_question_is_refused(tmp_path) -> None:
    val = _prompts(["What is 1 + 1?", "What is 2 + 2?"])
    write_trained_questions(tmp_path, val)
    with pytest.raises(TrainedOnError, match=r"2 of the 2 validation prompts .* every one, "
                                             r"so eval has no held-out prompt"):
        held_out_prompts(val, str(tmp_path), "the trained model")
    with pytest.raises(TrainedOnError, match=r"another split or data_prep.drop_train_val_overlap"
                                             r"=false\)\. Compare .* promote.reference=base$"):
        held_out_prompts(val, str(tmp_path), "the champion (version 3)",
                         "Compare the trained model with the base model instead: "
                         "promote.reference=base")
