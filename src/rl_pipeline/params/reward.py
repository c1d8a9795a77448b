"""The ``reward`` group: the reward function every engine, the self-test and eval use."""

from __future__ import annotations

import re
import string
from typing import ClassVar, Literal

import regex
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
        "choice (the option letter or label the final answer picks), judge (a judge model "
        "grades the response: reward.judge), regex (your pattern reads the answer: "
        "reward.regex), code_tests (the "
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


JUDGE = "judge"  # the built-in reward name that asks a judge model (rl_pipeline.rewards.judge)
# What a judge template may name: str.format fields, filled per response.
JUDGE_FIELDS = ("question", "response", "ground_truth", "rubric", "max_score")


class JudgeParams(ParamGroup):
    """The judge model behind the ``judge`` reward (``reward.judge``): where it is served,
    what it is asked and how its answer is read (docs/rewards.md, "A judge model")."""

    model: str | None = Field(
        None, description="A model the project serves itself as the judge (a folder, a .gguf "
        "file or a hub id, resolved as base_model is), on the loopback address: with vLLM's "
        "server on a GPU, with `transformers serve` on a CPU; started by each stage that "
        "scores and stopped after it. Set this or url.")
    url: str | None = Field(
        None, description="The base URL (ending /v1) of an OpenAI-compatible chat endpoint "
        "serving the judge elsewhere (vLLM, an inference provider). Set this or model; on a "
        "Ray cluster it must be reachable from every node.")
    served_model: str | None = Field(
        None, description="The model name sent with each request; default: the served model's "
        "folder (model), required with url.")
    api_key_env: str | None = Field(
        None, description="The name of the environment variable that holds the endpoint's "
        "key (never the key: the repository and MLflow do not hold it). null: no key.")
    server: Literal["auto", "vllm", "transformers"] = Field(
        "auto", description="The server for model: vllm (`vllm serve`, needs a GPU), "
        "transformers (`transformers serve`, CPU or GPU), or auto: vllm where CUDA and vLLM "
        "are here, else transformers.")
    server_args: list[str] = Field(
        default_factory=list, description="More arguments for the server's command line, e.g. "
        "['--gpu-memory-utilization', '0.2'] for vLLM beside training on one GPU.")
    startup_timeout_s: float = Field(
        600.0, gt=0, description="How long the served judge may take to answer its health "
        "check (loading the model included) before the stage fails.")
    template: str | None = Field(
        None, description="A text file with the judge's prompt, its fields in braces: "
        "{question}, {response}, {ground_truth}, {rubric}, {max_score}; it must ask for a "
        "last line 'SCORE: <n>'. null: the built-in template (rl_pipeline/rewards/judge.py), "
        "which grades the response against the ground truth by the rubric.")
    rubric: str = Field(
        "The response is correct when its final answer means the same as the reference "
        "answer; the reasoning does not matter.",
        description="What the judge checks, in words (the template's {rubric}).")
    max_score: int = Field(
        1, ge=1, description="The judge scores 0..max_score; the reward is score/max_score. "
        "1: a verdict (SCORE: 1 correct, SCORE: 0 not).")
    max_tokens: int = Field(
        64, ge=1, description="The judge's reply budget in tokens (its reasoning, then the "
        "SCORE line).")
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature "
                               "(0: its most likely reply, so the cache holds).")
    concurrency: int = Field(
        8, ge=1, description="Requests in flight at once, per process that scores.")
    request_timeout_s: float = Field(60.0, gt=0, description="Time limit of one request.")
    retries: int = Field(
        3, ge=0, description="Retries of a request that failed (connection, timeout, 429, "
        "5xx), with exponential backoff (the OpenAI client's); then the sample scores 0 and "
        "counts as a reward error.")
    cache_path: str | None = Field(
        "data/07_model_output/judge_cache.sqlite",
        description="A SQLite file of the judge's replies, keyed by judge model, template and "
        "the request's text: a rerun does not ask (or pay) twice. null: no cache.")
    min_agreement: float = Field(
        0.8, ge=0, le=1, description="The reward self-test's bar for a judge: the share of "
        "ideal responses it scores correct and wrong ones below, together; below it the run "
        "stops, naming the judge, the agreement and 3 examples.")

    @model_validator(mode="after")
    def _one_endpoint(self) -> JudgeParams:
        if self.model and self.url:
            raise ValueError("reward.judge: set model (a judge the project serves) or url (one "
                             "served elsewhere), not both")
        if self.url and not self.served_model:
            raise ValueError(f"reward.judge.url={self.url!r}: set reward.judge.served_model "
                             "to the model name the endpoint serves")
        if self.url and not re.match(r"https?://", self.url):
            raise ValueError(f"reward.judge.url={self.url!r}: expected an http(s):// base URL "
                             "ending /v1")
        if self.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ValueError("reward.judge.api_key_env: expected the name of an environment "
                             "variable (letters, digits, _), not a key")
        return self

    @property
    def configured(self) -> bool:
        return bool(self.model or self.url)


