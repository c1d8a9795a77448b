"""The spec -> TRL 1.12 GRPOConfig table against the installed trl, and the LoRA config."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from trl import GRPOConfig

from rl_pipeline.engines.trl.config import (
    MAPPING,
    NOT_GRPO_KEYS,
    grpo_config,
    grpo_values,
    lora_config,
)
from rl_pipeline.params import (
    FOLLOWERS,
    ConfigError,
    DataParams,
    DataPrepParams,
    resolve_followers,
)
from rl_pipeline.params.train import TrainParams
from rl_pipeline.params.trl import TrlParams
from tests.engines.spec_facts import same_default, spec_defaults

COMPONENT = "group_relative_policy_optimization"
# Spec inputs that are not train.trl parameters: the catalog (raw_train, raw_val,
# base_model) and the data_prep group (the prompt column).
ELSEWHERE = {"dataset_train_split", "dataset_validation_split", "model_name_or_path",
             "dataset_name", "dataset_prompt_column"}
# Forced off on CPU, whatever the parameter says.
CPU_OFF = {"use_liger_kernel", "use_vllm"}
# A value other than the default for every mapped parameter (valid together for GRPOConfig).
CHANGED = dict(
    beta=0.04, epsilon=0.2, num_iterations=2, num_generations=2, num_train_epochs=2.5,
    max_steps=7, per_device_train_batch_size=4, per_device_eval_batch_size=6,
    gradient_accumulation_steps=3, learning_rate=1e-5, warmup_ratio=0.05, max_grad_norm=0.5,
    optim="sgd", lr_scheduler_type="linear", max_completion_length=64, temperature=0.9,
    top_p=0.95, do_eval=True, eval_strategy="steps", eval_steps=3, logging_steps=2,
    save_steps=50, save_total_limit=3, shuffle_dataset=False, vllm_gpu_memory_utilization=0.5,
    vllm_tensor_parallel_size=2, loss_type="grpo", scale_rewards="batch", seed=7,
    vllm_mode="server", chat_template_kwargs={"enable_thinking": False},
)

FOLLOWED = {f.name for f in FOLLOWERS}


def test_every_spec_parameter_is_ours_with_the_spec_default() -> None:
    defaults = spec_defaults(COMPONENT)
    ours = TrlParams().model_dump()
    handled = {m.spec for m in MAPPING} | set(NOT_GRPO_KEYS)
    for name, default in defaults.items():
        if name in ELSEWHERE:
            assert name not in ours, f"{name} comes from the catalog or data_prep"
            continue
        assert name in ours, f"spec parameter {name} is missing"
        assert name in handled, f"spec parameter {name} is neither mapped nor placed"
        if f"train.trl.{name}" in FOLLOWED:  # one owner: its default, the spec's noted
            assert ours[name] is None, name
            assert f"spec default {default}" in TrlParams.model_fields[name].description, name
            continue
        assert same_default(default, ours[name]), f"{name}: spec {default}, ours {ours[name]}"
    assert len(defaults) == 35
    assert same_default(defaults["dataset_prompt_column"], DataPrepParams().dataset_prompt_column)


def test_every_parameter_is_mapped_or_placed_exactly_once() -> None:
    mapped = [m.spec for m in MAPPING]
    assert len(mapped) == len(set(mapped))
    assert not set(mapped) & set(NOT_GRPO_KEYS)
    assert set(mapped) | set(NOT_GRPO_KEYS) == set(TrlParams.model_fields)


def test_every_mapped_field_is_a_grpo_config_field_that_the_table_changes() -> None:
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    assert set(CHANGED) | CPU_OFF == {m.spec for m in MAPPING}
    for m in MAPPING:
        assert m.field in fields, f"{m.spec} -> {m.field}: no such GRPOConfig field"
        if m.spec in CPU_OFF:
            continue
        # At least one of the two cases below sets something other than TRL's default.
        trl_default = fields[m.field].default
        assert any(v != trl_default for v in (getattr(TrlParams(), m.spec), CHANGED[m.spec])), \
            m.spec


@pytest.mark.parametrize("values", [{}, CHANGED], ids=["spec_defaults", "changed"])
def test_every_mapped_value_arrives_in_grpo_config(values, tmp_path) -> None:
    # Followers set as their owners: the owner's value reaches GRPOConfig either way.
    owners = {"data_max_response_length": values.get("max_completion_length", 2048),
              "data_apply_chat_template_kwargs": values.get("chat_template_kwargs", {})}
    memory = {"rollout_gpu_memory_utilization": values.get("vllm_gpu_memory_utilization", 0.6)}
    train = TrainParams.model_validate({"trl": values, "verl": memory})
    params = resolve_followers({"train": train, "data": DataParams(**owners)})["train"].trl
    config = grpo_config(params, str(tmp_path), use_cpu=True)
    for m in MAPPING:
        want = False if m.spec in CPU_OFF else getattr(params, m.spec)
        got = getattr(config, m.field)
        assert got == want, f"{m.spec} -> {m.field}: {got!r} != {want!r}"
    assert grpo_values(params)["warmup_steps"] == params.warmup_ratio < 1  # a ratio to TRL


def test_cpu_turns_off_gpu_only_settings_without_error(tmp_path, caplog) -> None:
    params = TrlParams(use_liger_kernel=True, use_vllm=True, deepspeed_config="/no/ds.json")
    with caplog.at_level(logging.WARNING):
        config = grpo_config(params, str(tmp_path), use_cpu=True, report_to="none")
    assert (config.use_cpu, config.bf16, config.deepspeed) == (True, False, None)
    assert (config.use_liger_kernel, config.use_vllm) == (False, False)
    for name in ("use_liger_kernel", "use_vllm", "deepspeed_config"):
        assert f"train.trl.{name} is ignored on CPU" in caplog.text


def test_gpu_keeps_gpu_settings(tmp_path) -> None:
    # bf16=False only because this test runs where there is no GPU.
    config = grpo_config(TrlParams(use_liger_kernel=True, use_vllm=True), str(tmp_path),
                         use_cpu=False, bf16=False, save_strategy="no")
    assert (config.use_cpu, config.use_liger_kernel, config.use_vllm) == (False, True, True)
    assert config.deepspeed is None and config.save_strategy == "no"


def test_extra_cannot_overrule_the_table(tmp_path) -> None:
    with pytest.raises(ValueError, match="learning_rate"):
        grpo_config(TrlParams(), str(tmp_path), use_cpu=True, learning_rate=1.0)


@pytest.mark.parametrize("name", ["optim", "lr_scheduler_type", "eval_strategy", "loss_type",
                                  "scale_rewards", "vllm_mode", "algorithm_adv_estimator",
                                  "apply_lora"])
def test_a_bad_enum_value_names_the_parameter(name) -> None:
    with pytest.raises(ConfigError, match=rf"train\.trl\.{name}='nonsense'"):
        TrlParams.model_validate({name: "nonsense"})


def test_plateau_schedule_needs_an_eval_strategy() -> None:
    with pytest.raises(ConfigError, match="train.trl.eval_strategy='no'.*reduce_lr_on_plateau"):
        TrlParams.model_validate({"lr_scheduler_type": "reduce_lr_on_plateau"})
    TrlParams.model_validate({"lr_scheduler_type": "reduce_lr_on_plateau",
                              "eval_strategy": "epoch"})


def test_spec_strings_and_trl_booleans_are_accepted() -> None:
    params = TrlParams.model_validate({"apply_lora": "false", "scale_rewards": False})
    assert (params.apply_lora, params.scale_rewards) == (False, "none")
    assert TrlParams.model_validate({"apply_lora": "true"}).apply_lora is True


def _adapted(model_dir, params: TrlParams) -> tuple[dict[str, int], int, set[float]]:
    """What peft does to the tiny model with our LoraConfig: the adapted module kinds (how
    many of each), the trainable parameters, and the scales (alpha / r) it applies."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir)),
                           lora_config(params))
    kinds: dict[str, int] = {}
    scales = set()
    for name, module in model.named_modules():
        if "default" in getattr(module, "lora_A", {}):
            kinds[name.rsplit(".", 1)[-1]] = kinds.get(name.rsplit(".", 1)[-1], 0) + 1
            scales.add(module.scaling["default"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return kinds, trainable, scales


def test_lora_adapts_the_named_modules_at_the_rank_and_scale_set(tiny_model_dir) -> None:
    """Counted by hand on the tiny Qwen2 (2 layers, hidden 64, 4 heads of 16, 2 key/value
    heads, MLP 128): a rank-r adapter on a d_in x d_out layer trains r x (d_in + d_out)."""
    kinds, trainable, scales = _adapted(tiny_model_dir, TrlParams(
        lora_rank=8, lora_alpha=16, lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj"]))
    assert kinds == {"q_proj": 2, "v_proj": 2}
    assert trainable == 2 * (8 * (64 + 64) + 8 * (64 + 32))  # 3,584
    assert scales == {16 / 8}
    # The defaults: every linear layer but the output head, rank 16, alpha 32.
    kinds, trainable, scales = _adapted(tiny_model_dir, TrlParams())
    assert kinds == {k: 2 for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj")}
    per_layer = 16 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert trainable == 2 * per_layer  # 32,768
    assert scales == {32 / 16}


def test_no_lora_config_when_apply_lora_is_false() -> None:
    assert lora_config(TrlParams.model_validate({"apply_lora": "false"})) is None
