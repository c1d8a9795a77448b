"""The verl preflight: compose verl's config for a run and check it, as far as a CPU can.

It works through the modules beside it in one pass: the rules verl's workers would raise on
later (``preflight``), the cluster (``cluster``), verl's own config classes, the prompts and the
reward (``checks``), the machine's arithmetic (``host``) and vLLM's command line
(``vllm_args``), and reports every problem at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from rl_pipeline.engines.problems import PreflightError, Problem
from rl_pipeline.engines.verl.checks import (
    check_chat_template,
    check_prompts,
    check_reward,
    check_vllm_args,
    resolved_yaml,
    validate_with_verl,
)
from rl_pipeline.engines.verl.cluster import (
    RewardTarget,
    WorkerPaths,
    check_nodes,
    check_shipped_reward,
    check_storage,
    check_tracking,
    check_tracking_credentials,
    on_cluster,
)
from rl_pipeline.engines.verl.config import (
    LEGACY_TRAINER_ESTIMATORS,
    LaunchInputs,
    command_line,
    compose_verl_config,
    cpu_overrides,
    external_modules_override,
    hydra_overrides,
    launch_overrides,
    override_key,
    owned_keys,
    spec_values,
)
from rl_pipeline.engines.verl.host import (
    check_driver,
    disk_plan,
    disk_problem,
    driver_problem,
    driver_version,
    free_gib,
    local_cpus,
    memory_plan,
    memory_problem,
    ray_cpu_problem,
    ray_cpus_needed,
    times_in,
)
from rl_pipeline.engines.verl.preflight import (
    HF_ROLLOUT,
    Hardware,
    check_attention,
    check_gpus,
    check_rollout_engine,
    check_verl,
    requirements,
    resolve_hardware,
)
from rl_pipeline.engines.work import StepWork
from rl_pipeline.models.facts import (
    GiB,
    ModelFacts,
    lora_target_names,
    lora_target_problem,
)
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.verl import VerlParams

logger = logging.getLogger(__name__)

# What a run with the transformers rollout on GPUs is told (preflight's log and report).
HF_ROLLOUT_NOTE = ("the transformers rollout, a first-light and fallback mode for a machine "
                   "without vLLM: verl's CUDA workers, NCCL and weight sync as usual, but "
                   "generation without vLLM's paged attention or batching, several times "
                   "slower; install the gpu extra and set ENGINE: vllm for real runs")


@dataclass
class VerlPlan:
    """A checked launch: the overrides (verl's command line), the config, what was checked."""

    overrides: list[str]
    config: DictConfig
    hardware: Hardware
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return command_line(self.overrides)


def plan_verl(verl: VerlParams, data: DataParams, reward: RewardParams, inputs: LaunchInputs,
              *, gpus_visible: int, training: bool, train_rows: int | None = None,
              contact_cluster: bool = False) -> VerlPlan:
    """Compose verl's config for this run and check it, as far as a CPU can.

    Args:
        verl: ``train.verl``.
        data: The shared ``data`` group.
        reward: The ``reward`` group.
        inputs: The catalog's paths, the tracking URI and the Ray address.
        gpus_visible: CUDA GPUs on this machine.
        training: Training starts next: this machine must have the GPUs (checked first, with
            one message). Otherwise only the configuration is checked, on any machine.
        train_rows: Rows of ``train_prompts``, for the batch-size check.
        contact_cluster: With a Ray address, run a check task on every node of the cluster
            (:func:`~rl_pipeline.engines.verl.cluster.check_nodes`). Off, only the
            configuration is checked, offline.

    Raises:
        GPUsNeededError: When training on a machine without enough GPUs.
        PreflightError: Listing every problem found.
    """
    started = time.perf_counter()
    # Only checking: `auto` resolves as on a one-GPU machine when this one has none.
    trains_here = training and not inputs.ray_address
    hardware = resolve_hardware(verl, gpus_visible if trains_here else max(gpus_visible, 1))
    cpu = hardware.device == "cpu"  # decided there, once; the rest of the plan reads it
    # The driver needs GPUs only when it is the machine that trains (no Ray cluster).
    local = trains_here and not cpu
    if local:
        # An old driver shows as no GPUs at all: say so first, naming both versions.
        check_driver()
        check_gpus(hardware, gpus_visible, verl.trainer_n_gpus_per_node)
    problems = check_verl(verl, data, hardware, train_prompts=train_rows,
                          gpus_visible=gpus_visible if local else None,
                          ray_address=inputs.ray_address)
    if not inputs.ray_address:  # on a cluster each node checks its own (check_nodes)
        problems += check_attention(verl)
    paths = WorkerPaths(inputs.train_files, inputs.val_files, inputs.model_path,
                        inputs.checkpoints_dir)
    target = RewardTarget(reward.custom_reward_function.path, reward.custom_reward_function.name)
    report: dict[str, Any] = {"hardware": asdict(hardware), "gpus_visible": gpus_visible,
                              "training": training}
    problems += check_tracking_credentials(inputs.tracking_uri)
    if on_cluster(hardware, inputs.ray_address):
        if inputs.ray_address and verl.trainer_n_gpus_per_node == "auto":
            problems.append(Problem("trainer_n_gpus_per_node", "auto", "a number on a Ray "
                                    "cluster (auto counts the driver's GPUs)"))
        problems += check_storage(paths, inputs.shared_root)
        problems += check_tracking(inputs.tracking_uri)
        if inputs.ray_address:
            problems += check_shipped_reward(target)
    if local:
        problems += check_rollout_engine(verl)
    if inputs.ray_address and contact_cluster:
        problems += check_nodes(inputs.ray_address, hardware, paths, target, report,
                                attention=verl.actor_model_attn_implementation,
                                rollout=verl.ENGINE, training=training)
    values = {**spec_values(verl, data), "trainer_n_gpus_per_node": hardware.gpus_per_node,
              "rollout_tensor_model_parallel_size": hardware.tensor_parallel,
              "trainer_total_epochs": epochs_for(verl, train_rows)}
    launch = launch_overrides(values, inputs, reward,
                              critic=verl.algorithm_adv_estimator == "gae",
                              pip=requirements(verl.pypi_packages_override),
                              legacy_trainer=verl.algorithm_adv_estimator
                              in LEGACY_TRAINER_ESTIMATORS)
    if cpu:
        launch += cpu_overrides(hardware.gpus_per_node, verl.rollout_dtype,
                                cluster=bool(inputs.ray_address))
    elif verl.ENGINE == HF_ROLLOUT:
        report["rollout"] = HF_ROLLOUT_NOTE
        logger.warning("train.verl.ENGINE=hf on GPUs: %s", HF_ROLLOUT_NOTE)
    launch.append(external_modules_override(cpu=cpu, hf_rollout=verl.ENGINE == HF_ROLLOUT))
    # An override that repeats one of the launch's (a configuration written for a 2-core
    # cluster sets what the CPU mode sets too) says nothing new: dropped, not refused.
    launched = {k.lstrip("+") for k in launch}
    user = [o for o in verl.overrides if o.lstrip("+") not in launched]
    problems += _check_user_overrides(user, launch)
    overrides = hydra_overrides(values, [*launch, *user])
    try:
        config = compose_verl_config(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        problems += _composition_problems(values, launch, user, exc)
        raise PreflightError(problems) from None
    problems += validate_with_verl(config)
    problems += _check_inputs(config, inputs, reward, target, report)
    problems += _check_host(verl, config, inputs, report, cpu=cpu, local=local,
                            cluster=on_cluster(hardware, inputs.ray_address))
    if not cpu and verl.ENGINE != HF_ROLLOUT and \
            not any(p.parameter == "base_model" for p in problems):
        # verl reads the model's config to build vLLM's command line
        problems += check_vllm_args(config, verl.overrides, report)
    if problems:
        raise PreflightError(problems)
    report["seconds"] = round(time.perf_counter() - started, 2)
    logger.info("verl preflight passed in %.1fs: %d GPU(s) x %d node(s), tensor parallel %d",
                report["seconds"], hardware.gpus_per_node, hardware.nnodes,
                hardware.tensor_parallel)
    return VerlPlan(overrides=overrides, config=config, hardware=hardware, report=report)


def epochs_for(verl: VerlParams, train_rows: int | None) -> int:
    """The epochs verl is given: ``trainer_total_epochs``, or with ``total_training_steps``
    set, enough whole epochs of ``train_rows`` for those steps (without the rows, as given).

    verl 0.9.1 stops at whichever comes first, its epochs or its steps (the loop of
    trainer/ppo/v1/trainer_base.py tests both): steps beyond the epochs would end the run
    early, before the last step it saves and validates, with the learning-rate schedule
    sized for steps never run. Our parameter overrides the epochs, as TRL's max_steps does.
    """
    steps, per_epoch = verl.total_training_steps, (train_rows or 0) // verl.data_train_batch_size
    if steps is None or per_epoch < 1:  # too few rows: check_verl names the batch size
        return verl.trainer_total_epochs
    epochs = -(-steps // per_epoch)
    if epochs != verl.trainer_total_epochs:
        logger.info("verl trains %d epoch(s) of %d step(s) for total_training_steps=%d "
                    "(trainer_total_epochs=%d overridden)", epochs, per_epoch, steps,
                    verl.trainer_total_epochs)
    return epochs


def planned_steps(config: DictConfig) -> int:
    """The steps verl's trainer will run: ``trainer.total_training_steps`` when set, else
    whole batches of the training prompts (its loader drops the last partial one) times the
    epochs, as ``RayPPOTrainer`` counts them."""
    if config.trainer.total_training_steps is not None:
        return int(config.trainer.total_training_steps)
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in _files(config.data.train_files))
    return rows // config.data.train_batch_size * config.trainer.total_epochs


def step_work(config: DictConfig, host: dict[str, Any], verl: VerlParams) -> StepWork | None:
    """What each step of this verl run does (the forecast's input), from the composed config
    and the preflight's host plan; None where the plan could not count the steps.

    A step generates train_batch_size x rollout.n responses, recomputes their old
    log-probabilities (verl's actor always does), adds a reference pass with a KL term,
    and updates the actor ppo_epochs times over the batch."""
    plan = host.get("plan") or {}
    if "steps" not in plan:
        return None
    arr = config.actor_rollout_ref
    model, rollout, actor = arr.model, arr.rollout, arr.actor
    facts = ModelFacts.read(model.path, model.lora_rank, model.target_modules)
    dtype = str(rollout.dtype) if str(rollout.dtype) in ("float32", "bfloat16") else "float32"
    memory = host.get("gpu_memory")
    steps = int(plan["steps"])
    return StepWork(
        engine="verl", steps=steps, prompts=int(config.data.train_batch_size),
        completions=int(rollout.n), response_cap=int(config.data.max_response_length),
        rollouts_per_step=1.0,
        log_prob_passes=1.0 + float(bool(actor.use_kl_loss
                                          or config.algorithm.use_kl_in_reward)),
        update_passes=float(actor.ppo_epochs),
        recompute=bool(model.enable_gradient_checkpointing),
        temperature=float(rollout.temperature), top_p=float(rollout.top_p),
        top_k=int(rollout.top_k), seed=verl.seed, dtype=dtype,
        lora={"r": int(model.lora_rank), "lora_alpha": int(model.lora_alpha),
              "lora_dropout": verl.actor_model_lora_dropout,
              # peft takes all-linear or a regex as verl does, a list as names
              "target_modules": lora_target_names(model.target_modules)
              or str(model.target_modules)}
        if model.lora_rank > 0 else None,
        device=str(config.trainer.device),
        devices=int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes),
        tensor_parallel=int(rollout.tensor_model_parallel_size),
        saves=times_in(steps, config.trainer.save_freq),
        checkpoint_gib=float(plan.get("checkpoint_gib", 0.0)),
        checkpoints_kept=int(plan.get("checkpoints_kept", 0)),
        validations=int(plan.get("validations", 0)),
        validation_prompts=int(plan.get("validation_prompts", 0)),
        gpu_peak_gib=(max(memory["actor_peak_gib"], memory["rollout_peak_gib"])
                      if isinstance(memory, dict) else None),
        rollout_backend="hf" if str(rollout.name) == "hf" else "vllm",
        model_gib=facts.bytes_on_disk / GiB if facts else 0.0)


def _files(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _check_user_overrides(user: list[str], launch: list[str]) -> list[Problem]:
    owned = owned_keys(launch)
    problems = []
    for override in user:
        if "=" not in override:
            problems.append(Problem("overrides", override, "'key=value' Hydra overrides"))
        elif override_key(override) in owned:
            problems.append(Problem("overrides", override, f"a key no parameter sets: "
                                    f"{override_key(override)} is set by "
                                    f"{owned[override_key(override)]}"))
    return problems


def _composition_problems(values: dict[str, Any], launch: list[str], user: list[str],
                          exc: Exception) -> list[Problem]:
    # Hydra stops at the first bad key; compose each user override alone to name them all.
    base = hydra_overrides(values, launch)
    try:
        compose_verl_config(base)
    except (HydraException, OmegaConfBaseException) as base_exc:
        return [Problem("overrides", None, f"verl's config did not compose: {base_exc}")]
    problems = []
    for override in user:
        if "=" not in override:
            continue  # already reported as malformed
        try:
            compose_verl_config([*base, override])
        except (HydraException, OmegaConfBaseException) as one:
            problems.append(Problem("overrides", override, f"a key of verl's config (prefix "
                                    f"'+' to add a new one): {_first_line(one)}"))
    return problems or [Problem("overrides", user, f"verl's config did not compose: {exc}")]


def _check_inputs(config: DictConfig, inputs: LaunchInputs, reward: RewardParams,
                  target: RewardTarget, report: dict[str, Any]) -> list[Problem]:
    from rl_pipeline.models.tokenizer import load_tokenizer

    try:  # the prompts' template arguments, as verl's rollout applies them
        tokenizer = load_tokenizer(inputs.model_path,
                                   dict(config.data.get("apply_chat_template_kwargs") or {}))
    except (OSError, ValueError) as exc:
        return [Problem("base_model", inputs.model_path, f"a model with a fast tokenizer and a "
                        f"chat template: {exc}", group="catalog")]
    problems = check_chat_template(tokenizer, inputs.model_path)
    data, positions = config.data, config.actor_rollout_ref.rollout.max_model_len
    if data.max_prompt_length + data.max_response_length > positions:  # clamped at launch
        logger.warning("data_max_prompt_length %d + data_max_response_length %d exceed the "
                       "%d positions of %s: a response after a long prompt ends short of "
                       "its cap, where the model's positions end", data.max_prompt_length,
                       data.max_response_length, positions, inputs.model_path)
    model = config.actor_rollout_ref.model
    if int(model.lora_rank) > 0 and \
            (allowed := lora_target_problem(inputs.model_path, model.target_modules)):
        problems.append(Problem("actor_model_target_modules", model.target_modules, allowed))
    prompt_problems, report["prompts"], rows = check_prompts(config, tokenizer)
    problems += prompt_problems
    if rows:
        reward_problems, report["reward"] = check_reward(config, tokenizer, rows, reward,
                                                         target.path)
        problems += reward_problems
    return problems


def _check_host(verl: VerlParams, config: DictConfig, inputs: LaunchInputs,
                report: dict[str, Any], *, cpu: bool, local: bool, cluster: bool,
                ) -> list[Problem]:
    """The machine's arithmetic (:mod:`rl_pipeline.engines.verl.host`): the driver, Ray's
    CPUs, the disk for the kept checkpoints, one GPU's memory; each figure in the report."""
    problems: list[Problem] = []
    host: dict[str, Any] = {}
    if not cpu and not local:
        # Only checking: a machine with an NVIDIA driver is likely the one that trains.
        host["nvidia_driver"] = version = driver_version()
        if problem := driver_problem(version):
            problems.append(Problem("nvidia_driver", version, problem, group="machine"))
    try:
        steps = planned_steps(config)
        host["plan"] = {"steps": steps, "validations": int(config.trainer.val_before_train)
                        + times_in(steps, config.trainer.test_freq),
                        "validation_prompts": _validation_prompts(config)}
    except (OSError, ValueError):  # the prompts are checked (and named) elsewhere
        steps = None
    host["ray_cpus_needed"] = ray_cpus_needed(config)
    if cluster and report.get("cluster", {}).get("checked"):
        available = report["cluster"]["cpus"]
        if problem := ray_cpu_problem(config, available, f"the cluster at {inputs.ray_address}"):
            problems.append(Problem("ray_address", inputs.ray_address, problem, group="train"))
    elif local:
        host["ray_cpus_available"] = available = local_cpus(config)
        if problem := ray_cpu_problem(config, available, "this machine"):
            problems.append(Problem("trainer_n_gpus_per_node", verl.trainer_n_gpus_per_node,
                                    problem))
    facts = ModelFacts.read(inputs.model_path, config.actor_rollout_ref.model.lora_rank,
                            config.actor_rollout_ref.model.target_modules)
    if facts is None:
        host["model"] = "not read (no config.json and safetensors at base_model)"
    elif steps is not None:
        disk = disk_plan(config, facts, steps)
        host["plan"].update(checkpoints_kept=disk.checkpoints_kept,
                            checkpoint_gib=round(disk.checkpoint_gib, 3),
                            disk_gib=round(disk.total_gib, 2))
        # On a cluster, each node's free space (verl_cluster's check task); else this one's.
        nodes = report.get("cluster", {}).get("nodes", []) if cluster else []
        free_by_place = ({f"node {n['node']}": n["free_gib"] for n in nodes} if cluster
                         else {"this machine": free_gib(inputs.checkpoints_dir)})
        host["plan"]["free_gib"] = {k: round(v, 1) for k, v in free_by_place.items()}
        for place, free in free_by_place.items():
            if problem := disk_problem(disk, f"{inputs.checkpoints_dir} on {place}", free):
                problems.append(Problem("trainer_max_actor_ckpt_to_keep",
                                        verl.trainer_max_actor_ckpt_to_keep, problem))
    gpu_gib = verl.gpu_memory_gib
    if gpu_gib == "auto":
        gpu_gib = _local_gpu_gib() if local else None
    if facts is not None and gpu_gib and not cpu:
        memory = memory_plan(config, facts, gpu_gib, hf_rollout=verl.ENGINE == HF_ROLLOUT)
        host["gpu_memory"] = {"gpu_gib": round(gpu_gib, 1), **memory.as_dict()}
        if problem := memory_problem(memory, gpu_gib):
            problems.append(Problem("gpu_memory_gib", verl.gpu_memory_gib, problem))
    else:
        host["gpu_memory"] = "not checked (train.verl.gpu_memory_gib: auto on a machine that " \
                             "does not train, or null)"
    report["host"] = host
    return problems


def _validation_prompts(config: DictConfig) -> int:
    """The prompts each validation generates for: the val files' rows, capped by
    ``data.val_max_samples``."""
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in _files(config.data.val_files))
    cap = config.data.get("val_max_samples", -1)
    return min(rows, cap) if cap and cap > 0 else rows


def _local_gpu_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def resolved_config_yaml(plan: VerlPlan) -> str:
    """The resolved config, headed by how to launch it without Kedro."""
    return (f"# verl {_verl_version()} config composed by rl_pipeline's preflight.\n"
            f"# Launch it without Kedro: see train_command.sh beside this file.\n"
            + resolved_yaml(plan.config))


def _verl_version() -> str:
    import verl

    return getattr(verl, "__version__", "?")
