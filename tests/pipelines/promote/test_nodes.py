"""Registered versions, eval's record and the promotion gate, on a real MLflow registry (a
SQLite store in a temporary folder): promoted, refused, idempotent, and bad input."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from rl_pipeline import model_registry
from rl_pipeline.merge import MERGE_METADATA
from rl_pipeline.model_card import ManifestError, check_manifest, write_manifest
from rl_pipeline.params import ConfigError
from rl_pipeline.params.model_registry import PromoteParams, RegistryParams
from rl_pipeline.pipelines.merge.nodes import publish_merged_model
from rl_pipeline.pipelines.promote.nodes import promote_candidate

NAME = "tiny"
PARAMS = RegistryParams(model_name=NAME)
GATE = PromoteParams(metric="mean_reward", guards={"truncation_rate": 0.0})
METADATA = {"base_model": "tiny-base", "kind": "peft_adapter", "engine": "trl",
            "dtype": "float32", "verification": {"passed": True},
            "training_run": {"engine": "trl", "algorithm": "grpo", "steps": 2,
                             "mlflow_run_id": "t1", "identity": "a" * 64}}


@pytest.fixture
def store(mlflow_store):
    return mlflow_store


def _c(delta: float, low: float, high: float) -> dict[str, float]:
    return {"delta": delta, "ci_low": low, "ci_high": high}


def _merged(tiny_model_dir: Path, root: Path, n: int) -> Path:
    folder = root / "data/06_models/merged_model" / f"v{n}" / "merged_model"
    shutil.copytree(tiny_model_dir, folder)
    _as_merge_leaves_it(folder)
    return folder


def _as_merge_leaves_it(folder: Path) -> None:
    """The folder's merge record and its manifest, as merge writes them."""
    (folder / MERGE_METADATA).write_text(json.dumps(METADATA))
    write_manifest(folder)


def _published(tiny_model_dir: Path, root: Path, n: int) -> tuple[Path, str]:
    folder = _merged(tiny_model_dir, root, n)
    with mlflow.start_run(run_name="merge"):
        out = publish_merged_model(str(folder), PARAMS)
    return folder, out["version"]


def _evaluated(version: str, reference: str, gain: dict[str, float],
               truncation: dict[str, float] | None = None) -> None:
    evidence = {"reference": reference,
                "overall": {"mean_reward": gain,
                            "truncation_rate": truncation or _c(0.0, 0.0, 0.0)},
                "by_data_source": {}}
    with mlflow.start_run(run_name="eval") as run:
        model_registry.record_eval(NAME, model_registry.client().get_model_version(NAME, version),
                             {"eval.mean_reward": "0.5"}, evidence, run.info.run_id)


def _promote(params: PromoteParams = GATE) -> dict:
    with mlflow.start_run(run_name="promote"):
        return promote_candidate({}, PARAMS, params)


def test_merge_registers_a_reference_with_its_lineage_and_weight_hashes(
        store, tiny_model_dir) -> None:
    folder = _merged(tiny_model_dir, store, 1)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    with mlflow.start_run(run_name="merge"):
        number = publish_merged_model(str(folder), PARAMS)["version"]
    version = model_registry.client().get_model_version(NAME, number)
    assert version.source == folder.absolute().as_uri()  # the catalog's folder, not a copy
    tags = version.tags
    assert tags["storage"] == "catalog reference" and tags["catalog.version"] == "v1"
    assert tags["sha256.model.safetensors"] == hashlib.sha256(
        (folder / "model.safetensors").read_bytes()).hexdigest()
    assert (tags["base_model"], tags["engine"], tags["kind"]) == ("tiny-base", "trl",
                                                                  "peft_adapter")
    assert tags["train_run_id"] == "t1" and tags["run_identity"] == "a" * 64
    assert tags["merge_run_id"] == version.run_id
    # Published as merge wrote it: registering writes nothing into the folder.
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files


