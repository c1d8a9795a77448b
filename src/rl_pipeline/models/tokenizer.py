"""Loading the base model's tokenizer from a resolved Hugging Face model folder."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(source: str | Path,
                   template_kwargs: Mapping[str, Any] | None = None) -> PreTrainedTokenizerBase:
    """Load a fast tokenizer that carries a chat template.

    Args:
        source: A Hugging Face model folder with tokenizer files (``base_model`` resolves any
            model input to one).
        template_kwargs: ``data.data_apply_chat_template_kwargs``: bound to this tokenizer's
            ``apply_chat_template`` (:func:`bind_template_kwargs`).

    Returns:
        The tokenizer.

    Raises:
        FileNotFoundError: If ``source`` does not exist.
        ValueError: If the tokenizer is not a fast tokenizer or has no chat template.
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"model folder not found: {path}")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not tokenizer.is_fast:
        raise ValueError(f"{path}: the tokenizer {type(tokenizer).__name__} is not a fast "
                         "(Rust) tokenizer; data_prep needs one to count tokens in batches")
    if not tokenizer.chat_template:
        raise ValueError(f"{path}: the tokenizer has no chat template; prompts are chat "
                         "messages, so the model needs one")
    return bind_template_kwargs(tokenizer, template_kwargs)


def bind_template_kwargs(tokenizer: PreTrainedTokenizerBase,
                         template_kwargs: Mapping[str, Any] | None) -> PreTrainedTokenizerBase:
    """``tokenizer`` whose ``apply_chat_template`` passes ``template_kwargs`` to the template
    on every call (a caller's own keyword arguments win).

    transformers keeps no default template arguments on a tokenizer, and the length filter,
    the checks and eval's generator call ``apply_chat_template`` in many places: binding
    them once makes every prompt the rollouts see (verl's apply_chat_template_kwargs, TRL's
    chat_template_kwargs) the prompt they count."""
    if template_kwargs:
        tokenizer.apply_chat_template = functools.partial(  # type: ignore[method-assign]
            type(tokenizer).apply_chat_template, tokenizer, **dict(template_kwargs))
    return tokenizer


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                    **kwargs: Any) -> Any:
    """The token ids of ``messages`` with the generation prompt, as verl's rollout makes them.

    transformers 5 returns a ``BatchEncoding`` from ``apply_chat_template(tokenize=True)``
    where 4.x returned the ids; this takes the ids from either. ``kwargs`` go to
    ``apply_chat_template`` (``return_tensors="pt"``).
    """
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                        tokenize=True, **kwargs)
    return out["input_ids"] if hasattr(out, "keys") else out
