"""The ``data`` group (shared by data_prep and the trainers) and ``data_prep``."""

from __future__ import annotations

import re
import string
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rl_pipeline.params.base import ParamGroup


class DataParams(ParamGroup):
    """The spec's ``data_*`` parameters and the chat template's arguments: one value shared
    by data_prep, the trainers and eval."""

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
    data_apply_chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Ours. Keyword arguments for the chat template, e.g. {enable_thinking: "
        "false} for Qwen3-class models: used alike by data_prep's length filter, both "
        "trainers' rollouts (verl's data.apply_chat_template_kwargs, TRL's "
        "chat_template_kwargs), the preflights and eval, and written into the merged model's "
        "card.",
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

    @field_validator("prompt_template")
    @classmethod
    def _named_text_fields(cls, value: str | None) -> str | None:
        # Checked here, not at the first record: a format error names no parameter there.
        if value is None:
            return value
        allowed = "a Python format string of named record fields, e.g. '{Body} {Question}'"
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value)
                     if name is not None]
        except ValueError as exc:
            raise ValueError(f"{allowed} ({exc}; a literal brace is written {{{{ or }}}})"
                             ) from None
        if not names:
            raise ValueError(f"{allowed}; this one names no field")
        # A record's keys may hold '-' or spaces; '.' and '[' would read an attribute or index.
        if odd := [name for name in names
                   if not name or name.isdigit() or "." in name or "[" in name]:
            raise ValueError(f"{allowed}, each a field's name alone (no position, attribute "
                             f"or index): {{{'}, {'.join(odd)}}}")
        try:
            value.format_map({name: "text" for name in names})
        except ValueError as exc:  # a format spec for numbers: the fields are text
            raise ValueError(f"{allowed} ({exc}: a record's fields are text here)") from None
        return value

    @model_validator(mode="after")
    def _regex_with_a_group(self) -> DataPrepParams:
        if self.answer_extraction != "regex":
            return self
        where = (f"data_prep.answer_regex={self.answer_regex!r}: answer_extraction 'regex' "
                 "takes group 1 of this pattern as the ground truth, so it needs")
        if not self.answer_regex:
            raise ValueError(f"{where} a pattern, e.g. '\\\\boxed\\{{(.+)\\}}'")
        try:
            groups = re.compile(self.answer_regex).groups
        except re.error as exc:
            raise ValueError(f"{where} a valid regular expression ({exc})") from None
        if groups < 1:
            raise ValueError(f"{where} a group: (...) around the answer")
        return self
