"""The ``reward`` group: the reward function every engine, the self-test and eval use."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rl_pipeline.params.base import ParamGroup


class CustomRewardFunction(ParamGroup):
    """verl's ``custom_reward_function`` keys."""

    path: str | None = Field(
        None, description="A Python file defining the reward function; null for a built-in.")
    name: str = Field(
        "compute_score",
        description="The function's name. Built-ins: compute_score (by data_source: GSM8K "
        "strict, MATH via math-verify, exact_match and choice for text answers, else verl's "
        "default; docs/rewards.md), strict_gsm8k, flexible_gsm8k, math_verify_score, "
        "exact_match (the final answer equal to the ground truth after normalisation), "
        "choice (the option letter or label the final answer picks), code_tests (the "
        "response's program with the data's assert tests, in the project's sandbox), "
        "well_formed (1.0 for one '#### <number>' answer, ended, not repetitive), "
        "gsm8k_format_credit (1.0 for one correct "
        "'#### <number>' answer, 0.1 for a wrong one in a well-formed response: ended by "
        "itself, one answer, not repetitive). Signature: (data_source, solution_str, "
        "ground_truth, extra_info=None) -> float | dict with 'score'; extra_info carries "
        "response_length, max_response_length and truncated.",
    )


class RewardTerm(ParamGroup):
    """One weighted term of a reward made of several (``reward.terms``)."""

    name: str = Field(
        ..., description="A built-in reward (the names custom_reward_function.name takes; "
        "well_formed pays 1.0 for a well-formed '#### <number>' response) or the function in "
        "path.")
    path: str | None = Field(None, description="A Python file defining the function; null for "
                             "a built-in.")
    weight: float = Field(1.0, description="The term's weight in the sum.")
    label: str | None = Field(
        None, description="The term's name in the metrics (term_<label>, per training step and "
        "per model in eval): letters, digits and _; default: name.")

    @property
    def metric(self) -> str:
        return self.label or self.name


class RewardParams(ParamGroup):
    """The reward used by evaluation and both trainers (the ``reward`` group)."""

    group: ClassVar[str] = "reward"

    custom_reward_function: CustomRewardFunction = Field(
        default_factory=CustomRewardFunction, description="The spec's custom_reward_function.")
    strict: bool = Field(
        False, description="Fail when the reward function raises; otherwise that sample "
        "scores 0 and is counted in the metrics (reward_errors).")
    timeout_s: float | None = Field(
        10.0, gt=0, description="Time limit per sample: the reward function runs in a worker "
        "process (one pool per process that scores), and a sample past the limit has its "
        "worker killed and scores 0, counted as a reward timeout (the reward_timeout metric). "
        "It holds on any thread: verl's reward loop, a Ray actor, TRL, eval. null: no limit, "
        "the function runs in the calling thread (a hung sample then stalls the run).")
    correct_score: float = Field(
        1.0, description="A response is correct when its reward is at least this: pass@k, "
        "maj@k and the eval verdict off GSM8K-style sources, and the reward self-test. The "
        "built-in rewards pay 1.0 for a correct answer.")
    overlong_buffer_len: int = Field(
        0, ge=0, description="DAPO's soft overlong punishment: over the last this many tokens "
        "before the response cap (data.data_max_response_length) the reward falls linearly, "
        "from 0 to -overlong_penalty_factor at the cap, so that answers learn to end before "
        "it. 0: off. Must be below the cap.")
    overlong_penalty_factor: float = Field(
        1.0, ge=0, description="The overlong penalty at the response cap (DAPO: 1.0).")
    self_test: Literal["error", "warn", "off"] = Field(
        "error", description="Before data_prep publishes prompts and before training: score "
        "each data source's ground truths written as an ideal response, and a wrong answer. "
        "'error' fails when golds do not score reward.correct_score or wrong answers score "
        "as high (on 10% of rows or more), naming the data source, its scorer and example "
        "rows; 'warn' logs it; 'off' skips it (YAML and `--params reward.self_test=off` read an "
        "unquoted off as false: that means off too).")

    terms: list[RewardTerm] = Field(
        default_factory=list, description="A reward of several weighted terms, e.g. "
        "[{name: compute_score, label: correct}, {name: well_formed, weight: 0.1, label: "
        "format}]: the reward is the weighted sum of the terms (plus the overlong penalty); "
        "each term is contained (its time limit, errors scored 0 and counted) and logged "
        "apart, per training step and per model in eval. Empty: the one "
        "custom_reward_function. Set one or the other.")

    @model_validator(mode="after")
    def _terms_or_function(self) -> RewardParams:
        if not self.terms:
            return self
        if self.custom_reward_function != CustomRewardFunction():
            raise ValueError("reward.terms and reward.custom_reward_function are both set: "
                             "set one (a function of your own can be a term: {name: ..., "
                             "path: ...})")
        labels = [t.metric for t in self.terms]
        bad = [m for m in labels if not re.fullmatch(r"[A-Za-z0-9_]+", m)]
        if bad:
            raise ValueError(f"reward.terms labels {bad}: letters, digits and _ only (they "
                             "name metrics); set label")
        twice = sorted({m for m in labels if labels.count(m) > 1})
        if twice:
            raise ValueError(f"reward.terms: the label(s) {twice} name several terms; give "
                             "each a label of its own")
        return self

    def functions(self) -> list[tuple[str | None, str]]:
        """(path, name) of every function the reward calls: its terms, or its one function."""
        if self.terms:
            return [(t.path, t.name) for t in self.terms]
        return [(self.custom_reward_function.path, self.custom_reward_function.name)]

    @field_validator("self_test", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        # YAML 1.1, which Kedro's loader and --params parse, reads `off` (and `no`) as false.
        return "off" if value is False else value


# verl's default_compute_score runs the model's code for these data sources (prime_code)
# unless it is handed a Sandbox Fusion URL, which the project's compute_score does not pass.
CODE_EXECUTING_SOURCES = {"codecontests": "prime_code", "apps": "prime_code",
                          "codeforces": "prime_code", "taco": "prime_code"}
# The built-in rewards that hand a data_source they do not know to verl's default.
FALLS_TO_VERL = frozenset({"compute_score", "gsm8k_format_credit"})


def model_code_refusal(data_source: str, reward: RewardParams) -> str | None:
    """Why ``reward`` must not score ``data_source``: it would run the model's generated code
    on this machine, outside any sandbox; None when it would not."""
    if data_source not in CODE_EXECUTING_SOURCES:
        return None
    names = [name for path, name in reward.functions() if not path and name in FALLS_TO_VERL]
    if not names:
        return None
    where = "reward.terms" if reward.terms else "reward.custom_reward_function.name"
    return (f"{where}={names[0]} hands data_source "
            f"{data_source!r} to verl's default_compute_score, whose scorer for it "
            f"({CODE_EXECUTING_SOURCES[data_source]}) runs the model's generated code on this "
            "machine, outside any sandbox. Refused. To train on code with unit tests, "
            "prepare it under data_prep.data_source=code_tests (the response's program runs "
            "with the data's assert lines in the project's sandbox: docs/rewards.md), or set "
            "reward.custom_reward_function to a reward that runs the code in a sandbox of "
            "yours (e.g. verl's sandbox_fusion.compute_score with a Sandbox Fusion URL)")
