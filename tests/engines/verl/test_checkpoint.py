"""The verl engine's export: its newest FSDP checkpoint, converted by verl's own model merger,
as a training result that merge takes without knowing verl."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_pipeline.engines.verl.checkpoint import export_result
from rl_pipeline.params import MergeParams
from rl_pipeline.params.model_registry import RegistryParams
from rl_pipeline.pipelines.merge.nodes import merge_model
from rl_pipeline.training_result import RECORD, TrainingResult
from tests.verl_inputs import verl_checkpoint


@pytest.mark.slow
def test_a_full_fine_tuning_checkpoint_exports_a_verified_whole_model(tiny_model_dir,
                                                                      tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    actor, state = verl_checkpoint(tiny_model_dir, checkpoints)
    out = export_result(checkpoints, tmp_path / "scratch", {"mlflow_run_id": "abc123"})

    result = TrainingResult.read(out)
    assert (result.kind, result.engine, result.source) == ("hf_model", "verl", str(actor))
    assert result.checks == {"method": "verl.model_merger test", "passed": True}
    assert result.run == {"mlflow_run_id": "abc123"}
    exported = AutoModelForCausalLM.from_pretrained(str(out))
    for key, value in exported.state_dict().items():
        assert value.dtype == torch.bfloat16  # verl's merger saves bfloat16
        assert torch.equal(value, state[key].to(torch.bfloat16)), key
    assert not list((tmp_path / "scratch").glob(".convert-*"))

    # Merge takes it by its record alone: a checked copy, with the export's figures kept.
    path, metadata, _ = merge_model(str(out), str(tiny_model_dir), str(tmp_path / "scratch"),
                                    MergeParams(), RegistryParams())
    assert metadata["kind"] == "hf_model" and metadata["checkpoint"] == str(actor)
    assert metadata["export_checks"]["passed"] and metadata["verification"]["passed"]
    assert metadata["training_run"] == {"mlflow_run_id": "abc123"}
    merged = AutoModelForCausalLM.from_pretrained(path).state_dict()
    key = next(iter(state))
    assert torch.equal(merged[key], state[key].to(torch.bfloat16))
    assert not (Path(path) / RECORD).exists()  # the record stays with the result


def test_export_without_a_checkpoint_says_what_to_set(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="trainer_save_freq"):
        export_result(tmp_path, tmp_path / "scratch", {})
    assert not list((tmp_path / "scratch").glob(".training-result-*"))


@pytest.mark.slow
def test_a_conversion_that_differs_from_its_shards_is_refused(tiny_model_dir, tmp_path,
                                                               monkeypatch) -> None:
    """verl's own ``model_merger test`` compares the converted folder with the shards; a
    conversion it rejects leaves no result behind."""
    from rl_pipeline.engines.verl import checkpoint

    checkpoints = tmp_path / "checkpoints"
    verl_checkpoint(tiny_model_dir, checkpoints)
    convert = checkpoint.convert_fsdp_checkpoint

    def corrupting(actor, out):  # the merger's output, one weight changed afterwards
        from safetensors.torch import load_file, save_file

        folder = convert(actor, out)
        weights = load_file(folder / "model.safetensors")
        name = next(iter(weights))
        weights[name] = weights[name] + 1
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        return folder

    monkeypatch.setattr(checkpoint, "convert_fsdp_checkpoint", corrupting)
    with pytest.raises(checkpoint.ConversionError, match="does not match its shards"):
        export_result(checkpoints, tmp_path / "scratch", {})
    assert not [p for p in (tmp_path / "scratch").iterdir() if p.name.startswith(".training")]


def test_a_folder_without_its_record_is_refused_by_merge(tiny_model_dir, tmp_path) -> None:
    from rl_pipeline.training_result import TrainingResultError

    with pytest.raises(TrainingResultError, match=f"{RECORD}: missing"):
        merge_model(str(tiny_model_dir), str(tiny_model_dir), str(tmp_path), MergeParams(),
                    RegistryParams())
    folder = tmp_path / "result"
    folder.mkdir()
    (folder / RECORD).write_text(json.dumps({"format": 1, "kind": "lora", "engine": "verl",
                                             "run": {}}))
    with pytest.raises(TrainingResultError, match="field 'kind' is 'lora'; expected one of "
                                                  "peft_adapter, hf_model"):
        merge_model(str(folder), str(tiny_model_dir), str(tmp_path), MergeParams(),
                    RegistryParams())
    (folder / RECORD).write_text(json.dumps({"format": 1, "kind": "peft_adapter",
                                             "engine": "verl", "run": {}}))
    with pytest.raises(TrainingResultError, match="kind peft_adapter, but .* has no "
                                                  "adapter_config.json"):
        merge_model(str(folder), str(tiny_model_dir), str(tmp_path), MergeParams(),
                    RegistryParams())


def _steps(checkpoints: Path, complete: list[int], cut_short: list[int]) -> None:
    """global_step_N folders as verl writes them: whole, or cut short before data.pt."""
    for step in complete + cut_short:
        actor = checkpoints / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "fsdp_config.json").write_text("{}")
        (actor / "model_world_size_1_rank_0.pt").write_bytes(b"")
        if step in complete:
            (actor.parent / "data.pt").write_bytes(b"")


@pytest.mark.parametrize("record", ["", "\x00\x00", "4\n"])
def test_a_record_cut_short_is_rewritten_with_the_newest_complete_step(tmp_path, record,
                                                                       caplog) -> None:
    """verl writes its record of the newest step in place: after a power loss it can be
    empty, and verl's resume raised ValueError on every rerun until it was deleted by hand."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    from rl_pipeline.engines.verl.checkpoint import LATEST, latest_step, repair_latest

    _steps(tmp_path, complete=[2, 4], cut_short=[6])
    (tmp_path / LATEST).write_text(record)
    if record.strip().isdigit():
        assert repair_latest(tmp_path) is None  # a readable record is left as it is
        assert (tmp_path / LATEST).read_text() == record
        return
    with pytest.raises(ValueError, match="invalid literal for int"):
        find_latest_ckpt_path(str(tmp_path))
    assert latest_step(tmp_path) == 4  # the forecast reads it before the repair
    with caplog.at_level(logging.WARNING):
        assert repair_latest(tmp_path) == 4
    assert "rewritten to 4, the newest complete checkpoint" in caplog.text
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_4")


