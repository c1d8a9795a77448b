"""The contract between train and merge: one folder and a record of what it holds.

Every engine's export leaves one folder of one of two kinds, and writes :data:`RECORD` into
it; merge reads the record and nothing else about how the engine trained. Neither side owns
this module, so train and merge never import each other.

- ``peft_adapter``: a LoRA adapter in peft's layout (``adapter_config.json`` and its
  weights), to be folded into the base model.
- ``hf_model``: a whole Hugging Face model folder (``config.json`` and safetensors weights),
  when all weights were trained.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from peft.utils import CONFIG_NAME as ADAPTER_CONFIG
from transformers.utils import CONFIG_NAME as MODEL_CONFIG
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from rl_pipeline.errors import UserError

RECORD = "training_result.json"
FORMAT = 1
Kind = Literal["peft_adapter", "hf_model"]
KINDS: tuple[str, ...] = get_args(Kind)


class TrainingResultError(UserError, ValueError):
    """A training result folder or its record is not what merge can take."""


@dataclass(frozen=True)
class TrainingResult:
    """What an engine's export left: its kind, the engine, its run summary, where it came from.

    ``checks`` holds what the export verified (verl's checkpoint conversion, say), so merge's
    metadata carries it forward.
    """

    kind: Kind
    engine: str
    run: dict[str, Any]
    source: str | None = None
    checks: dict[str, Any] = field(default_factory=dict)

    def write(self, folder: str | Path) -> Path:
        """Write the record into ``folder``, after checking the folder holds this kind."""
        folder = Path(folder)
        _check_holds(folder, self.kind, folder / RECORD)
        path = folder / RECORD
        path.write_text(json.dumps({"format": FORMAT, **asdict(self)}, indent=2, default=str))
        return path

    @classmethod
    def read(cls, folder: str | Path) -> TrainingResult:
        """The record in ``folder``, checked against what the folder holds.

        Raises:
            TrainingResultError: Naming the file, the field and what was expected.
        """
        folder = Path(folder)
        path = folder / RECORD
        if not path.is_file():
            raise TrainingResultError(
                f"{path}: missing. The train stage writes it with every result (a peft adapter "
                f"or a whole model folder); run `kedro run --pipelines train` again")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TrainingResultError(f"{path}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise TrainingResultError(f"{path}: a JSON object expected, found "
                                      f"{type(data).__name__}")
        if data.get("format") != FORMAT:
            raise TrainingResultError(f"{path}: field 'format' is {data.get('format')!r}; "
                                      f"this version reads format {FORMAT}")
        if data.get("kind") not in KINDS:
            raise TrainingResultError(f"{path}: field 'kind' is {data.get('kind')!r}; "
                                      f"expected one of {', '.join(KINDS)}")
        for name, kind in (("engine", str), ("run", dict)):
            if not isinstance(data.get(name), kind):
                raise TrainingResultError(f"{path}: field {name!r} is {data.get(name)!r}; "
                                          f"expected a {'string' if kind is str else 'mapping'}")
        result = cls(kind=data["kind"], engine=data["engine"], run=data["run"],
                     source=data.get("source"), checks=data.get("checks") or {})
        _check_holds(folder, result.kind, path)
        return result


def _check_holds(folder: Path, kind: str, record: Path) -> None:
    if kind == "peft_adapter":
        if not (folder / ADAPTER_CONFIG).is_file():
            raise TrainingResultError(f"{record}: kind peft_adapter, but {folder} has no "
                                      f"{ADAPTER_CONFIG}")
        return
    weights = (folder / SAFE_WEIGHTS_NAME).is_file() or (
        folder / SAFE_WEIGHTS_INDEX_NAME).is_file()
    if not (folder / MODEL_CONFIG).is_file() or not weights:
        raise TrainingResultError(f"{record}: kind hf_model, but {folder} lacks "
                                  f"{MODEL_CONFIG} or {SAFE_WEIGHTS_NAME} (or its index)")
