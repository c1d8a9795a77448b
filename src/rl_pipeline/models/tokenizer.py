"""Loading the base model's tokenizer from a resolved Hugging Face model folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(source: str | Path) -> PreTrainedTokenizerBase:
    """Load a fast tokenizer that carries a chat template.

    Args:
        source: A Hugging Face model folder with tokenizer files (``base_model`` resolves any
            model input to one).

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
