"""Preflight checks that run verl's own code on a CPU: its config validation, its dataset
class on our parquet, and its reward path on the reward self-test's rows.

verl makes these checks only inside the Ray TaskRunner, after the cluster and the GPU
workers are up; here they take seconds and report every problem at once.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rl_pipeline.engines.problems import Problem, model_code_problem
from rl_pipeline.engines.verl.config import reward_json
from rl_pipeline.models.tokenizer import chat_prompt_ids
from rl_pipeline.params import RewardParams
from rl_pipeline.rewards.self_test import ModelCodeOnHostError, run_self_test

logger = logging.getLogger(__name__)

# Rows of each prompt file put through RLHFDataset; enough to catch schema and length
# problems without verl's single-process length filter over the whole file.
SAMPLE_ROWS = 64


def validate_with_verl(config: DictConfig) -> list[Problem]:
    """verl's ``validate_config``, as ``main_ppo`` runs it before launching.

    Its LoRA check imports vLLM (to round the rank); our preflight applies that rule itself
    (:data:`~rl_pipeline.engines.verl.preflight.VLLM_LORA_RANKS`), so verl's runs on a copy
    whose rollout name is not vllm, and the check works without vLLM installed.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    checked = copy.deepcopy(config)
    with open_dict(checked):
        if checked.actor_rollout_ref.rollout.name == "vllm":
            checked.actor_rollout_ref.rollout.name = "sglang"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # need_critic warns that non-gae has no critic
            validate_config(checked, use_reference_policy=need_reference_policy(checked),
                            use_critic=need_critic(checked))
    except (AssertionError, ValueError, TypeError, KeyError) as exc:
        return [Problem("overrides", None, f"verl's validate_config refused the composed "
                        f"config: {exc}")]
    return []


def check_prompts(config: DictConfig, tokenizer: Any, sample: int = SAMPLE_ROWS,
                  ) -> tuple[list[Problem], dict[str, Any], list[dict[str, Any]]]:
    """Load each prompt file in verl's ``RLHFDataset`` and check it as the rollout will.

    The rollout applies the chat template to ``raw_prompt``; every sampled prompt must fit
    ``data.max_prompt_length`` (data_prep fitted them, so a failure means the file and the
    parameters disagree, e.g. a different model's tokenizer).

    Returns:
        The problems, a summary per file, and the training rows as verl yields them.
    """
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    problems: list[Problem] = []
    report: dict[str, Any] = {}
    train_rows: list[dict[str, Any]] = []
    limit = config.data.max_prompt_length
    for entry, files, is_train in (("train_prompts", config.data.train_files, True),
                                   ("val_prompts", config.data.val_files, False)):
        try:
            dataset = create_rl_dataset(files, config.data, tokenizer, None, is_train=is_train,
                                        max_samples=sample)
            rows = [dataset[i] for i in range(len(dataset))]
            collate_fn(rows[:4])
        except Exception as exc:  # verl raises anything from pyarrow to KeyError here
            problems.append(Problem(entry, files, f"a parquet file that verl's RLHFDataset "
                                    f"loads: {type(exc).__name__}: {exc}", group="catalog"))
            continue
        if is_train:
            train_rows = rows
        lengths = [_prompt_tokens(tokenizer, row["raw_prompt"]) for row in rows]
        report[entry] = {"rows_checked": len(rows),
                         "max_prompt_tokens": max(lengths, default=0)}
        if not rows:
            problems.append(Problem(entry, files, "at least one prompt that fits "
                                    f"data_max_prompt_length={limit} (verl kept none)",
                                    group="catalog"))
        elif max(lengths) > limit:
            problems.append(Problem(
                "data_max_prompt_length", limit, f"at least the longest prompt of {entry} "
                f"({max(lengths)} tokens with this model's chat template); rerun data_prep "
                "with this model and limit", group="data"))
    return problems, report, train_rows


def check_reward(config: DictConfig, tokenizer: Any, rows: list[dict[str, Any]],
                 reward: RewardParams, reward_path: str | None = None,
                 ) -> tuple[list[Problem], dict[str, Any]]:
    """The reward self-test (:mod:`rl_pipeline.rewards.self_test`) through verl's reward
    path: its reward manager (ours, which reports how responses ended), verl's loading of
    our entry point, and the ``reward`` group's function.

    Each row's ground truth is scored as an ideal response and as a wrong one; a reward that
    raises, or (``reward.self_test=error``) that does not score golds as correct and wrong
    answers lower, is a problem naming the data source and its scorer. ``reward_path`` is
    the reward file as this machine sees it (on a cluster the config names the shipped
    module).
    """
    from verl.trainer.ppo.reward import load_reward_manager

    where = "reward.custom_reward_function"
    checked = copy.deepcopy(config)
    with open_dict(checked):
        # Raise instead of scoring 0, so that a broken reward shows here; the file as this
        # machine sees it, where verl's workers import a shipped module.
        kwargs = checked.reward.custom_reward_function.reward_kwargs
        shipped = RewardParams.model_validate_json(kwargs.reward).custom_reward_function.path
        kwargs.reward = reward_json(reward, path=reward_path or shipped, strict=True)
    try:
        manager = load_reward_manager(checked, tokenizer)
    except Exception as exc:
        return [Problem("name", _reward_name(config), f"a reward function verl can load: "
                        f"{exc}", group=where)], {}

    def score(row: dict[str, Any], response: str, facts: dict[str, Any]) -> float:
        # The facts come from verl's side: the manager measures the response it is given.
        data = reward_sample(tokenizer, row, response)
        return manager.loop.run_until_complete(manager.run_single(data))["reward_score"]

    try:
        # One at a time: verl's manager runs on its own event loop. A judge's replies are
        # mostly cached by then (data_prep's self-test asked the same).
        report, failed = run_self_test(score, rows, reward, workers=1)
    except ModelCodeOnHostError as exc:
        return [model_code_problem(exc, reward.custom_reward_function.name)], {}
    except Exception as exc:
        return [Problem("name", _reward_name(config), f"a reward function that scores "
                        f"{rows[0]['data_source']!r} rows: it raised {exc!r}",
                        group=where)], {}
    return [Problem("data_source", source, message, group="data_prep")
            for source, message in failed], report


