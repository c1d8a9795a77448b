"""Typed parameter groups, validated in one place, and the parameters that follow others.

Each group is a pydantic model whose fields carry their default and help text, so the model
is its own reference (in the manner of TRL's ``GRPOConfig``) and the one source of every
default: ``conf/*/parameters*.yml`` set only what a configuration changes, and
``docs/parameters.md`` is generated from the models. Nodes declare their groups by type
(``data: DataParams``); Kedro instantiates them from ``params:<group>`` before the run
starts, and :meth:`ParamGroup.model_validate` words every problem at once, naming the
parameter, the value given and what is allowed.

Where several parameters mean one thing (a spec name of each trainer for the response length,
say), :data:`FOLLOWERS` names one owner: the others default to null and then take the owner's
value; a follower set to a different value is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """One or more parameters are invalid. The message lists each of them."""


@dataclass(frozen=True)
class Follower:
    """A parameter that means the same as its ``owner`` (both as ``group.name`` paths)."""

    name: str
    owner: str


FOLLOWERS: tuple[Follower, ...] = (
    Follower("train.verl.rollout_name", "train.verl.ENGINE"),
    Follower("train.verl.actor_rft_mini_batch_size", "train.verl.actor_ppo_mini_batch_size"),
    Follower("train.verl.actor_rft_micro_batch_size_per_gpu",
             "train.verl.actor_ppo_micro_batch_size_per_gpu"),
    Follower("train.trl.vllm_gpu_memory_utilization",
             "train.verl.rollout_gpu_memory_utilization"),
    Follower("train.trl.max_prompt_length", "data.data_max_prompt_length"),
    Follower("train.trl.max_completion_length", "data.data_max_response_length"),
    Follower("eval.max_new_tokens", "data.data_max_response_length"),
    Follower("eval.vllm_gpu_memory_utilization", "train.verl.rollout_gpu_memory_utilization"),
    Follower("eval.correct_reward", "reward.correct_score"),
)


def follow(name: str, value: Any, owner_value: Any) -> Any:
    """The value of follower ``name``: its owner's, when it is unset or the same.

    Raises:
        ConfigError: When it is set to another value than its owner's.
    """
    owner = _FOLLOWED[name]
    if value is None or value == owner_value:
        return owner_value
    raise ConfigError(f"{name}={value!r}: leave it unset (null) or equal to {owner} "
                      f"({owner_value!r}); {owner} sets both")


_FOLLOWED = {f.name: f.owner for f in FOLLOWERS}


def disagreeing_followers(groups: Mapping[str, Any]) -> list[str]:
    """Every follower set to another value than its owner, over validated groups."""
    problems = []
    for f in FOLLOWERS:
        value, owner_value = _lookup(groups, f.name), _lookup(groups, f.owner)
        if value is _ABSENT or owner_value is _ABSENT:
            continue  # a group this configuration does not have
        try:
            follow(f.name, value, owner_value)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def cross_group_problems(groups: Mapping[str, Any]) -> list[str]:
    """Every rule over two groups that a group alone cannot check: the followers
    (:func:`disagreeing_followers`) and the overlong buffer inside the response cap."""
    problems = disagreeing_followers(groups)
    buffer = _lookup(groups, "reward.overlong_buffer_len")
    cap = _lookup(groups, "data.data_max_response_length")
    if _ABSENT not in (buffer, cap) and buffer >= cap:
        problems.append(f"reward.overlong_buffer_len={buffer}: must be below the response cap "
                        f"data.data_max_response_length ({cap}); DAPO uses a buffer of a "
                        "quarter of it or less")
    return problems


_ABSENT = object()


def _lookup(groups: Mapping[str, Any], path: str) -> Any:
    node: Any = groups
    for part in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(part, _ABSENT)
        else:
            node = getattr(node, part, _ABSENT)
        if node is _ABSENT:
            return _ABSENT
    return node


class ParamGroup(BaseModel):
    """Base of every parameter group: unknown names are errors; values are checked, frozen.

    ``group`` is where the model lives in ``conf/*/parameters*.yml`` (nested groups are named
    through their parent). Followers inside one group take their owner's value here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    group: ClassVar[str] = ""

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Validate, raising :class:`ConfigError` with every problem named (Kedro shows it)."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, cls, cls.group or cls.__name__)) from None

    @model_validator(mode="before")
    @classmethod
    def _follow_owners(cls, values: Any) -> Any:
        if not cls.group or not isinstance(values, Mapping):
            return values
        values, problems = dict(values), []
        prefix = cls.group + "."
        for f in FOLLOWERS:
            if f.name.startswith(prefix) and f.owner.startswith(prefix):
                own = _value_or_default(cls, values, f.owner.removeprefix(prefix))
                try:
                    _update_path(values, f.name.removeprefix(prefix),
                                 lambda v, own=own, name=f.name: follow(name, v, own))
                except ConfigError as exc:
                    problems.append(str(exc))
        if problems:  # pydantic words it with the input; _describe keeps the message only
            raise ValueError("\n  - ".join(problems))
        return values


def _value_or_default(model: type[BaseModel], values: dict[str, Any], path: str) -> Any:
    """The raw value at ``path`` (a.b) of ``values``, else the model's default there."""
    *parents, leaf = path.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
        values = values.get(part) or {}
        if isinstance(values, BaseModel):
            values = values.model_dump()
    if leaf in values:
        return values[leaf]
    return model.model_fields[leaf].get_default(call_default_factory=True)


def _update_path(values: dict[str, Any], path: str, update: Any) -> None:
    *parents, leaf = path.split(".")
    node = values
    for part in parents:
        child = node.get(part) or {}
        node[part] = child = (child.model_dump(exclude_unset=True)
                              if isinstance(child, BaseModel) else dict(child))
        node = child
    node[leaf] = update(node.get(leaf))


class DataParams(ParamGroup):
    """The spec's ``data_*`` parameters: one value shared by data_prep and the trainers."""

    group: ClassVar[str] = "data"

    data_max_prompt_length: int = Field(
        1024, gt=0,
        description="Maximum prompt length in tokens: the chat-templated prompt with the "
        "generation prompt added, tokenized by the base model's tokenizer (as verl counts it).",
    )
    data_max_response_length: int = Field(
        2048, gt=0, description="Maximum response length in tokens (generation cap)."
    )
    data_filter_overlong_prompts: bool = Field(
        True,
        description="Drop prompts longer than data_max_prompt_length. When false, "
        "data_truncation decides what happens to them.",
    )
    data_truncation: Literal["error", "left", "right", "middle"] = Field(
        "error",
        description="For overlong prompts that are not filtered: 'error' fails naming the rows; "
        "'left', 'right' or 'middle' cut tokens from that part of the question until the "
        "templated prompt fits.",
    )
    data_image_key: str = Field(
        "images", description="Column holding a record's images (multimodal data)."
    )


class FewShotExample(ParamGroup):
    """One worked example of ``data_prep.few_shot``."""

    question: str = Field(min_length=1, description="The example's question, as the prompt "
                          "field would hold it; the instruction is appended as to any question.")
    answer: str = Field(min_length=1, description="The assistant's reply: a worked answer in "
                        "the format the reward reads.")


class DataPrepParams(ParamGroup):
    """How raw records become verl prompts (the ``data_prep`` group)."""

    group: ClassVar[str] = "data_prep"

    dataset_prompt_column: str = Field(
        "problem", description="Column holding the prompt text (GRPO spec name)."
    )
    prompt_template: str | None = Field(
        None,
        description="Python format string over several fields, e.g. '{Body} {Question}'. "
        "Overrides dataset_prompt_column when set.",
    )
    answer_column: str = Field("answer", description="Column holding the reference answer.")
    answer_extraction: Literal["gsm8k", "whole", "regex"] = Field(
        "whole",
        description="How the ground truth is taken from the answer column: 'gsm8k' = the "
        "number after '####' with commas removed; 'whole' = the whole field, stripped; "
        "'regex' = group 1 of answer_regex.",
    )
    answer_regex: str | None = Field(
        None, description="Pattern for answer_extraction='regex'; group 1 is the ground truth."
    )
    system_prompt: str | None = Field(None, description="Optional system message.")
    few_shot: list[FewShotExample] = Field(
        default_factory=list,
        description="Worked examples put before every question as earlier chat turns (a user "
        "turn with the example's question and the instruction, an assistant turn with its "
        "answer): lm-evaluation-harness's multi-turn few-shot format. A small model copies an "
        "example's format far more reliably than it follows an instruction. Each is "
        "{question: ..., answer: ...}.")
    instruction: str = Field(
        "", description="Appended to the question, after one space (e.g. verl's GSM8K "
        "'Let's think step by step and output the final answer after \"####\".')."
    )
    data_source: str = Field(
        "openai/gsm8k", description="verl's data_source: selects the reward function."
    )
    ability: str = Field("math", description="verl's ability field (informational).")
    drop_duplicates: bool = Field(True, description="Drop exact duplicate prompts within a split.")
    drop_train_val_overlap: bool = Field(
        True, description="Drop from train the prompts that also appear in val."
    )
    val_fraction: float = Field(
        0.1, gt=0, lt=1,
        description="Fraction of train split off as validation when there is no raw_val.",
    )
    seed: int = Field(42, description="Seed for the validation split and the length sample.")
    on_bad_record: Literal["error", "skip"] = Field(
        "error",
        description="A malformed or undecodable line, a record missing a field, or a field "
        "of the wrong type (a prompt field that is not a string): 'error' fails naming the "
        "file, the line and the field; 'skip' drops it and counts it in the report.",
    )
    length_sample_size: int = Field(
        10_000, ge=10_000,
        description="Prompt-length percentiles come from a uniform sample of this many rows "
        "per split (every row when the split is smaller).",
    )


class CustomRewardFunction(ParamGroup):
    """verl's ``custom_reward_function`` keys."""

    path: str | None = Field(
        None, description="A Python file defining the reward function; null for a built-in.")
    name: str = Field(
        "compute_score",
        description="The function's name. Built-ins: compute_score (by data_source: GSM8K "
        "strict, MATH via math-verify, else verl's default; docs/rewards.md), strict_gsm8k, "
        "flexible_gsm8k, math_verify_score, gsm8k_format_credit (1.0 for one correct "
        "'#### <number>' answer, 0.1 for a wrong one in a well-formed response: ended by "
        "itself, one answer, not repetitive). Signature: (data_source, solution_str, "
        "ground_truth, extra_info=None) -> float | dict with 'score'; extra_info carries "
        "response_length, max_response_length and truncated.",
    )


class RewardParams(ParamGroup):
    """The reward used by evaluation and both trainers (the ``reward`` group)."""

    group: ClassVar[str] = "reward"

    custom_reward_function: CustomRewardFunction = Field(
        default_factory=CustomRewardFunction, description="The spec's custom_reward_function.")
    strict: bool = Field(
        False, description="Fail when the reward function raises; otherwise that sample "
        "scores 0 and is counted in the metrics (reward_errors).")
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
        "rows; 'warn' logs it; 'off' skips it.")


class EvalParams(ParamGroup):
    """Evaluation of the base and the trained model (the ``eval`` group)."""

    group: ClassVar[str] = "eval"

    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto", description="Generation back end: 'hf' (transformers generate, CPU or GPU), "
        "'vllm' (offline engine, GPU), 'auto' (vllm when installed with CUDA, else hf).")
    max_prompts: int | None = Field(
        None, gt=0, description="Evaluate the first N validation prompts (null: all).")
    n_samples: int = Field(
        1, ge=1, description="Samples per prompt (n): mean@n, and pass@k and maj@k for the k "
        "of pass_k up to n.")
    pass_k: list[int] = Field(
        default_factory=lambda: [1, 4, 8], min_length=1,
        description="The k of pass@k (unbiased estimator) and maj@k (majority vote over the "
        "answers of the first k samples). A k above the samples per prompt (n_samples; 1 "
        "when greedy) is skipped, and the report says so.")
    correct_reward: float | None = Field(
        None, description="A sample counts as correct for pass@k and maj@k when the reward "
        "is at least this. Follows reward.correct_score (null); another value is refused.")
    bootstrap_resamples: int = Field(
        10_000, ge=100, description="Resamples of the paired bootstrap over prompts that "
        "gives every base-versus-trained delta its 95% interval (seeded by eval.seed).")
    greedy: bool = Field(False, description="Greedy decoding (one sample per prompt).")
    rollout_val_temperature: float = Field(
        0.7, ge=0, description="Sampling temperature for validation/evaluation (spec).")
    rollout_val_top_p: float = Field(
        0.7, gt=0, le=1, description="Top-p for validation/evaluation (spec).")
    rollout_val_top_k: int = Field(
        -1, ge=-1, description="Top-k for validation/evaluation; -1 disables it (spec).")
    max_new_tokens: int | None = Field(
        None, gt=0, description="Cap on response tokens. Follows data.data_max_response_length "
        "(null); another value is refused.")
    batch_size: int = Field(32, ge=1, description="Prompts per generate call (hf back end).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Model dtype; auto: bfloat16 on GPU, float32 on CPU.")
    vllm_gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory vLLM may take (vllm back end). "
        "Follows train.verl.rollout_gpu_memory_utilization (null); another value is refused.")
    seed: int = Field(42, description="Sampling seed, and the bootstrap's.")

    @model_validator(mode="after")
    def _positive_k(self) -> EvalParams:
        if any(k < 1 for k in self.pass_k):
            raise ValueError(f"eval.pass_k={self.pass_k}: every k must be at least 1")
        return self


class MergeParams(ParamGroup):
    """Merging the LoRA adapter into the base model (the ``merge`` group)."""

    group: ClassVar[str] = "merge"

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype of the merged weights; auto: the base model's. The merge "
        "itself computes in float32.")
    scratch_dir: str | None = Field(
        None, description="Where the merged folder is built before the catalog moves it into "
        "place; on the same filesystem as data/ the move is a rename. null: system temp.")
    verify_probes: list[str] | None = Field(
        None, description="Prompts whose logits prove merged == base + adapter (null: three "
        "built-in probes).")
    registered_model_name: str | None = Field(
        None, description="Also log the merged model to MLflow (transformers flavour) and "
        "register it under this name. Off (null) by default: multi-GB uploads are slow.")


def _describe(exc: ValidationError, model: type[ParamGroup], group: str) -> str:
    lines = [f"{exc.error_count()} invalid parameter(s) in '{group}':"]
    for err in exc.errors():
        name = ".".join([group, *(str(p) for p in err["loc"])])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(_nested_model(model, err["loc"][:-1]).model_fields))
            lines.append(f"  - {name}: unknown parameter (known: {allowed})")
            continue
        if err["type"] == "value_error" and isinstance(err.get("input"), Mapping):
            # a rule over several fields (a follower): its message names them
            lines.append(f"  - {err['msg'].removeprefix('Value error, ')}")
            continue
        lines.append(f"  - {name}={err.get('input')!r}: {err['msg']}")
    return "\n".join(lines)


def _nested_model(model: type[ParamGroup], loc: tuple) -> type[ParamGroup]:
    for part in loc:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, ParamGroup)):
            break
        model = annotation
    return model
