"""One source per default: the parameter models. The configuration files set only what they
change, parameters that mean one thing follow one owner, and Kedro validates the groups."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kedro.config import OmegaConfigLoader

from rl_pipeline.params import (
    FOLLOWERS,
    ConfigError,
    DataParams,
    RewardParams,
    cross_group_problems,
    disagreeing_followers,
    resolve_followers,
)
from rl_pipeline.params import PARAMETER_GROUPS as GROUPS
from rl_pipeline.params.verl import VerlParams
from tests.conftest import PROJECT_ROOT
from tests.projects import kedro_run, make_project

ENVIRONMENTS = sorted(p.name for p in (PROJECT_ROOT / "conf").iterdir()
                      if p.is_dir() and p.name not in ("base", "local"))


def _parameters(env: str) -> dict[str, Any]:
    return OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base",
                             default_run_env=env, merge_strategy={"parameters": "soft"}
                             )["parameters"]


def _leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _effective(params: dict[str, Any]) -> dict[str, Any]:
    """Every parameter's value as the models make it (defaults and followers filled in)."""
    return _leaves({group: GROUPS[group].model_validate(params.get(group) or {}).model_dump()
                    for group in GROUPS})


def test_base_configuration_has_every_group_and_only_known_parameters() -> None:
    params = _parameters("base")
    assert set(params) == set(GROUPS)  # each group present: Kedro validates what is there
    _effective(params)  # ConfigError names an unknown or invalid parameter


@pytest.mark.parametrize("env", ["base", *ENVIRONMENTS])
def test_no_configuration_repeats_a_value_it_would_get_anyway(env) -> None:
    """A line that restates a default (or base's value, in an environment) is a second copy
    of one fact, which drifts; the models hold the defaults, conf files the changes."""
    base = _effective(_parameters("base")) if env != "base" else _leaves(
        {group: model().model_dump() for group, model in GROUPS.items()})
    own = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env=env,
                            default_run_env=env)["parameters"]
    repeated = {name: value for name, value in _leaves(own).items()
                if value != {} and base.get(name) == value}
    assert repeated == {}, f"conf/{env} repeats what it would get anyway: {repeated}"


@pytest.mark.parametrize("env", ["base", *ENVIRONMENTS])
def test_every_configuration_validates_and_followers_agree(env) -> None:
    params = {group: model.model_validate(_parameters(env).get(group) or {})
              for group, model in GROUPS.items()}
    assert disagreeing_followers(params) == []


@pytest.mark.parametrize("follower", FOLLOWERS, ids=lambda f: f.name)
def test_a_follower_takes_its_owners_value_and_refuses_another(follower) -> None:
    group, _, rest = follower.name.partition(".")
    model = GROUPS[group]
    field = _field(model, rest)
    assert field.default is None, f"{follower.name} must default to null (follow)"
    assert follower.owner.rsplit(".", 1)[-1] in field.description, "say what it follows"

    def groups(follower_value: Any, owner_value: Any) -> dict[str, Any]:
        raw: dict[str, Any] = {}
        _set(raw, follower.owner, owner_value)
        if follower_value is not None:
            _set(raw, follower.name, follower_value)
        return raw

    owner_value = _other_value(follower.owner)
    # Unset or equal: the owner's value (inside a group the model fills it in).
    for value in (None, owner_value):
        raw = groups(value, owner_value)
        validated = {g: GROUPS[g].model_validate(raw.get(g) or {}) for g in GROUPS}
        assert disagreeing_followers(validated) == []
        if follower.name.split(".")[0] == follower.owner.split(".")[0]:
            assert _get(validated, follower.name) == owner_value
        # Across groups, once the run resolves them (rl_pipeline.hooks), before any node.
        assert _get(resolve_followers(validated), follower.name) == owner_value
    # Another value: refused, naming both.
    other = _other_value(follower.owner, avoid=owner_value)
    raw = groups(other, owner_value)
    try:
        validated = {g: GROUPS[g].model_validate(raw.get(g) or {}) for g in GROUPS}
    except ConfigError as exc:
        message = str(exc)
    else:
        message = "\n".join(disagreeing_followers(validated))
        with pytest.raises(ConfigError, match=f"{follower.name}="):
            resolve_followers(validated)
    assert f"{follower.name}={other!r}" in message and follower.owner in message, message