def test_the_first_candidate_beating_the_base_becomes_champion_once(store,
                                                                   tiny_model_dir) -> None:
    _, number = _published(tiny_model_dir, store, 1)
    _evaluated(number, "base", _c(0.2, 0.1, 0.3))
    assert str(model_registry.alias(NAME, model_registry.CANDIDATE).version) == number
    decision = _promote()
    assert decision["promoted"] and decision["changed"] and decision["reference"] == "base"
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == number
    # A second promote on the same candidate does nothing.
    again = _promote()
    assert (again["promoted"], again["changed"]) == (False, False)
    assert "is the champion already" in again["reasons"][0]


def test_a_candidate_within_noise_of_the_champion_is_refused(store, tiny_model_dir) -> None:
    _, first = _published(tiny_model_dir, store, 1)
    _evaluated(first, "base", _c(0.2, 0.1, 0.3))
    _promote()
    _, second = _published(tiny_model_dir, store, 2)
    _evaluated(second, f"champion:{first}", _c(0.05, -0.02, 0.12))
    decision = _promote()
    assert (decision["promoted"], decision["changed"]) == (False, True)
    assert decision["reasons"][0] == ("mean_reward: +0.05 [-0.02, +0.12] vs champion:1: not "
                                      "up beyond the paired 95% interval (the interval reaches"
                                      " 0)")
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == first  # untouched
    tags = model_registry.client().get_model_version(NAME, second).tags
    assert tags["promote.refused_against"] == f"champion:{first}"
    assert _promote()["changed"] is False  # decided already: nothing to do
    # Evaluated again (new evidence against the same champion): the gate decides again.
    _evaluated(second, f"champion:{first}", _c(0.2, 0.1, 0.3))
    again = _promote()
    assert (again["promoted"], again["changed"]) == (True, True)
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == second


def test_a_merge_of_unchanged_weights_is_tagged_with_its_twins_and_promote_says_so(
        store, tiny_model_dir, caplog) -> None:
    """A scheduled rerun of merge on a training result that did not change: a new version
    all the same (eval finds its version by folder), tagged with the versions whose weight
    files it repeats; a version with other weights is not."""
    from safetensors.torch import load_file, save_file

    _, first = _published(tiny_model_dir, store, 1)
    assert "same_weights_as" not in model_registry.client().get_model_version(NAME, first).tags
    _evaluated(first, "base", _c(0.2, 0.1, 0.3))
    _promote()
    changed = _merged(tiny_model_dir, store, 2)
    weights = load_file(changed / "model.safetensors")
    weights = {k: v + 1 if i == 0 else v for i, (k, v) in enumerate(weights.items())}
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    write_manifest(changed)
    with mlflow.start_run(run_name="merge"):
        other = publish_merged_model(str(changed), PARAMS)["version"]
    with caplog.at_level("WARNING"):
        _, twin = _published(tiny_model_dir, store, 3)
    tags = {v: model_registry.client().get_model_version(NAME, v).tags
            for v in (other, twin)}
    assert "same_weights_as" not in tags[other]
    assert tags[twin]["same_weights_as"] == first
    assert f"weight files are those of version(s) {first}" in caplog.text
    _evaluated(twin, f"champion:{first}", _c(0.0, 0.0, 0.0))
    decision = _promote()
    assert decision["promoted"] is False
    assert decision["reasons"][-1].startswith(f"version {twin} has champion:{first}'s weights")
    assert decision["reasons"][-1] in model_registry.client().get_model_version(
        NAME, twin).tags["promote.reasons"]


def test_a_guard_beyond_its_tolerance_refuses_a_better_mean(store, tiny_model_dir) -> None:
    _, number = _published(tiny_model_dir, store, 1)
    _evaluated(number, "base", _c(0.2, 0.1, 0.3), truncation=_c(0.1, 0.05, 0.15))
    decision = _promote()
    assert not decision["promoted"]
    assert "guard truncation_rate: +0.1 [+0.05, +0.15]" in decision["reasons"][1]
    assert model_registry.alias(NAME, model_registry.CHAMPION) is None