def template_fields(text: str, where: str) -> list[str]:
    """The fields a judge template names; raises ValueError naming one it may not."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{where}: not a template ({exc}); write literal braces as {{{{ }}}}") \
            from None
    bad = sorted({n for n in names if n not in JUDGE_FIELDS})
    if bad:
        raise ValueError(f"{where}: unknown field(s) {bad}; a judge template may use "
                         f"{', '.join('{' + f + '}' for f in JUDGE_FIELDS)}")
    return names


REGEX = "regex"  # the built-in reward that reads the answer with the user's pattern
# The names custom_reward_function.name takes without a path (rl_pipeline.rewards.scoring's
# BUILTIN, which checks it holds the same names; that module imports verl, these params not)
BUILTIN_NAMES = ("compute_score", "strict_gsm8k", "flexible_gsm8k", "math_verify_score",
                 "gsm8k_format_credit", "exact_match", "choice", "well_formed", "code_tests",
                 JUDGE, REGEX)


class RegexParams(ParamGroup):
    """The user's pattern behind the ``regex`` reward (``reward.regex``)."""

    pattern: str | None = Field(
        None, description="A Python regular expression that finds the answer in a response: "
        "its group named answer (or its first group) is compared with the ground truth after "
        "exact_match's normalisation; the last match counts. E.g. 'Label: (?P<answer>\\w+)'.")
    example: str = Field(
        "{answer}", description="A response as the pattern expects it, {answer} where the "
        "answer goes (e.g. 'Label: {answer}'): the pattern must read it back, and the reward "
        "self-test writes its ideal and wrong responses this way.")

    @model_validator(mode="after")
    def _reads_its_example(self) -> RegexParams:
        if self.pattern is None:
            return self
        try:
            compiled = regex.compile(self.pattern, regex.MULTILINE)  # as the reward runs it
        except regex.error as exc:
            raise ValueError(f"reward.regex.pattern={self.pattern!r}: not a regular "
                             f"expression ({exc})") from None
        if "answer" not in compiled.groupindex and compiled.groups < 1:
            raise ValueError(f"reward.regex.pattern={self.pattern!r}: it has no group to read "
                             "the answer from; add (?P<answer>...)")
        if "{answer}" not in self.example:
            raise ValueError(f"reward.regex.example={self.example!r}: put {{answer}} where "
                             "the answer goes")
        group = "answer" if "answer" in compiled.groupindex else 1

        def reads(probe: str) -> bool:
            found = list(compiled.finditer(self.example.replace("{answer}", probe)))
            return bool(found) and found[-1].group(group) == probe

        probes = ("Paris", "42", "B", "Paris 42")  # a word, a number, a letter, a phrase
        if not any(reads(p) for p in probes):
            raise ValueError(f"reward.regex.pattern={self.pattern!r} does not read the answer "
                             f"back from reward.regex.example={self.example!r} (tried the "
                             f"answers {', '.join(map(repr, probes))}): fix one or the other")
        return self


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
        1.0, description="A response is correct when its reward function's score (before "
        "the overlong penalty) is at least this: pass@k, maj@k and the eval verdict off "
        "GSM8K-style sources, and the reward self-test. The built-in rewards pay 1.0 for a "
        "correct answer.")
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
    regex: RegexParams = Field(
        default_factory=RegexParams, description="The pattern of the regex reward "
        "(custom_reward_function.name: regex, or a term named regex).")
    judge: JudgeParams = Field(
        default_factory=JudgeParams, description="The judge model of the judge reward "
        "(custom_reward_function.name: judge, or a term named judge).")

    terms: list[RewardTerm] = Field(
        default_factory=list, description="A reward of several weighted terms, e.g. "
        "[{name: compute_score, label: correct}, {name: well_formed, weight: 0.1, label: "
        "format}]: the reward is the weighted sum of the terms (plus the overlong penalty); "
        "each term is contained (its time limit, errors scored 0 and counted) and logged "
        "apart, per training step and per model in eval. Empty: the one "
        "custom_reward_function. Set one or the other.")

    def not_in_effect(self) -> set[str]:
        """The judge's and the regex reward's settings, when no function of the reward is
        the judge or the regex reward."""
        built_in = {name for path, name in self.functions() if not path}
        return {group for group, name in (("judge", JUDGE), ("regex", REGEX))
                if name not in built_in}

    @model_validator(mode="after")
    def _judge_configured(self) -> RewardParams:
        if not self.uses_judge:
            return self
        if not self.judge.configured:
            raise ValueError("the reward asks a judge (name: judge) but reward.judge has "
                             "neither model (a judge the project serves) nor url (one served "
                             "elsewhere): set one")
        if self.judge.template:
            from pathlib import Path

            file = Path(self.judge.template)
            if not file.is_file():
                raise ValueError(f"reward.judge.template={self.judge.template!r}: no such file")
            if "response" not in template_fields(file.read_text(encoding="utf-8"),
                                                 f"reward.judge.template={str(file)!r}"):
                raise ValueError(f"reward.judge.template={str(file)!r}: it never shows the "
                                 "judge the {response}")
        return self

    @model_validator(mode="after")
    def _regex_configured(self) -> RewardParams:
        if any(name == REGEX and not path for path, name in self.functions()) and \
                self.regex.pattern is None:
            raise ValueError("the reward reads answers with a pattern (name: regex) but "
                             "reward.regex.pattern is not set")
        return self

    @property
    def uses_judge(self) -> bool:
        """Whether the reward asks the judge model (a built-in named judge)."""
        return any(name == JUDGE and not path for path, name in self.functions())

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

    @model_validator(mode="after")
    def _built_ins_exist(self) -> RewardParams:
        # Here, not when data_prep's self-test first builds the reward, after tokenising
        for where, (path, name) in zip(self.parameters(), self.functions(), strict=True):
            if not path and name not in BUILTIN_NAMES:
                raise ValueError(f"{where}.name={name!r} is not a built-in reward; built-ins: "
                                 f"{', '.join(BUILTIN_NAMES)} (or give a file in {where}.path)")
        return self

    def parameters(self) -> list[str]:
        """Where each of :meth:`functions` is set: ``reward.terms[i]`` or
        ``reward.custom_reward_function``."""
        if self.terms:
            return [f"reward.terms[{i}]" for i in range(len(self.terms))]
        return ["reward.custom_reward_function"]

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
