"""Merging a LoRA adapter into its base model, one safetensors shard at a time.

peft's ``merge_and_unload`` needs the whole model in memory, and verl's model merger does
not merge LoRA at all (it writes the base weights plus an adapter). This merge streams: it
reads one base tensor at a time, adds ``scale * B @ A`` (computed in float32) when the
tensor is adapted, casts it to the output dtype and appends it to the output shard, so peak
memory stays near the largest tensor, not the model or even a shard. It is written by hand
because no library merges shard by shard, and safetensors' own writer needs every tensor
of a file in memory at once; the file format is simple and documented (an 8-byte header
length, a JSON header of dtypes, shapes and byte offsets, then the raw bytes).
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from rl_pipeline.errors import UserError

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>A|B)"
                       r"(?:\.[^.]+)?\.weight$")
# Files of a model folder that the merge copies as they are (weights are rewritten).
_COPY_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".py")
_SKIP = {"model.safetensors.index.json", "model_metadata.json", ADAPTER_CONFIG}


class AdapterError(UserError, ValueError):
    """The adapter cannot be merged into this base; the message says why."""


@dataclass
class LoraAdapter:
    """An adapter's settings and where its low-rank factors are, by base weight name.

    The factors are read on demand (:meth:`factors_for`), so the merge holds only the ones
    of the tensor at hand.
    """

    path: Path
    weights: Path
    rank: int
    alpha: float
    use_rslora: bool
    keys: dict[str, tuple[str, str]]  # base weight key -> (lora_A key, lora_B key)
    shapes: dict[str, tuple[list[int], list[int]]]  # base weight key -> (A shape, B shape)
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    # GPT-2's Conv1D layers store their weight as (in, out): the delta is (B @ A) transposed.
    fan_in_fan_out: bool = False

    @contextmanager
    def open(self) -> Iterator[Any]:
        """A reader of factors: ``reader(weight_key) -> (A, B)``."""
        if self.weights.suffix == ".safetensors":
            with safe_open(str(self.weights), framework="pt") as handle:
                yield lambda key: tuple(handle.get_tensor(k) for k in self.keys[key])
        else:
            state = torch.load(self.weights, map_location="cpu", weights_only=True, mmap=True)
            yield lambda key: tuple(state[k] for k in self.keys[key])

    def scale(self, weight_key: str) -> float:
        """``alpha / r`` (or ``alpha / sqrt(r)`` with rsLoRA), honouring per-module patterns."""
        module = weight_key.removesuffix(".weight")
        rank = _by_pattern(self.rank_pattern, module, self.rank)
        alpha = _by_pattern(self.alpha_pattern, module, self.alpha)
        return alpha / (math.sqrt(rank) if self.use_rslora else rank)


def read_adapter(folder: str | Path) -> LoraAdapter:
    """Read a peft LoRA adapter folder (TRL's, peft's, or verl's model merger ``lora_adapter``).

    Raises:
        AdapterError: If the folder is not a LoRA adapter, or its alpha is 0 or missing (as
            some verl versions write it), or its rank is not positive.
    """
    folder = Path(folder)
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        raise AdapterError(f"{folder}: no {ADAPTER_CONFIG}; expected a peft LoRA adapter folder")
    config = json.loads(config_path.read_text())
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{config_path}: peft_type={config.get('peft_type')!r}; only LORA "
                           "adapters can be merged")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0:
        raise AdapterError(f"{config_path}: r={rank!r}; the LoRA rank must be a positive integer")
    if not alpha:
        raise AdapterError(
            f"{config_path}: lora_alpha={alpha!r}. With alpha 0 or missing the adapter would "
            "merge as a no-op (scale alpha/r = 0), which is how some verl versions write their "
            "lora_adapter. Set lora_alpha in adapter_config.json to the value used in training "
            "(train.verl.actor_model_lora_alpha; the spec's default is 32).")
    weights, keys, shapes = _index_factors(folder)
    if not keys:
        raise AdapterError(f"{folder}: the adapter has no lora_A/lora_B weights")
    return LoraAdapter(path=folder, weights=weights, rank=rank, alpha=float(alpha),
                       use_rslora=bool(config.get("use_rslora")), keys=keys, shapes=shapes,
                       rank_pattern=config.get("rank_pattern") or {},
                       alpha_pattern=config.get("alpha_pattern") or {}, config=config,
                       fan_in_fan_out=bool(config.get("fan_in_fan_out")))


def check_fits(adapter: LoraAdapter, base_dir: str | Path) -> dict[str, str]:
    """Check that every adapted weight exists in the base with matching shapes.

    Returns:
        Each adapted weight key mapped to the base shard file that holds it.

    Raises:
        AdapterError: Naming the modules missing from the base, or whose shapes differ.
    """
    shards = weight_shards(base_dir)
    missing, mismatched = [], []
    for key, (a, b) in sorted(adapter.shapes.items()):
        if key not in shards:
            missing.append(key)
            continue
        with safe_open(str(Path(base_dir) / shards[key]), framework="pt") as handle:
            shape = handle.get_slice(key).get_shape()
        delta = (a[1], b[0]) if adapter.fan_in_fan_out else (b[0], a[1])
        if len(shape) != 2 or delta != tuple(shape) or a[0] != b[1]:
            mismatched.append(f"{key}: base {list(shape)}, adapter B{list(b)} @ A{list(a)}")
    if missing or mismatched:
        lines = [f"adapter {adapter.path} does not fit the base model {base_dir}:"]
        if missing:
            lines.append(f"  {len(missing)} target module(s) not in the base, e.g. "
                         + ", ".join(missing[:5]))
        if mismatched:
            lines.append(f"  {len(mismatched)} shape mismatch(es), e.g. "
                         + "; ".join(mismatched[:5]))
        lines.append("Was it trained on this base model (target_modules, rank)?")
        raise AdapterError("\n".join(lines))
    return {key: shards[key] for key in adapter.keys}


def merge_lora(base_dir: str | Path, adapter: LoraAdapter, out_dir: str | Path,
               dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Write ``base + scale * B @ A`` for every adapted weight into ``out_dir``, shard by shard.

    Args:
        base_dir: A Hugging Face model folder with safetensors weights.
        adapter: The adapter (see :func:`read_adapter`).
        out_dir: The output folder (created if missing; must be empty).
        dtype: The output dtype; None keeps each weight's base dtype.

    Returns:
        A summary: merged module count, shard count, dtype.
    """
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    shards = check_fits(adapter, base_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"merge output folder {out_dir} is not empty")
    files = sorted(set(weight_shards(base_dir).values()))
    merged, dtypes = 0, set()
    with adapter.open() as factors:
        for shard in tqdm(files, desc="Merging shards", unit="shard",
                          disable=len(files) < 2 or None):
            with safe_open(str(base_dir / shard), framework="pt") as handle:
                keys = list(handle.keys())
                layout = {}
                for key in keys:
                    view = handle.get_slice(key)
                    source = _DTYPES_BY_NAME[view.get_dtype()]
                    layout[key] = (_out_dtype(source, dtype), view.get_shape())
                with _ShardWriter(out_dir / shard, layout, handle.metadata()) as writer:
                    for key in keys:
                        tensor = handle.get_tensor(key)
                        if key in adapter.keys and shards[key] == shard:
                            a, b = factors(key)
                            delta = (b.to(torch.float32) @ a.to(torch.float32)) * adapter.scale(key)
                            if adapter.fan_in_fan_out:
                                delta = delta.T
                            tensor = tensor.to(torch.float32).add_(delta)
                            merged += 1
                        writer.write(key, tensor.to(layout[key][0]))
                        dtypes.add(str(layout[key][0]).removeprefix("torch."))
                        del tensor
    _copy_model_files(base_dir, out_dir, files, dtype)
    return {"merged_modules": merged, "shards": len(files), "dtype": ",".join(sorted(dtypes))}


def weight_shards(model_dir: str | Path) -> dict[str, str]:
    """Weight name -> safetensors file, from the shard index or the single weights file."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise AdapterError(f"{model_dir}: no safetensors weights (model.safetensors or an "
                           "index); the merge streams safetensors shards")
    with safe_open(str(single), framework="pt") as handle:
        return {key: single.name for key in handle.keys()}


def _index_factors(folder: Path) -> tuple[Path, dict[str, tuple[str, str]],
                                          dict[str, tuple[list[int], list[int]]]]:
    weights = next((folder / name for name in ADAPTER_WEIGHTS if (folder / name).is_file()),
                   None)
    if weights is None:
        raise AdapterError(f"{folder}: no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    if weights.suffix == ".safetensors":
        with safe_open(str(weights), framework="pt") as handle:
            shapes = {key: handle.get_slice(key).get_shape() for key in handle.keys()}
    else:
        state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
        shapes = {key: list(t.shape) for key, t in state.items()}
    parts: dict[str, dict[str, str]] = {}
    unknown = []
    for key in shapes:
        match = _LORA_KEY.match(key)
        if match is None:
            unknown.append(key)
            continue
        parts.setdefault(f"{match['module']}.weight", {})[match["part"]] = key
    if unknown:
        raise AdapterError(f"{weights}: weights that are not lora_A/lora_B factors (e.g. "
                           f"{', '.join(unknown[:3])}); embedding LoRA and modules_to_save "
                           "are not supported by the merge")
    incomplete = [k for k, v in parts.items() if set(v) != {"A", "B"}]
    if incomplete:
        raise AdapterError(f"{weights}: lora_A without lora_B (or the reverse) for "
                           + ", ".join(incomplete[:5]))
    keys = {key: (v["A"], v["B"]) for key, v in parts.items()}
    return weights, keys, {key: (shapes[a], shapes[b]) for key, (a, b) in keys.items()}


_DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
                torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_DTYPES_BY_NAME = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def _out_dtype(source: torch.dtype, requested: torch.dtype | None) -> torch.dtype:
    return requested if requested is not None and source.is_floating_point else source


# Kept instead of safetensors.torch.save_file, which needs a shard's merged tensors at once: on a
# 1.85 GiB shard that merge peaked at 2,045 MiB anonymous memory, this writer at 402 MiB; 7B
# shards are commonly 4-10 GB. See docs/benchmarks.md, "merge: streaming LoRA merge".
class _ShardWriter:
    """Writes one safetensors file tensor by tensor, in the order of ``layout``.

    The header (dtypes, shapes, byte offsets) is known before any data is read, so each
    tensor goes to disk as soon as it is merged.
    """

    def __init__(self, path: Path, layout: dict[str, tuple[torch.dtype, list[int]]],
                 metadata: dict[str, str] | None) -> None:
        header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
        offset = 0
        for key, (dtype, shape) in layout.items():
            size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
            header[key] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape),
                           "data_offsets": [offset, offset + size]}
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
        self._path, self._expected = path, list(layout)
        self._file = open(path, "wb")
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)
        self._written: list[str] = []

    def write(self, key: str, tensor: torch.Tensor) -> None:
        if key != self._expected[len(self._written)]:
            raise RuntimeError(f"tensor {key} written out of order")
        flat = tensor.contiguous().reshape(-1)
        self._file.write(memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else b"")
        self._written.append(key)

    def __enter__(self) -> _ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()
        if exc[0] is None and self._written != self._expected:
            raise RuntimeError(f"{self._path}: {len(self._expected) - len(self._written)} "
                               "tensors were not written")


def _by_pattern(patterns: dict[str, Any], module: str, default: Any) -> Any:
    # peft's own rule (a key matches the module's name, grouped, at a dotted boundary), so
    # that a key with alternatives such as 'q_proj|v_proj' scales as peft scaled it.
    from peft.utils.other import get_pattern_key

    return patterns.get(get_pattern_key(list(patterns), module), default)


def _copy_model_files(base_dir: Path, out_dir: Path, shards: list[str],
                      dtype: torch.dtype | None) -> None:
    for item in base_dir.iterdir():
        if item.name in _SKIP or item.name in shards or not item.is_file():
            continue
        if item.suffix in _COPY_SUFFIXES:
            shutil.copy(item, out_dir / item.name)
    index = base_dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = sum(
            (out_dir / shard).stat().st_size for shard in shards)
        (out_dir / index.name).write_text(json.dumps(data, indent=2))
    if dtype is not None and (out_dir / "config.json").is_file():
        config = json.loads((out_dir / "config.json").read_text())
        name = str(dtype).removeprefix("torch.")
        config["dtype"] = name
        config.pop("torch_dtype", None)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2))
