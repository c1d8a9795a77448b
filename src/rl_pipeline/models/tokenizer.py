"""Loading the base model's tokenizer from a resolved Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path

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
