"""Boundary: the LoRA tensors verl sends to its vLLM rollout pass vLLM 0.24's own loader.

On a GPU, verl's weight sync hands vLLM the adapter as tensors: the FSDP engine collects
them with ``collect_lora_params`` and ``convert_weight_keys`` (``get_per_tensor_param``,
adapter mode), and verl's hijacked ``WorkerLoRAManager._load_adapter``
(``verl/utils/vllm/utils.py``) builds ``PEFTHelper.from_dict(peft_config)``, checks it with
``validate_legal`` against the server's ``LoRAConfig`` (``max_lora_rank`` from verl's
``get_vllm_max_lora_rank`` of our rank) and loads ``LoRAModel.from_lora_tensors`` on CPU.
Here verl's collection runs on an FSDP2-wrapped PEFT tiny Qwen2 on gloo, and vLLM's loader
runs in a child process with vLLM importable (the parser folder of ``make vllm-parser``,
vLLM's own Python code). A name vLLM cannot place, a rank it refuses or a shape mismatch
fails here instead of as a silent base-model rollout on the first GPU run. The first base
sync's names (``base_sync_done=False``) are checked against vLLM's Qwen2 weight mapping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_pipeline.engines.verl.vllm_args import parser_path, vllm_source
from tests.gpu_boundary.verl_actor import RANK, fsdp2, lora_actor, single_process_group

pytestmark = [pytest.mark.gpu_boundary, pytest.mark.slow]

# What the child runs: vLLM's loader path as verl's hijack calls it, reported as JSON.
LOADER = r'''
import json, sys, torch
from safetensors.torch import load_file
from vllm.config.lora import LoRAConfig
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank

import vllm.lora.lora_model as lora_model
# vLLM pins the CPU copies of the factors for fast upload to the GPU; a CPU-only torch
# cannot pin. Pinning changes where the bytes live, not what is loaded.
lora_model.PIN_MEMORY = False
folder = sys.argv[1]
job = json.load(open(f"{folder}/job.json"))
peft_helper = PEFTHelper.from_dict(job["peft_config"])
config = LoRAConfig(max_lora_rank=get_vllm_max_lora_rank(job["rank"]), max_loras=1)
peft_helper.validate_legal(config)
lora = LoRAModel.from_lora_tensors(lora_model_id=1, tensors=load_file(f"{folder}/lora.safetensors"),
                                   peft_helper=peft_helper, device="cpu", dtype=torch.bfloat16,
                                   model_vocab_size=job["vocab"])
# Qwen2Model.load_weights: each stacked shard's name becomes its fused parameter's.
stacked = [(fused, shard) for fused, shards in Qwen2ForCausalLM.packed_modules_mapping.items()
           for shard in shards]
def vllm_name(name):
    name = name.replace(".base_layer.", ".")
    for fused, shard in stacked:
        if f".{shard}." in name:
            return name.replace(f".{shard}.", f".{fused}.")
    return name
print("REPORT " + json.dumps({
    "max_lora_rank": config.max_lora_rank,
    "modules": {name: [list(l.lora_a.shape), list(l.lora_b.shape), l.rank]
                for name, l in lora.loras.items()},
    "packed": Qwen2ForCausalLM.packed_modules_mapping,
    "base": sorted({vllm_name(n) for n in job["base_names"]}),
}))
'''


def _verl_sync_tensors(model_dir: Path, folder: Path) -> tuple[dict, dict, list[str]]:
    """The adapter tensors and peft config verl's FSDP engine sends (adapter mode), and the
    base weight names of its first sync."""
    from peft import PeftModel  # noqa: F401 (verl's collection expects a peft model)
    from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper
    from verl.utils.model import convert_weight_keys

    torch.manual_seed(0)
    with single_process_group(folder):
        actor = lora_actor(model_dir)
        fsdp2(actor)
        ids = torch.randint(0, actor.config.vocab_size, (2, 12))
        optimizer = torch.optim.AdamW(actor.parameters(), lr=5e-2)
        actor(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()  # lora_B leaves zero: real factors travel
        peft_config = actor.peft_config["default"]
        lora = convert_weight_keys(collect_lora_params(actor, layered_summon=False,
                                                       base_sync_done=True), actor)
        base = collect_lora_params(actor, layered_summon=False, base_sync_done=False)
        base = convert_weight_keys({replace_lora_wrapper(k, peft_config): v
                                    for k, v in base.items()}, actor)
    config = peft_config.to_dict()
    return ({k: v.detach().contiguous() for k, v in lora.items()},
            json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set)
                                  else str(o))),
            sorted(base))


def test_vllms_lora_loader_takes_the_adapter_tensors_verl_sends(tiny_model_dir,
                                                                  tmp_path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig

    source = vllm_source()
    assert source is not None, "run `make vllm-parser`"
    tensors, peft_config, base_names = _verl_sync_tensors(tiny_model_dir, tmp_path)
    assert tensors and all("lora_A" in k or "lora_B" in k for k in tensors)
    save_file(tensors, str(tmp_path / "lora.safetensors"))
    hf = AutoConfig.from_pretrained(tiny_model_dir)
    (tmp_path / "job.json").write_text(json.dumps({
        "peft_config": peft_config, "rank": RANK, "vocab": hf.vocab_size,
        "base_names": base_names}))
    env = dict(os.environ)
    if source != "installed":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(parser_path()),
                                                          env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=300)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert result.returncode == 0 and line, result.stderr[-4000:]
    report = json.loads(line[len("REPORT "):])

    # Every module the actor trained is one vLLM loaded, with the factors' shapes and rank.
    layers = hf.num_hidden_layers
    projections = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    expected = {f"model.layers.{i}.{'self_attn' if p[0] in 'qkvo' else 'mlp'}.{p}"
                for i in range(layers) for p in projections}
    assert set(report["modules"]) == expected
    for name, (a_shape, b_shape, rank) in report["modules"].items():
        # vLLM 0.24 keeps peft's layout: A (rank, in), B (out, rank).
        prefix = f"base_model.model.{name}"
        assert rank == RANK, name
        assert a_shape == list(tensors[f"{prefix}.lora_A.weight"].shape) == [RANK, a_shape[1]]
        assert b_shape == list(tensors[f"{prefix}.lora_B.weight"].shape) == [b_shape[0], RANK]
    assert report["max_lora_rank"] >= RANK
    # The first base sync: every name maps onto a parameter of vLLM's Qwen2 (the stacked
    # q/k/v and gate/up shards onto their fused projections), none keeps a peft wrapper.
    fused = set(report["packed"])
    for name in report["base"]:
        assert "base_layer" not in name and "lora_" not in name, name
        module = name.rsplit(".", 2)[-2]
        assert module in fused | {"o_proj", "down_proj", "embed_tokens", "norm",
                                  "input_layernorm", "post_attention_layernorm", "lm_head"}, name
    assert any(".qkv_proj." in n for n in report["base"])
    assert any(".gate_up_proj." in n for n in report["base"])