def test_an_eval_against_another_reference_is_refused(store, tiny_model_dir) -> None:
    _, first = _published(tiny_model_dir, store, 1)
    _evaluated(first, "base", _c(0.2, 0.1, 0.3))
    _promote()
    _, second = _published(tiny_model_dir, store, 2)
    _evaluated(second, "base", _c(0.3, 0.2, 0.4))  # evaluated before the champion existed
    with pytest.raises(model_registry.RegistryError, match="evaluated against base, but the gate "
                                                     "compares with champion:1 now"):
        _promote()
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == first


def test_no_candidate_or_no_eval_is_refused_clearly(store, tiny_model_dir) -> None:
    with pytest.raises(model_registry.RegistryError, match="no candidate: tiny has no version "
                                                     "with the alias 'candidate'"):
        _promote()
    _, number = _published(tiny_model_dir, store, 1)
    model_registry.client().set_registered_model_alias(NAME, model_registry.CANDIDATE, number)
    with pytest.raises(model_registry.RegistryError, match="has no eval results"):
        _promote()
    with pytest.raises(ConfigError, match="registry.model_name=None"):
        promote_candidate({}, RegistryParams(model_name=None), GATE)


def test_a_champion_whose_weights_are_gone_stops_the_gate(store, tiny_model_dir) -> None:
    champion_folder, first = _published(tiny_model_dir, store, 1)
    _evaluated(first, "base", _c(0.2, 0.1, 0.3))
    _promote()
    _, second = _published(tiny_model_dir, store, 2)
    _evaluated(second, f"champion:{first}", _c(0.3, 0.2, 0.4))
    shutil.rmtree(champion_folder)
    gone = f"the champion \\(tiny version {first}\\) refers to .*, which is gone"
    with pytest.raises(model_registry.RegistryError, match=gone):
        _promote()
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == first


def test_a_tampered_candidate_is_refused_by_file(store, tiny_model_dir) -> None:
    folder, number = _published(tiny_model_dir, store, 1)
    _evaluated(number, "base", _c(0.2, 0.1, 0.3))
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(ManifestError, match=r"model\.safetensors: changed"):
        _promote()
    assert model_registry.alias(NAME, model_registry.CHAMPION) is None


def test_an_unknown_gate_metric_names_what_eval_compares(store, tiny_model_dir) -> None:
    _, number = _published(tiny_model_dir, store, 1)
    _evaluated(number, "base", _c(0.2, 0.1, 0.3))
    with pytest.raises(ConfigError, match="eval has no comparison for 'pass_at_9'; metrics it "
                                          "compares: mean_reward, truncation_rate"):
        _promote(PromoteParams(metric="pass_at_9"))


def test_eval_records_its_results_on_the_version_and_leaves_the_model_folder_as_merged(
        store, tiny_model_dir) -> None:
    from rl_pipeline.pipelines.eval.nodes import record_eval

    folder, number = _published(tiny_model_dir, store, 1)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    trained = {"mean_reward": 0.6, "verdict": {"verdict": "learned", "reasons": ["up"]},
               "prompts": 5, "vs_base": {"mean_reward": _c(0.2, 0.1, 0.3)},
               "by_data_source": {"openai/gsm8k": {
                   "mean_reward": 0.6, "vs_base": {"mean_reward": _c(0.2, 0.1, 0.3)}}}}
    with mlflow.start_run(run_name="eval") as run:
        out = record_eval({"base": {}, "trained": trained}, str(folder), {},
                          {"validation_prompts": 5, "trained_on_prompts": 0, "evaluated": 5},
                          PARAMS)
    assert out == {"recorded": True, "name": NAME, "version": number, "reference": "base"}
    version = model_registry.alias(NAME, model_registry.CANDIDATE)
    assert str(version.version) == number
    assert version.tags["eval.mean_reward"] == "0.6000"
    assert version.tags["eval.mean_reward.vs_base"] == "+0.2000 [+0.1000, +0.3000]"
    assert version.tags["eval.verdict"] == "learned"
    assert version.tags["eval.run_id"] == run.info.run_id
    assert model_registry.read_evidence(version)["overall"] == {"mean_reward": _c(0.2, 0.1, 0.3)}
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files  # not rewritten
    check_manifest(folder)