def check_vllm_args(config: DictConfig, user_overrides: list[str],
                    report: dict[str, Any]) -> list[Problem]:
    """Build the ``vllm serve`` arguments with verl's own server code and parse them with
    vLLM's parser (:mod:`rl_pipeline.engines.verl.vllm_args`); every flag it rejects is a problem
    naming the parameter that produced it.

    Where vLLM is neither installed nor in the parser folder the check is skipped, and the
    report says so.
    """
    from rl_pipeline.engines.verl.config import ENGINE_KWARGS, MAPPING, override_key
    from rl_pipeline.engines.verl.vllm_args import build_server_args, vllm_source

    if config.actor_rollout_ref.rollout.name != "vllm":
        return []
    if vllm_source() is None:
        report["vllm_args"] = "not checked: vLLM is not importable here (make vllm-parser)"
        logger.warning("preflight: %s", report["vllm_args"])
        return []
    try:
        built = build_server_args(config)
    except (RuntimeError, OSError, ValueError) as exc:
        return [Problem("ENGINE", "vllm", f"a rollout config verl can turn into vLLM server "
                        f"arguments: {exc}")]
    report["vllm_args"] = {"vllm": built.vllm, "argv": built.argv,
                           "unrecognized": built.unrecognized}
    owners = {m.key.rsplit(".", 1)[1]: m.spec for m in MAPPING if m.key.startswith(ENGINE_KWARGS)}
    users = {override_key(o).rsplit(".", 1)[1]: o for o in user_overrides
             if override_key(o).startswith(ENGINE_KWARGS)}
    problems = []
    for flag in built.unrecognized:
        name = flag.lstrip("-").replace("-", "_")
        # verl writes a false boolean as --no-<kwarg>
        kwarg = next((k for k in (name, name.removeprefix("no_")) if k in owners or k in users),
                     name)
        allowed = f"an engine argument vLLM {built.vllm} accepts: `vllm serve` rejects {flag}"
        if kwarg in owners:
            spec = owners[kwarg]
            problems.append(Problem(spec, OmegaConf.select(config, f"{ENGINE_KWARGS}.{kwarg}"),
                                    allowed))
        elif kwarg in users:
            problems.append(Problem("overrides", users[kwarg], allowed))
        else:
            problems.append(Problem("ENGINE", "vllm", f"{allowed}, which verl builds itself: "
                                    "install the vLLM version verl pins"))
    return problems


def check_chat_template(tokenizer: Any, model_path: str) -> list[Problem]:
    """verl's rollout applies the tokenizer's chat template to every prompt."""
    if getattr(tokenizer, "chat_template", None):
        return []
    return [Problem("chat_template", None, f"a chat template: the model at {model_path} has "
                    "none; set one on the base_model catalog entry", group="catalog.base_model")]


def resolved_yaml(config: DictConfig) -> str:
    """The composed config with every interpolation resolved, as verl's TaskRunner sees it."""
    return OmegaConf.to_yaml(config, resolve=True)


def _prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    return len(chat_prompt_ids(tokenizer, messages))


def reward_sample(tokenizer: Any, row: dict[str, Any], response: str) -> Any:
    """A one-row DataProto laid out as verl's rollout hands it to the reward manager."""
    from verl import DataProto

    prompt = list(chat_prompt_ids(tokenizer, row["prompt"]))
    reply = tokenizer(response, add_special_tokens=False)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    # An empty response is one padding token that the attention mask hides.
    responses = reply or [pad]
    mask = [1] * len(prompt) + ([1] * len(reply) if reply else [0])
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor([prompt]), "responses": torch.tensor([responses]),
                 "attention_mask": torch.tensor([mask])},
        non_tensors={key: np.array([row[key]], dtype=object)
                     for key in ("data_source", "reward_model", "extra_info")},
    )


def _reward_name(config: DictConfig) -> str:
    kwargs = config.reward.custom_reward_function.get("reward_kwargs") or {}
    if "reward" in kwargs:
        return RewardParams.model_validate_json(kwargs.reward).custom_reward_function.name
    return config.reward.custom_reward_function.name
