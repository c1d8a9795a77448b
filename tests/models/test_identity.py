"""A model trained from one base model is refused where a stage is given another: merge
would fold its adapter into weights it was not trained on, and verify it against the same
wrong base; eval would compare it with a base it did not start from."""

from __future__ import annotations

import json

import pytest

from rl_pipeline.merge import MERGE_METADATA
from rl_pipeline.merge.standalone import make_standalone_model
from rl_pipeline.models.identity import (
    BaseModelMismatchError,
    check_trained_from,
    model_identity,
)
from rl_pipeline.models.resolve import METADATA_FILE
from rl_pipeline.params import EvalParams, MergeParams
from rl_pipeline.pipelines.eval.nodes import select_eval_prompts
from rl_pipeline.testing import build_tiny_causal_lm, train_tiny_lora
from rl_pipeline.training_result import TrainingResult
from tests.conftest import gsm8k_prompts


@pytest.fixture(scope="module")
def other_base(tmp_path_factory, tokenizer):
    """The same architecture and tokenizer as tiny_model_dir, other weights."""
    return build_tiny_causal_lm(tmp_path_factory.mktemp("other_base"), tokenizer, seed=7)


def test_only_other_weights_are_refused(tiny_model_dir, other_base, tmp_path) -> None:
    recorded = model_identity(tiny_model_dir)
    check_trained_from(recorded, tiny_model_dir, "it", "")  # the same model
    check_trained_from(None, other_base, "it", "")  # trained before the record: unknown
    with pytest.raises(BaseModelMismatchError, match=r"^it was trained from a model \(weights "
                                                     r"sha256 [0-9a-f]{12}\), but base_model is "
                                                     rf"now {other_base} \([0-9a-f]{{12}}\)"):
        check_trained_from(recorded, other_base, "it", "")
    # A base whose resolving recorded its weights' digest is named by its source.
    resolved = tmp_path / "resolved"
    resolved.mkdir()
    (resolved / METADATA_FILE).write_text(json.dumps(
        {"source": "HuggingFaceTB/SmolLM2-135M-Instruct", "weights_sha256": "ab" * 32}))
    trained_from = {**model_identity(resolved), "source": "Qwen/Qwen2.5-0.5B-Instruct",
                    "weights_sha256": "cd" * 32}
    with pytest.raises(BaseModelMismatchError, match=(
            r"it was trained from Qwen/Qwen2.5-0.5B-Instruct \(weights sha256 cdcdcdcdcdcd\), "
            r"but base_model is now HuggingFaceTB/SmolLM2-135M-Instruct \(abababababab\)\. "
            r"Set base_model back to the model it was trained from \(--params "
            r"base_model=Qwen/Qwen2.5-0.5B-Instruct\), or train again from this one\.")):
        check_trained_from(trained_from, resolved, "it", "")


def test_merge_refuses_an_adapter_trained_from_another_base(tiny_model_dir, other_base,
                                                           tmp_path) -> None:
    adapter = train_tiny_lora(tiny_model_dir, tmp_path / "adapter", steps=1)
    TrainingResult(kind="peft_adapter", engine="trl",
                   run={"steps": 1, "base_model": model_identity(tiny_model_dir)}).write(adapter)
    with pytest.raises(BaseModelMismatchError, match=rf"training result in {adapter} was "
                                                     "trained from a model"):
        make_standalone_model(str(adapter), str(other_base), MergeParams(), tmp_path / "work")
    assert not list((tmp_path / "work").glob("*"))  # refused before building anything
    merged = make_standalone_model(str(adapter), str(tiny_model_dir), MergeParams(),
                                   tmp_path / "work")
    assert merged.metadata["training_run"]["base_model"] == model_identity(tiny_model_dir)


def test_eval_refuses_a_model_trained_from_another_base(tiny_model_dir, other_base,
                                                       tmp_path) -> None:
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / MERGE_METADATA).write_text(json.dumps(
        {"training_run": {"base_model": model_identity(tiny_model_dir)}}))
    val = gsm8k_prompts(3)
    with pytest.raises(BaseModelMismatchError, match="Eval would compare it with a base it "
                                                     "did not start from"):
        select_eval_prompts(val, str(other_base), str(merged), EvalParams())
    prompts, _ = select_eval_prompts(val, str(tiny_model_dir), str(merged), EvalParams())
    assert len(prompts) == 3