def test_a_quick_check_is_no_evidence_and_never_replaces_a_full_evals(
        store, tiny_model_dir) -> None:
    """eval.max_prompts=20 is a quick check: its interval above 0 made a champion, and a
    later 8-prompt check overwrote a champion's own evidence with "no change"."""
    from rl_pipeline.pipelines.eval.nodes import record_eval

    folder, number = _published(tiny_model_dir, store, 1)

    def evaluated(prompts: int, gain: dict[str, float]) -> dict:
        selection = {"validation_prompts": 200, "trained_on_prompts": 0, "evaluated": prompts}
        trained = {"mean_reward": 0.6, "prompts": prompts,
                   "verdict": {"verdict": "learned", "reasons": ["up"]},
                   "vs_base": {"mean_reward": gain, "truncation_rate": _c(0.0, 0.0, 0.0)},
                   "by_data_source": {}}
        with mlflow.start_run(run_name="eval"):
            return record_eval({"base": {}, "trained": trained}, str(folder), {}, selection,
                               PARAMS)

    # On a version no full eval has recorded on: recorded, marked, and refused by the gate.
    assert evaluated(20, _c(0.25, 0.05, 0.45))["recorded"]
    candidate = model_registry.alias(NAME, model_registry.CANDIDATE)
    assert candidate.tags[model_registry.QUICK_CHECK_TAG] == "true"
    refused = _promote()
    assert refused["promoted"] is False and refused["reasons"][-1] == (
        "eval answered 20 of the 200 validation prompts (eval.max_prompts, a quick check): "
        "no evidence for the gate; run eval with eval.max_prompts unset (null)")
    assert evaluated(200, _c(0.25, 0.15, 0.35))["recorded"]  # every prompt: evidence
    assert _promote()["promoted"] is True
    champion = model_registry.alias(NAME, model_registry.CHAMPION)
    assert str(champion.version) == number
    assert champion.tags[model_registry.QUICK_CHECK_TAG] == "false"
    # The daily quick check of the champion: in its eval run, not on the version.
    assert evaluated(8, _c(0.0, -0.25, 0.25)) == {"recorded": False, "reason": "quick check",
                                                  "version": number}
    after = model_registry.alias(NAME, model_registry.CHAMPION)
    assert after.tags == champion.tags
    assert model_registry.read_evidence(after)["overall"]["mean_reward"] == _c(0.25, 0.15, 0.35)


def test_a_refusal_is_decided_again_when_the_gate_changes(store, tiny_model_dir) -> None:
    """A guard loosened after a refusal: the rerun of promote kept the old refusal, as if
    nothing had changed, until eval ran again."""
    _, number = _published(tiny_model_dir, store, 1)
    _evaluated(number, "base", _c(0.2, 0.1, 0.3), truncation=_c(0.02, 0.01, 0.03))
    assert _promote()["promoted"] is False  # truncation_rate's tolerance 0
    assert _promote()["changed"] is False  # the same gate: decided already
    loosened = PromoteParams(metric="mean_reward", guards={"truncation_rate": 0.05})
    again = _promote(loosened)
    assert (again["promoted"], again["changed"]) == (True, True)
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == number
    # The refusal's tag went with it: the champion reads promoted, not refused and promoted.
    tags = model_registry.client().get_model_version(NAME, number).tags
    assert tags[model_registry.PROMOTED_TAG] == "base"
    assert model_registry.REFUSED_TAG not in tags