def test_a_follower_beside_no_owner_group_takes_the_owners_default() -> None:
    """A node given only its own groups (a test, a sliced pipeline) never reads a null
    follower; one set by hand is kept, there being nothing to disagree with."""
    from rl_pipeline.params import EvalParams

    alone = resolve_followers({"eval": EvalParams()})["eval"]
    assert (alone.rollout_val_temperature, alone.rollout_val_top_p, alone.rollout_val_top_k,
            alone.max_new_tokens) == (0.7, 0.7, -1, DataParams().data_max_response_length)
    assert resolve_followers({"eval": EvalParams(rollout_val_temperature=1.0)})[
        "eval"].rollout_val_temperature == 1.0
    # The spec's one validation temperature, set where the spec puts it, reaches eval too.
    train = GROUPS["train"].model_validate({"verl": {"rollout_val_temperature": 0.2}})
    assert resolve_followers({"eval": EvalParams(), "train": train})[
        "eval"].rollout_val_temperature == 0.2


def test_a_flag_for_a_number_and_a_union_are_told_as_one_parameter() -> None:
    """pydantic's lax mode read `rollout_n: true` as 1 (sampling once), and named each member
    of a union as a parameter of its own ("2 invalid parameter(s)" for one bad value)."""
    with pytest.raises(ConfigError) as err:
        VerlParams.model_validate({"rollout_n": True, "trainer_n_gpus_per_node": "eight",
                                   "rollout_tensor_model_parallel_size": 0})
    lines = str(err.value).splitlines()
    assert lines[0] == "3 invalid parameter(s) in 'train.verl':"
    assert sorted(lines[1:]) == [
        "  - train.verl.rollout_n=True: a number, not true or false",
        "  - train.verl.rollout_tensor_model_parallel_size=0: Input should be greater than or "
        "equal to 1; or 'auto'",
        "  - train.verl.trainer_n_gpus_per_node='eight': Input should be a valid integer, "
        "unable to parse string as an integer; or 'auto'"]
    assert VerlParams.model_validate({"rollout_do_sample": True}).rollout_do_sample
    # Through Annotated and unions (true was 1 GPU), and inside a list.
    for field in ("trainer_n_gpus_per_node", "gpu_memory_gib"):
        with pytest.raises(ConfigError, match=f"{field}=True: a number, not true or false"):
            VerlParams.model_validate({field: True})
    from rl_pipeline.params import EvalParams

    with pytest.raises(ConfigError, match=r"eval.pass_k=\[True, 2\]: numbers, not true"):
        EvalParams.model_validate({"pass_k": [True, 2]})


def test_the_rollout_engine_follows_the_device() -> None:
    cpu = VerlParams.model_validate({"device": "cpu"})
    assert (cpu.ENGINE, cpu.rollout_name) == ("hf", "hf")  # and rollout_name follows ENGINE
    assert VerlParams.model_validate({}).ENGINE == "vllm"  # the spec's default on GPUs
    # Set by hand it is kept, for the preflight to refuse by name (check_cpu).
    assert VerlParams.model_validate({"device": "cpu", "ENGINE": "vllm"}).ENGINE == "vllm"


@pytest.mark.slow
def test_kedro_validates_the_groups_and_followers_before_any_node_runs(tmp_path) -> None:
    project = make_project(tmp_path)
    typo = kedro_run(project, "--pipelines", "data_prep", "--params",
                     "train.trl.learning_rat=0.1")
    assert typo.returncode != 0
    assert "train.trl.learning_rat: unknown parameter" in typo.stdout + typo.stderr
    disagree = kedro_run(project, "--pipelines", "data_prep", "--params",
                         "eval.max_new_tokens=5")
    assert disagree.returncode != 0
    output = disagree.stdout + disagree.stderr
    assert "eval.max_new_tokens=5" in output and "data.data_max_response_length" in output
    # A gate metric that eval will not compare fails data_prep, not promote hours later.
    gate = kedro_run(project, "--pipelines", "data_prep", "--params",
                     "promote.metric=strict_acuracy")
    assert gate.returncode != 0
    assert "promote.metric='strict_acuracy': eval compares mean_reward, " in \
        gate.stdout + gate.stderr
    assert not list((project / "data/05_model_input").rglob("*.parquet"))  # nothing ran


SESSION_CATALOG = """
import json, sys
from pathlib import Path
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

bootstrap_project(Path.cwd())
with KedroSession.create(project_path=Path.cwd(), env="cpu") as session:
    catalog = session.load_context().catalog
    print(json.dumps({key: catalog[key].load() for key in sys.argv[1:]}))
"""


