"""Small real artifacts for tests and benchmarks, built offline in seconds.

No model hub is reachable where tests run, so tests train their own tokenizer with
``tokenizers`` instead of downloading one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int, folder: str | Path | None = None,
                        chat_template: str | None = CHATML_TEMPLATE) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (GPT-2/Qwen style) with a ChatML chat template.

    Args:
        texts: Training text.
        vocab_size: Target vocabulary size, special tokens included.
        folder: If given, save the tokenizer there (``AutoTokenizer`` can load it).
        chat_template: Jinja chat template; None for a tokenizer without one.

    Returns:
        The fast tokenizer.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    if chat_template:
        fast.chat_template = chat_template
    if folder is not None:
        fast.save_pretrained(str(folder))
    return fast


def build_tiny_causal_lm(folder: str | Path, tokenizer: PreTrainedTokenizerFast,
                         seed: int = 0) -> Path:
    """Save a randomly initialised two-layer Qwen2 model (about 100k parameters) with its
    tokenizer as a Hugging Face model folder."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    folder = Path(folder)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def train_tiny_lora(model_dir: str | Path, out_dir: str | Path, rank: int = 8, alpha: int = 16,
                    steps: int = 5, target_modules: str | list[str] = "all-linear",
                    seed: int = 0, **lora: Any) -> Path:
    """Train a LoRA adapter for a few steps (next-token loss on random tokens) and save it.

    The steps move ``lora_B`` away from its zero initialisation, so merging it changes the
    model measurably. ``lora``: more of peft's ``LoraConfig`` (``use_rslora``,
    ``rank_pattern``, ``alpha_pattern``).
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha,
                                                  target_modules=target_modules,
                                                  task_type="CAUSAL_LM", **lora))
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad],
                                  lr=5e-2)
    ids = torch.randint(0, model.config.vocab_size, (4, 24))
    for _ in range(steps):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peft_model.save_pretrained(str(out_dir))
    return Path(out_dir)