def test_a_champion_compared_on_too_few_prompts_is_not_replaced(store, tiny_model_dir) -> None:
    """The validation data changed since the champion trained, so it answered only the one
    validation prompt it had not trained on; the candidate won that prompt (+1 [+1, +1])
    and became champion on it."""
    from rl_pipeline.pipelines.eval.nodes import record_eval

    _, first = _published(tiny_model_dir, store, 1)
    _evaluated(first, "base", _c(0.2, 0.1, 0.3))
    _promote()
    folder, second = _published(tiny_model_dir, store, 2)
    one = {**_c(1.0, 1.0, 1.0), "prompts": 1, "distinguishable": True}
    trained = {"mean_reward": 0.9, "prompts": 32,
               "verdict": {"verdict": "learned", "reasons": ["up"]},
               "vs_base": {"mean_reward": _c(0.3, 0.2, 0.4)},
               "vs_champion": {"mean_reward": one, "truncation_rate": {**one, "delta": 0.0,
                                                                       "ci_low": 0.0,
                                                                       "ci_high": 0.0}},
               "by_data_source": {}}
    with mlflow.start_run(run_name="eval"):
        record_eval({"base": {}, "trained": trained}, str(folder), {"version": first},
                    {"validation_prompts": 32, "trained_on_prompts": 0, "evaluated": 32},
                    PARAMS)
    decision = _promote()
    assert decision["promoted"] is False
    assert ("the comparison with champion:1 rests on 1 prompts, fewer than "
            "promote.min_prompts=20: no evidence for the gate; the champion answered only the "
            "validation prompts it was not trained on") in decision["reasons"]
    assert str(model_registry.alias(NAME, model_registry.CHAMPION).version) == first


def test_a_registry_that_does_not_answer_is_not_a_registry_without_a_champion(
        store, monkeypatch) -> None:
    """Any registry error read as "no such alias": a store that failed to answer gave eval no
    champion to compare with, and the gate then compared with the base model."""
    import socket

    from mlflow.exceptions import MlflowException

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
    with pytest.raises(MlflowException, match="API request"):
        model_registry.alias(NAME, model_registry.CHAMPION)
    with pytest.raises(MlflowException, match="API request"):
        promote_candidate({}, PARAMS, GATE)  # not "no candidate"
    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    assert model_registry.alias(NAME, model_registry.CHAMPION) is None  # no model: None
    with pytest.raises(model_registry.RegistryError, match="no candidate"):
        _promote()


def test_new_evidence_clears_a_refusal_and_its_reasons(store, tiny_model_dir) -> None:
    _, number = _published(tiny_model_dir, store, 1)
    _evaluated(number, "base", _c(0.05, -0.05, 0.15))
    assert _promote()["promoted"] is False
    refused = model_registry.alias(NAME, model_registry.CANDIDATE)
    assert {model_registry.REFUSED_TAG, model_registry.REASONS_TAG} <= set(refused.tags)
    _evaluated(number, "base", _c(0.2, 0.1, 0.3))  # evaluated again
    again = model_registry.alias(NAME, model_registry.CANDIDATE)
    assert not {model_registry.REFUSED_TAG, model_registry.REASONS_TAG} & set(again.tags)
    assert _promote()["promoted"] is True


