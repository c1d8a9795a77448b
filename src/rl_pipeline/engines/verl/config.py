"""The spec-name -> verl Hydra key table, and verl's own config composed from it.

One table holds the mapping (:data:`MAPPING`). Overrides are composed onto verl's
``ppo_trainer.yaml`` from the installed verl package, so a key that verl moves or renames
makes composition fail (Hydra's struct mode), in a test rather than on a GPU job.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from rl_pipeline.models.facts import max_positions
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams
from rl_pipeline.tracking import ARTIFACTS_BAR_ENV


@dataclass(frozen=True)
class Mapping:
    """One spec parameter and the verl key it sets (``add``: not in verl's schema;
    ``convert``: the spec value to verl's, where they differ)."""

    spec: str
    key: str
    add: bool = False
    convert: Callable[[Any], Any] | None = None
    note: str = ""  # what convert does, for docs/parameters.md

    def verl_value(self, value: Any) -> Any:
        return self.convert(value) if self.convert else value


_ACTOR = "actor_rollout_ref.actor"
_ROLLOUT = "actor_rollout_ref.rollout"
_MODEL = "actor_rollout_ref.model"
# verl hands these to `vllm serve` as flags (vllm_async_server.launch_server).
ENGINE_KWARGS = f"{_ROLLOUT}.engine_kwargs.vllm"

# Two offload settings that the default offload policy overrides (docs/parameters.md).
_UNDER_POLICY = ("in effect only with actor_fsdp_config_offload_policy false: verl 0.9.1's "
                 "FSDP2 engine offloads parameters and optimizer through the policy and then "
                 "ignores this")

MAPPING: tuple[Mapping, ...] = (
    Mapping("ENGINE", f"{_ROLLOUT}.name"),
    Mapping("rollout_name", f"{_ROLLOUT}.name"),
    Mapping("data_train_batch_size", "data.train_batch_size"),
    Mapping("data_max_prompt_length", "data.max_prompt_length"),
    Mapping("data_max_response_length", "data.max_response_length"),
    Mapping("data_filter_overlong_prompts", "data.filter_overlong_prompts"),
    Mapping("data_truncation", "data.truncation"),
    Mapping("data_image_key", "data.image_key"),
    Mapping("data_apply_chat_template_kwargs", "data.apply_chat_template_kwargs"),
    Mapping("algorithm_adv_estimator", "algorithm.adv_estimator"),
    Mapping("algorithm_use_kl_in_reward", "algorithm.use_kl_in_reward"),
    Mapping("actor_optim_lr", f"{_ACTOR}.optim.lr"),
    Mapping("actor_model_use_remove_padding", f"{_MODEL}.use_remove_padding"),
    # verl builds its models with the override_config's attn_implementation, else
    # flash_attention_2 (verl/workers/config/model.py), which no wheel of ours installs.
    Mapping("actor_model_attn_implementation", f"{_MODEL}.override_config.attn_implementation",
            add=True),
    Mapping("actor_strategy", f"{_ACTOR}.strategy"),
    Mapping("actor_fsdp_config_offload_policy", f"{_ACTOR}.fsdp_config.offload_policy"),
    Mapping("actor_ppo_mini_batch_size", f"{_ACTOR}.ppo_mini_batch_size"),
    Mapping("actor_rft_mini_batch_size", f"{_ACTOR}.ppo_mini_batch_size"),
    Mapping("actor_ppo_micro_batch_size_per_gpu", f"{_ACTOR}.ppo_micro_batch_size_per_gpu"),
    Mapping("actor_rft_micro_batch_size_per_gpu", f"{_ACTOR}.ppo_micro_batch_size_per_gpu"),
    Mapping("actor_model_lora_rank", f"{_MODEL}.lora_rank"),
    Mapping("actor_model_lora_alpha", f"{_MODEL}.lora_alpha"),
    Mapping("actor_model_target_modules", f"{_MODEL}.target_modules"),
    Mapping("actor_model_exclude_modules", f"{_MODEL}.exclude_modules"),
    Mapping("actor_use_kl_loss", f"{_ACTOR}.use_kl_loss"),
    Mapping("actor_kl_loss_coef", f"{_ACTOR}.kl_loss_coef"),
    Mapping("actor_kl_loss_type", f"{_ACTOR}.kl_loss_type"),
    Mapping("actor_entropy_coeff", f"{_ACTOR}.entropy_coeff"),
    Mapping("actor_model_enable_gradient_checkpointing", f"{_MODEL}.enable_gradient_checkpointing"),
    Mapping("actor_fsdp_param_offload", f"{_ACTOR}.fsdp_config.param_offload",
            note=_UNDER_POLICY),
    Mapping("actor_fsdp_optimizer_offload", f"{_ACTOR}.fsdp_config.optimizer_offload",
            note=_UNDER_POLICY),
    Mapping("rollout_log_prob_micro_batch_size_per_gpu",
            f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
    Mapping("rollout_tensor_model_parallel_size", f"{_ROLLOUT}.tensor_model_parallel_size"),
    Mapping("rollout_dtype", f"{_ROLLOUT}.dtype",
            note="bfloat16 on GPUs, the actor's precision there (the other values are "
            "refused); float32 or bfloat16 with device: cpu, where the actor follows it"),
    # Not in verl's schema: an engine kwarg, which verl hands to `vllm serve` as a flag.
    # vLLM 0.24 has no --disable-mm-preprocessor-cache (its parser exits 2); a cache of 0 GiB
    # is how it disables the cache. False leaves vLLM's default (null: verl drops the kwarg).
    Mapping("rollout_disable_mm_preprocessor_cache",
            f"{ENGINE_KWARGS}.mm_processor_cache_gb", add=True,
            convert=lambda disable: 0 if disable else None,
            note="true sets it to 0 (no cache), false leaves vLLM's default"),
    Mapping("rollout_gpu_memory_utilization", f"{_ROLLOUT}.gpu_memory_utilization"),
    Mapping("rollout_enable_chunked_prefill", f"{_ROLLOUT}.enable_chunked_prefill"),
    Mapping("rollout_enforce_eager", f"{_ROLLOUT}.enforce_eager"),
    Mapping("rollout_free_cache_engine", f"{_ROLLOUT}.free_cache_engine"),
    Mapping("rollout_n", f"{_ROLLOUT}.n"),
    Mapping("rollout_temperature", f"{_ROLLOUT}.temperature"),
    Mapping("rollout_top_p", f"{_ROLLOUT}.top_p"),
    Mapping("rollout_top_k", f"{_ROLLOUT}.top_k"),
    Mapping("rollout_do_sample", f"{_ROLLOUT}.do_sample",
            note="false is refused: verl 0.9.1's vLLM rollout samples at "
            "rollout_temperature whatever this says"),
    Mapping("rollout_val_temperature", f"{_ROLLOUT}.val_kwargs.temperature"),
    Mapping("rollout_val_top_p", f"{_ROLLOUT}.val_kwargs.top_p"),
    Mapping("rollout_val_top_k", f"{_ROLLOUT}.val_kwargs.top_k"),
    Mapping("ref_log_prob_micro_batch_size_per_gpu",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    Mapping("ref_fsdp_param_offload", "actor_rollout_ref.ref.fsdp_config.param_offload",
            note="no effect in verl 0.9.1: with LoRA there is no reference model (the actor "
            "without its adapter is the reference), and without LoRA its FSDP engine "
            "offloads the reference's parameters whatever this says"),
    Mapping("trainer_critic_warmup", "trainer.critic_warmup"),
    Mapping("trainer_n_gpus_per_node", "trainer.n_gpus_per_node"),
    Mapping("trainer_nnodes", "trainer.nnodes"),
    Mapping("trainer_save_freq", "trainer.save_freq",
            note="in training steps, as verl counts (rft_trainer's text says epochs); the "
            "last step is always saved, as merge needs"),
    Mapping("trainer_test_freq", "trainer.test_freq",
            note="in training steps, as verl counts (rft_trainer's text says epochs)"),
    Mapping("trainer_val_before_train", "trainer.val_before_train"),
    Mapping("trainer_total_epochs", "trainer.total_epochs"),
    Mapping("total_training_steps", "trainer.total_training_steps"),
    Mapping("trainer_max_actor_ckpt_to_keep", "trainer.max_actor_ckpt_to_keep"),
    Mapping("actor_optim_lr_scheduler_type", f"{_ACTOR}.optim.lr_scheduler_type"),
    Mapping("actor_optim_lr_warmup_steps_ratio", f"{_ACTOR}.optim.lr_warmup_steps_ratio"),
    Mapping("actor_optim_weight_decay", f"{_ACTOR}.optim.weight_decay"),
    Mapping("actor_clip_ratio", f"{_ACTOR}.clip_ratio_low"),
    Mapping("actor_clip_ratio", f"{_ACTOR}.clip_ratio_high"),
    Mapping("seed", "data.seed"),
    Mapping("seed", f"{_ROLLOUT}.seed"),
    Mapping("seed", f"{_ACTOR}.fsdp_config.seed"),
)
# Estimators that verl 0.9.1's v1 trainer cannot run: it calls compute_remax_outcome_advantage
# without the greedy-rollout reward_baselines that only the legacy trainer (main_ppo_v0,
# ray_trainer.fit) generates. Those run on the legacy trainer (trainer.use_v1=false).
LEGACY_TRAINER_ESTIMATORS = ("remax",)
# Our settings inside verl's config, read by our trainer (engines.verl.trainer): not verl's.
TRAINER_SETTINGS = "trainer.rl_pipeline"


def first_step_override(seconds: float | None) -> list[str]:
    """The setting our trainer logs the first step's time against (the forecast of that
    step; :mod:`rl_pipeline.engines.verl.trainer`); none without a forecast."""
    return [f"+{TRAINER_SETTINGS}.first_step_forecast_s={seconds}"] if seconds else []


# pypi_packages_override is no verl key: it becomes the Ray workers' runtime_env.
NOT_VERL_KEYS = ("pypi_packages_override",)
# The reward entry point verl loads: it runs the `reward` group's function (one source of
# truth with eval and the trl engine), with the group's settings as reward_kwargs.
REWARD_ENTRY = ("pkg://rl_pipeline.rewards.scoring", "verl_reward")
_RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env"
_BARE = re.compile(r"[A-Za-z_/][\w./-]*")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)", re.IGNORECASE)


@dataclass(frozen=True)
class LaunchInputs:
    """What the catalog and the session give verl: absolute paths and where to log."""

    train_files: str
    val_files: str
    model_path: str
    checkpoints_dir: str
    tracking_uri: str | None = None
    ray_address: str | None = None
    shared_root: str | None = None
    resume: str = "auto"  # train.resume: auto, never, or a global_step_N folder
    rollouts_per_step: int = 0  # train.rollouts_logged_per_step (the trainer's table)


def reward_overrides(reward: RewardParams, reward_path: str | None) -> list[str]:
    """verl's reward settings for the ``reward`` group: our entry point (:data:`REWARD_ENTRY`)
    with the whole group, as JSON, its one ``reward_kwargs`` entry (:func:`reward_json`),
    loaded by our reward manager.

    Args:
        reward: The ``reward`` group.
        reward_path: The reward file as verl's workers see it (on a cluster, the shipped
            module), or None for a built-in reward.
    """
    from rl_pipeline.engines.verl.reward_manager import OVERRIDES as REWARD_MANAGER_OVERRIDES

    group = reward_json(reward, path=reward_path)
    return [
        f"reward.custom_reward_function.path={_hydra_value(REWARD_ENTRY[0])}",
        f"reward.custom_reward_function.name={REWARD_ENTRY[1]}",
        f"+reward.custom_reward_function.reward_kwargs.reward={_hydra_value(group)}",
        *REWARD_MANAGER_OVERRIDES,
    ]


def reward_json(reward: RewardParams, *, path: str | None, strict: bool | None = None) -> str:
    """The ``reward`` group as :func:`rl_pipeline.rewards.scoring.verl_reward` reads it back:
    its file as verl's workers see it (``path``), and ``strict`` when a check overrides it."""
    fn = reward.custom_reward_function.model_copy(update={"path": path})
    update: dict[str, Any] = {"custom_reward_function": fn}
    if strict is not None:
        update["strict"] = strict
    return reward.model_copy(update=update).model_dump_json()


def resume_overrides(resume: str) -> list[str]:
    """``train.resume`` as verl's resume settings. The checkpoint folder is the run
    identity's own (:mod:`rl_pipeline.engines.run_identity`), so ``auto`` resumes only the
    same run."""
    if resume == "auto":
        return ["trainer.resume_mode=auto", "trainer.resume_from_path=null"]
    if resume == "never":
        return ["trainer.resume_mode=disable", "trainer.resume_from_path=null"]
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={_hydra_value(resume)}"]


def launch_overrides(values: dict[str, Any], inputs: LaunchInputs, reward: RewardParams,
                     critic: bool, pip: list[str], legacy_trainer: bool = False) -> list[str]:
    """The overrides that wire verl to the catalog, the reward, MLflow and Ray.

    Args:
        values: The spec values (with ``auto`` settings resolved).
        inputs: Paths from the catalog, the tracking URI and the Ray address.
        reward: The ``reward`` group.
        critic: Whether the estimator trains a critic (gae): it gets the actor's model and
            batch settings.
        pip: Requirement specifiers for the Ray workers (``pypi_packages_override``).
        legacy_trainer: Launch verl's legacy trainer (:data:`LEGACY_TRAINER_ESTIMATORS`).
    """
    from rl_pipeline.engines.verl.cluster import RewardTarget, shipped_modules
    from rl_pipeline.engines.verl.lora import initial_adapter_dir

    fn = reward.custom_reward_function
    target = RewardTarget(fn.path, fn.name)
    # On a cluster the reward file travels with the job and is imported as a module there.
    out = [
        f"data.train_files={_hydra_value(inputs.train_files)}",
        f"data.val_files={_hydra_value(inputs.val_files)}",
        f"actor_rollout_ref.model.path={_hydra_value(inputs.model_path)}",
        *reward_overrides(reward, target.on_workers if inputs.ray_address else fn.path),
        f"trainer.default_local_dir={_hydra_value(inputs.checkpoints_dir)}",
        *resume_overrides(inputs.resume),
        "trainer.logger=[console,mlflow]",
        "trainer.project_name=rl_pipeline",
        f"+{TRAINER_SETTINGS}.rollouts_logged_per_step={inputs.rollouts_per_step}",
        *rollout_length_overrides(values, max_positions(inputs.model_path)),
    ]
    if values.get("actor_model_lora_dropout") and values.get("actor_model_lora_rank"):
        # verl's engine has no dropout setting, but starts from an adapter's config.
        adapter = initial_adapter_dir(inputs.checkpoints_dir)
        out += [f"actor_rollout_ref.model.lora_adapter_path={_hydra_value(str(adapter))}",
                f"+{TRAINER_SETTINGS}.lora_dropout={values['actor_model_lora_dropout']}"]
    if legacy_trainer:
        out.append("trainer.use_v1=false")
    if critic:
        out += [f"critic.model.path={_hydra_value(inputs.model_path)}",
                f"critic.strategy={values['actor_strategy']}",
                f"+critic.model.override_config.attn_implementation="
                f"{values['actor_model_attn_implementation']}",
                f"critic.ppo_micro_batch_size_per_gpu="
                f"{values['actor_ppo_micro_batch_size_per_gpu']}"]
    if inputs.tracking_uri:
        out.append(f"+{_RUNTIME_ENV}.env_vars.MLFLOW_TRACKING_URI="
                   f"{_hydra_value(inputs.tracking_uri)}")
        out.append(f"+{_RUNTIME_ENV}.env_vars.{ARTIFACTS_BAR_ENV}={_hydra_value('false')}")
    if pip:
        out.append(f"+{_RUNTIME_ENV}.pip=[{','.join(_hydra_value(p) for p in pip)}]")
    if inputs.ray_address:
        out.append(f"+ray_kwargs.ray_init.address={_hydra_value(inputs.ray_address)}")
        # Other nodes do not have this package installed; verl imports the reward from it.
        modules = shipped_modules(target)
        out.append(f"+{_RUNTIME_ENV}.py_modules=[{','.join(_hydra_value(m) for m in modules)}]")
    return out


# vLLM's default batch of tokens per step, verl's rollout.max_num_batched_tokens.
VLLM_BATCHED_TOKENS = 8192
# The rollout keys sized from the data's caps (rollout_length_overrides).
ROLLOUT_LENGTH_KEYS = ("max_model_len", "max_num_batched_tokens")


def rollout_length_overrides(values: dict[str, Any], positions: int | None) -> list[str]:
    """The rollout's sequence length: our prompt and response caps, not the model's context
    (its ``positions``, None where unknown, still bound it: vLLM ends a response there).

    Unset, verl 0.9.1 gives vLLM the model's whole context (32,768 tokens for Qwen2.5) and,
    with chunked prefill off (the spec's default), raises max_num_batched_tokens to it, a
    frozen field of its RolloutConfig: the vLLM server fails in its constructor
    (vllm_async_server._validate_configs), after Ray and the actor started. A sequence here
    is never longer than prompt + response, and vLLM reserves memory for that instead."""
    length = values["data_max_prompt_length"] + values["data_max_response_length"]
    length = min(length, positions or length)
    model_len, batched = (f"{_ROLLOUT}.{key}" for key in ROLLOUT_LENGTH_KEYS)
    out = [f"{model_len}={length}"]
    if not values["rollout_enable_chunked_prefill"] and length > VLLM_BATCHED_TOKENS:
        out.append(f"{batched}={length}")
    return out


# Every run: the module that logs verl's per-sample warnings once per process, imported by
# every Ray process through verl's plugin hook (external_modules_override).
ONCE_MODULE = "rl_pipeline.engines.verl.once"


# ENGINE: hf on GPUs: the module that registers the transformers rollout with verl, imported
# by every Ray process through verl's plugin hook (verl's own CUDA platform and workers).
HF_ROLLOUT_MODULE = "rl_pipeline.engines.verl.hf_rollout"


def external_modules_override(*, cpu: bool, hf_rollout: bool) -> str:
    """verl's plugin hook (``VERL_USE_EXTERNAL_MODULES``) for every Ray process of the run:
    :data:`ONCE_MODULE`, then the CPU mode's (:data:`CPU_MODULE`, which registers the
    transformers rollout too) or, on GPUs with ``ENGINE: hf``, :data:`HF_ROLLOUT_MODULE`."""
    modules = [ONCE_MODULE, *([CPU_MODULE] if cpu else [HF_ROLLOUT_MODULE] if hf_rollout
                              else [])]
    return (f"+{_RUNTIME_ENV}.env_vars.VERL_USE_EXTERNAL_MODULES="
            f"{_hydra_value(','.join(modules))}")


# train.verl.device=cpu: the module that gives verl a CPU platform, workers and a rollout,
# imported by every Ray process through verl's plugin hook before verl reads the device
# (external_modules_override), and the environment it reads.
CPU_MODULE = "rl_pipeline.engines.verl.cpu"
CPU_ENV = {
    "VERL_PLATFORM": "cpu",
    # verl registers its FSDP engines for cuda and npu; the engine itself is device-agnostic.
    "VERL_ENGINE_DEVICE": "cuda",
    # verl compiles its entropy kernel with torch.compile by default: minutes on 2 cores.
    "TORCH_COMPILE_DISABLE": "1",
}


# verl's FSDP mixed-precision names for the rollout dtypes a CPU computes in.
_FSDP_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


def cpu_overrides(ranks: int, dtype: str, *, cluster: bool = False) -> list[str]:
    """verl on CPUs (train.verl.device=cpu), with ``ranks`` FSDP ranks per node.

    On this machine (``cluster`` false) verl starts a Ray of its own, told of one logical
    GPU per rank (verl's resource pools always ask for GPUs) and enough logical CPUs for
    verl's worker bundles (3 CPUs each) beside its TaskRunner, TransferQueue, agent-loop and
    reward actors, each cut to one process. On a Ray cluster (``train.ray_address``) each
    node declares its ranks itself (``ray start --num-gpus=<ranks>``: logical GPUs, which
    the preflight counts), and the ranks on different nodes meet over gloo.

    The actor computes in ``dtype``, the rollout's (``train.verl.rollout_dtype``): verl's
    FSDP default casts its parameters to bfloat16 whatever the rollout's precision, and a
    float32 rollout then samples a policy the bfloat16 actor cannot see (a LoRA step's
    small change is rounded away in bfloat16 sums; docs/gpu.md, "Does the rollout sample
    the policy being trained?"). Gradients are reduced and buffers kept in float32.
    """
    param = _FSDP_DTYPE[dtype]
    return [
        f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={{param_dtype:{param},"
        "reduce_dtype:fp32,buffer_dtype:fp32}",
        "trainer.device=cpu",
        # A Ray of its own, even where RAY_ADDRESS names a cluster (ray.init would join it).
        *([] if cluster else ["+ray_kwargs.ray_init.address=local",
                              f"+ray_kwargs.ray_init.num_gpus={ranks}",
                              f"ray_kwargs.ray_init.num_cpus={3 * ranks + 6}",
                              "+ray_kwargs.ray_init.include_dashboard=false"]),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        *[f"+{_RUNTIME_ENV}.env_vars.{key}={_hydra_value(value)}"
          for key, value in CPU_ENV.items()],
        # TransferQueue sets torch's threads to TQ_NUM_THREADS (8) around every put and get,
        # and warns at each where there are fewer physical cores (about 200 log lines a
        # 40-step run on 2 cores); it then uses the cores it found, as it will now.
        f"+{_RUNTIME_ENV}.env_vars.TQ_NUM_THREADS={_hydra_value(str(_tq_threads()))}",
    ]


def _tq_threads() -> int:
    import psutil

    return max(1, min(8, psutil.cpu_count(logical=False) or os.cpu_count() or 1))


def run_id_override(run_id: str) -> str:
    """Attach verl's MLflow logger to the train stage's run (added at launch only)."""
    return f"+{_RUNTIME_ENV}.env_vars.MLFLOW_RUN_ID={_hydra_value(run_id)}"


def judge_overrides() -> list[str]:
    """Where the judge this stage serves is (rl_pipeline.rewards.judge_server), for verl's
    reward workers (added at launch only: the port is the launch's own)."""
    from rl_pipeline.rewards.judge import MODEL_ENV, URL_ENV

    return [f"+{_RUNTIME_ENV}.env_vars.{key}={_hydra_value(os.environ[key])}"
            for key in (URL_ENV, MODEL_ENV) if os.environ.get(key)]


def owned_keys(launch: Iterable[str]) -> dict[str, str]:
    """verl key -> what sets it (a spec parameter, or the catalog), for refusing overrides."""
    owned = {m.key: f"train.verl.{m.spec}" for m in MAPPING}
    lengths = {f"{_ROLLOUT}.{key}" for key in ROLLOUT_LENGTH_KEYS}
    for override in launch:
        key = override_key(override)
        owned.setdefault(key, "data.data_max_prompt_length + data.data_max_response_length"
                         if key in lengths else "the catalog / the reward group")
    return owned


def override_key(override: str) -> str:
    """The dotted key of a Hydra override (``+a.b=1`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def command_line(overrides: list[str]) -> str:
    """The equivalent shell command: verl's own entry point with the same overrides."""
    return shlex.join(["python", "-m", "verl.trainer.main_ppo", *overrides])


def spec_values(verl: VerlParams, data: DataParams) -> dict[str, Any]:
    """Every mapped spec parameter's value, from ``train.verl`` and the shared ``data`` group."""
    return {**data.model_dump(), **verl.model_dump()}


def hydra_overrides(values: dict[str, Any], extra: Iterable[str] = ()) -> list[str]:
    """Hydra override strings for the mapped spec values, then ``extra`` (``key=value``)."""
    out, seen = [], set()
    for m in MAPPING:
        if m.key in seen:  # two specs' names for one key; preflight checks they agree
            continue
        seen.add(m.key)
        value = m.verl_value(values[m.spec])
        # A dict's keys are new to verl's struct config (apply_chat_template_kwargs: {}).
        prefix = "++" if isinstance(value, dict) and value else "+" if m.add else ""
        out.append(f"{prefix}{m.key}={_hydra_value(value)}")
    return [*out, *extra]


def compose_verl_config(overrides: list[str]) -> DictConfig:
    """verl's ``ppo_trainer`` config from the installed package, with ``overrides`` applied."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _hydra_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):  # a Hydra dict, e.g. {enable_thinking:false}
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if text.startswith("[") and text.endswith("]"):
        return text  # a Hydra list, e.g. [q_proj,v_proj]
    if _BARE.fullmatch(text) and text.lower() not in ("true", "false", "null", "none") and \
            not _NUMBER.fullmatch(text):
        return text  # Hydra reads it as this string; quotes would only clutter the command
    # Hydra's quoted strings keep a backslash as it is, except before a quote (the closing
    # one included), where backslashes are doubled: so '\\s' stays one backslash, as a
    # regular expression in the reward group needs.
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text).replace("'", "\\'")
    return "'" + escaped + "'"