@pytest.mark.slow  # a Kedro session in a fresh process, imports included
def test_nodes_are_handed_the_followers_resolved_under_every_key(tmp_path) -> None:
    """The catalog a run hands its nodes: a follower holds its owner's value in its group and
    under its own key (Kedro adds params:<group>.<field> beside params:<group>)."""
    import json
    import subprocess
    import sys

    project = make_project(tmp_path)
    keys = ["params:train.trl.max_completion_length", "params:train.ray_address"]
    done = subprocess.run([sys.executable, "-c", SESSION_CATALOG, *keys], cwd=project,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    values = json.loads(done.stdout.strip().splitlines()[-1])
    # conf/cpu caps responses at 48 (data.data_max_response_length); nothing sets the follower.
    assert values == {"params:train.trl.max_completion_length": 48,
                      "params:train.ray_address": None}


def _field(model: Any, path: str) -> Any:
    *parents, leaf = path.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
    return model.model_fields[leaf]


def _other_value(path: str, avoid: Any = None) -> Any:
    group, _, rest = path.partition(".")
    default = _field(GROUPS[group], rest).get_default(call_default_factory=True)
    if isinstance(default, str):
        return "sglang" if avoid != "sglang" else "trtllm"
    if isinstance(default, float):
        return 0.5 if avoid != 0.5 else 0.4
    if isinstance(default, dict):
        thinking = {"enable_thinking": False}
        return thinking if avoid != thinking else {"enable_thinking": True}
    return 64 if avoid != 64 else 32


def _set(raw: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        raw = raw.setdefault(part, {})
    raw[leaf] = value


def _get(groups: dict[str, Any], path: str) -> Any:
    group, *parts = path.split(".")
    value = groups[group]
    for part in parts:
        value = getattr(value, part)
    return value


def test_train_resume_takes_auto_never_or_a_checkpoint_folder(tmp_path) -> None:
    from rl_pipeline.params.train import TrainParams

    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "weights").mkdir()
    assert TrainParams(resume="never").resume == "never"
    assert TrainParams(resume=str(tmp_path / "checkpoint-4")).resume == \
        str(tmp_path / "checkpoint-4")
    for value, why in ((tmp_path / "global_step_3", "not a folder"),
                       (tmp_path / "weights", "not named so")):
        with pytest.raises(ConfigError) as failure:
            TrainParams.model_validate({"resume": str(value)})
        assert f"train.resume={str(value)!r}" in str(failure.value) and why in str(
            failure.value), str(failure.value)


def test_the_overlong_buffer_must_lie_inside_the_response_cap() -> None:
    groups = {"reward": RewardParams(overlong_buffer_len=64),
              "data": DataParams(data_max_response_length=64)}
    (problem,) = cross_group_problems(groups)
    assert problem.startswith("reward.overlong_buffer_len=64: must be below the response cap "
                              "data.data_max_response_length (64)")
    groups["data"] = DataParams(data_max_response_length=256)
    assert cross_group_problems(groups) == []


def test_a_code_data_source_under_a_builtin_reward_is_refused_before_any_stage() -> None:
    """verl's default_compute_score would run the model's code for 'apps' on this machine."""
    from rl_pipeline.params import DataPrepParams

    groups = {"reward": RewardParams(), "data_prep": DataPrepParams(data_source="apps")}
    (problem,) = cross_group_problems(groups)
    assert problem.startswith("data_prep.data_source='apps': reward.custom_reward_function."
                              "name=compute_score hands data_source 'apps' to verl's "
                              "default_compute_score, whose scorer for it (prime_code) runs")
    groups["reward"] = RewardParams(custom_reward_function={"path": "my_sandboxed.py"})
    assert cross_group_problems(groups) == []
    groups = {"reward": RewardParams(), "data_prep": DataPrepParams(data_source="exact_match")}
    assert cross_group_problems(groups) == []



@pytest.mark.parametrize(("terms", "extra", "message"), [
    ([{"name": "compute_score"}], {"custom_reward_function": {"name": "strict_gsm8k"}},
     "reward.terms and reward.custom_reward_function are both set"),
    ([{"name": "compute_score"}, {"name": "compute_score", "weight": 2}], {},
     "the label(s) ['compute_score'] name several terms"),
    ([{"name": "compute_score", "label": "is right?"}], {}, "letters, digits and _ only"),
    # A misspelt built-in: found when data_prep's self-test built the reward, after tokenising
    ([{"name": "compute_score"}, {"name": "well_formd"}], {},
     "reward.terms[1].name='well_formd' is not a built-in reward; built-ins: compute_score, "),
    ([], {"custom_reward_function": {"name": "strict_gsm"}},
     "reward.custom_reward_function.name='strict_gsm' is not a built-in reward"),
])
def test_reward_terms_are_checked(terms, extra, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        RewardParams.model_validate({"terms": terms, **extra})


@pytest.mark.parametrize(("template", "message"), [
    ("{question", "(expected '}' before end of string; a literal brace is written {{ or }})"),
    ("{} {question}", "each a field's name alone (no position, attribute or index): {}"),
    ("{q.upper} {r[0]}", "(no position, attribute or index): {q.upper}, {r[0]}"),
    ("{question:d}", "(Unknown format code 'd' for object of type 'str': a record's fields "
                     "are text here)"),
    ("Solve it.", "; this one names no field"),
])
def test_a_prompt_template_that_cannot_fill_is_refused_before_any_record(template,
                                                                          message) -> None:
    from rl_pipeline.params import DataPrepParams

    with pytest.raises(ConfigError) as err:
        DataPrepParams.model_validate({"prompt_template": template})
    assert f"  - data_prep.prompt_template={template!r}: a Python format string of named " \
           "record fields" in str(err.value)
    assert message in str(err.value)
    assert DataPrepParams.model_validate(  # a field name with a dash or a space is a key
        {"prompt_template": "{Q-1} {my field} {{literal}}"}).prompt_template


@pytest.mark.parametrize(("regex", "message"), [
    (None, "needs a pattern"),
    ("####", "needs a group: (...) around the answer"),
    ("(unclosed", "needs a valid regular expression (missing ), unterminated subpattern"),
])
def test_regex_extraction_needs_a_pattern_with_a_group(regex, message) -> None:
    from rl_pipeline.params import DataPrepParams

    with pytest.raises(ConfigError) as err:
        DataPrepParams.model_validate({"answer_extraction": "regex", "answer_regex": regex})
    assert f"data_prep.answer_regex={regex!r}: answer_extraction 'regex' takes group 1 of " \
           "this pattern as the ground truth, so it " + message in str(err.value)
    assert DataPrepParams.model_validate({"answer_extraction": "regex",
                                          "answer_regex": r"#### (\d+)"}).answer_regex


def test_zero_steps_and_negative_guard_tolerances_are_refused_by_name() -> None:
    from rl_pipeline.params.model_registry import PromoteParams
    from rl_pipeline.params.trl import TrlParams

    with pytest.raises(ConfigError) as err:
        TrlParams.model_validate({"max_steps": 0})
    assert "train.trl.max_steps=0: a positive number of steps, or -1 to train " \
           "num_train_epochs" in str(err.value)
    with pytest.raises(ConfigError) as err:
        PromoteParams.model_validate({"guards": {"truncation_rate": -0.5,
                                                 "repetition_rate": 0.0}})
    assert "  - promote.guards.truncation_rate=-0.5: a tolerance of 0 or more" in str(err.value)
    assert "repetition_rate" not in str(err.value)


def test_a_missing_field_of_a_worked_example_is_named_as_missing() -> None:
    """It read `data_prep.few_shot.0.answer={'question': 'x'}: Field required`: the
    example given as the answer's value."""
    from rl_pipeline.params import DataPrepParams

    with pytest.raises(ConfigError) as err:
        DataPrepParams.model_validate({"few_shot": [{"question": "x"}]})
    assert str(err.value).endswith(
        "  - data_prep.few_shot.0.answer: missing (required; given {'question': 'x'})")


@pytest.mark.parametrize(("group", "values", "left_out", "kept"), [
    ("eval", {"greedy": True, "n_samples": 4}, "n_samples", "greedy"),
    ("train", {"engine": "trl"}, "verl", "trl"),
    ("reward", {"custom_reward_function": {"name": "compute_score"}}, "judge", "strict"),
], ids=["greedy eval", "trl train", "no judge"])
def test_a_run_logs_no_parameter_its_other_values_make_irrelevant(group, values, left_out,
                                                                  kept) -> None:
    from rl_pipeline.hooks import _logged

    logged = _logged(GROUPS[group].model_validate(values))
    assert left_out not in logged and kept in logged
    # Sampling, or an engine left to choose (auto): every setting may be used, all logged.
    relevant = {"eval": {"n_samples": 4}, "train": {"engine": "auto"},
                "reward": {"custom_reward_function": {"name": "judge"},
                           "judge": {"url": "http://judge:8000/v1", "model": None,
                                     "served_model": "qwen"}}}[group]
    assert left_out in _logged(GROUPS[group].model_validate(relevant))


def test_a_nested_groups_irrelevant_parameters_are_left_out_too() -> None:
    """A TRL run logged num_train_epochs under max_steps, the eval and vLLM settings of a run
    without evaluation or vLLM."""
    from rl_pipeline.hooks import _logged

    trl = _logged(GROUPS["train"].model_validate(
        {"engine": "trl", "trl": {"max_steps": 40}}))["trl"]
    assert {"num_train_epochs", "eval_steps", "vllm_mode", "per_device_eval_batch_size"
            }.isdisjoint(trl)
    assert {"max_steps", "learning_rate", "lora_rank"} <= set(trl)
    every = _logged(GROUPS["train"].model_validate(
        {"engine": "trl", "trl": {"eval_strategy": "steps", "use_vllm": True}}))["trl"]
    assert {"num_train_epochs", "eval_steps", "vllm_mode"} <= set(every)