def test_the_champion_answers_only_the_questions_it_was_not_trained_on(
        store, tiny_model_dir, data_params) -> None:
    """A champion trained on questions that a later data_prep made validation prompts would
    be compared where it has seen the answers: the gate's reference, flattered."""
    from rl_pipeline.params import DataParams, EvalParams, RewardParams, resolve_followers
    from rl_pipeline.pipelines.eval.nodes import evaluate_champion
    from rl_pipeline.trained_questions import write_trained_questions
    from tests.conftest import gsm8k_prompts

    prompts = gsm8k_prompts(4)
    champion_folder = store / "champion"
    shutil.copytree(tiny_model_dir, champion_folder)
    write_trained_questions(champion_folder, prompts.iloc[[0, 2]])
    _as_merge_leaves_it(champion_folder)
    with mlflow.start_run(run_name="merge"):
        number = publish_merged_model(str(champion_folder), PARAMS)["version"]
    model_registry.client().set_registered_model_alias(NAME, model_registry.CHAMPION, number)
    candidate, _ = _published(tiny_model_dir, store, 2)
    groups = resolve_followers({"eval": EvalParams(backend="hf", greedy=True),
                                "data": DataParams.model_validate(data_params),
                                "reward": RewardParams()})
    frame, champion = evaluate_champion(prompts, str(candidate), pd.DataFrame(), PARAMS,
                                        PromoteParams(), groups["eval"], groups["data"],
                                        groups["reward"], None)
    assert (champion["version"], champion["prompts"], champion["trained_on_prompts"]) == (
        number, 2, 2)
    # Its answers sit at the positions of the prompts they answer, beside the candidate's.
    assert list(frame["prompt_index"]) == [1, 3]
    truths = [row["ground_truth"] for row in prompts["reward_model"]]
    assert list(frame["ground_truth"]) == [truths[1], truths[3]]
    assert set(frame["model"]) == {"champion"}

    # The candidate has the champion's weights (the same model.safetensors): with the
    # candidate's answers at hand, the champion's are those, on its held-out prompts, and
    # nothing is generated (the answers given here are no model's).
    trained = frame.assign(model="trained", response="#### 7")
    trained = pd.concat([trained, trained.assign(prompt_index=[0, 2])], ignore_index=True)
    reused, champion = evaluate_champion(prompts, str(candidate), trained, PARAMS,
                                         PromoteParams(), groups["eval"], groups["data"],
                                         groups["reward"], None)
    assert champion["answers_of"] == "trained" and champion["prompts"] == 2
    assert list(reused["prompt_index"]) == [1, 3] and set(reused["model"]) == {"champion"}
    assert set(reused["response"]) == {"#### 7"}


def test_validation_prompts_the_model_trained_on_are_not_counted_against_its_eval(
        store, tiny_model_dir) -> None:
    """Eval leaves out the questions the model trained on: answering the rest is no quick
    check, and the evidence says how many were left out."""
    from rl_pipeline.params import EvalParams
    from rl_pipeline.pipelines.eval.nodes import record_eval, select_eval_prompts
    from rl_pipeline.trained_questions import write_trained_questions
    from tests.conftest import gsm8k_prompts

    val = gsm8k_prompts(6)
    folder = store / "merged"
    shutil.copytree(tiny_model_dir, folder)
    write_trained_questions(folder, val.head(2))
    _as_merge_leaves_it(folder)
    with mlflow.start_run(run_name="merge"):
        publish_merged_model(str(folder), PARAMS)
    trained = {"mean_reward": 0.6, "prompts": 4,
               "verdict": {"verdict": "learned", "reasons": ["up"]},
               "vs_base": {"mean_reward": _c(0.25, 0.05, 0.45),
                           "truncation_rate": _c(0.0, 0.0, 0.0)}, "by_data_source": {}}
    prompts, selection = select_eval_prompts(val, str(tiny_model_dir), str(folder), EvalParams())
    assert len(prompts) == 4
    with mlflow.start_run(run_name="eval"):
        record_eval({"base": {}, "trained": trained}, str(folder), {}, selection, PARAMS)
    evidence = model_registry.read_evidence(model_registry.alias(NAME, model_registry.CANDIDATE))
    assert (evidence["prompts"], evidence["validation_prompts"],
            evidence["trained_on_prompts"]) == (4, 4, 2)
    assert _promote()["promoted"] is True
