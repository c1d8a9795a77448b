"""verl's LoRA actor as its FSDP engine builds it, on a CPU: shared by the boundary tests
of the LoRA checkpoint (test_lora_checkpoint.py) and of vLLM's LoRA loader
(test_vllm_lora_tensors.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

# verl's defaults for the actor's LoRA (our train.verl params: rank 64, alpha 32, all-linear,
# excluding .*visual.*); a smaller rank for speed, and alpha != rank so a wrong scale shows.
RANK, ALPHA = 8, 16
TARGET_MODULES = "all-linear"
EXCLUDE_MODULES = ".*visual.*"


@contextmanager
def single_process_group(folder: Path) -> Iterator[None]:
    """A world-size-1 gloo group, as verl's worker has one per rank (a file store: no port)."""
    import torch.distributed as dist

    if dist.is_initialized():  # someone else's group: verl's manager would use its rank
        pytest.skip("a torch.distributed group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{folder / 'pg_store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def lora_actor(model_dir: Path):
    """The actor as verl's FSDP engine builds it with LoRA: the base in float32
    (engine ``model_dtype`` fp32, transformer_impl.py:258-264), then ``get_peft_model`` with
    the config of ``_build_lora_module`` (transformer_impl.py:338-383)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    module.enable_input_require_grads()
    return get_peft_model(module, LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=RANK, lora_alpha=ALPHA, target_modules=TARGET_MODULES,
        exclude_modules=EXCLUDE_MODULES, bias="none"))


def fsdp2(module) -> None:
    """verl's FSDP2 wrapping (transformer_impl.py ``_build_fsdp_module``, strategy fsdp2: our
    default ``actor_strategy``), on a CPU mesh, with verl's default mixed precision."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils.fsdp_utils import apply_fsdp2

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  cast_forward_inputs=True)
    apply_fsdp2(module, {"mesh": mesh, "mp_policy": policy, "offload_policy": None,
                         "reshard_after_forward": True}, {})