def test_a_record_cut_short_with_no_complete_checkpoint_is_removed(tmp_path) -> None:
    from rl_pipeline.engines.verl.checkpoint import LATEST, latest_step, repair_latest

    _steps(tmp_path, complete=[], cut_short=[2])
    (tmp_path / LATEST).write_text("")
    assert repair_latest(tmp_path) == 0
    assert not (tmp_path / LATEST).exists() and latest_step(tmp_path) == 0


def test_checkpoints_an_interrupted_run_left_beyond_the_kept_ones_are_deleted(tmp_path) -> None:
    """verl deletes only what it saved in the same process: a run killed at step 2 and
    resumed to step 10 with 2 kept left global_step_2's actor for good (a full model and
    optimizer state each on a GPU)."""
    from rl_pipeline.engines.verl.checkpoint import LATEST, drop_unkept

    _steps(tmp_path, complete=[2, 8, 10], cut_short=[])
    for step in (4, 6):  # what verl's own deletion left of the resumed run's older steps
        (tmp_path / f"global_step_{step}").mkdir()
        (tmp_path / f"global_step_{step}" / "data.pt").write_bytes(b"")
    (tmp_path / LATEST).write_text("10")
    assert drop_unkept(tmp_path, None) == [] and drop_unkept(tmp_path, 0) == []
    assert drop_unkept(tmp_path, 2) == [2]
    assert sorted(p.parent.name for p in tmp_path.glob("global_step_*/actor")) == [
        "global_step_10", "global_step_8"]
    assert (tmp_path / "global_step_2" / "data.pt").is_file()  # as verl's deletion leaves it
    # The recorded newest is never deleted, even where keep would (a record behind a step).
    (tmp_path / LATEST).write_text("8")
    assert drop_unkept(tmp_path, 1) == []
