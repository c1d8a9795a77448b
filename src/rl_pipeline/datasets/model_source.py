"""The base model as a catalog entry: resolved to a Hugging Face folder, loaded as its path."""

from __future__ import annotations

from typing import Any

from kedro.io import AbstractDataset, DatasetError

from rl_pipeline.models.locate import ModelResolutionError
from rl_pipeline.models.resolve import RESOLVED_DIR, resolve_model


class ModelSourceDataset(AbstractDataset[None, str]):
    """Any model input (HF folder, model-import layouts, MLflow folder, GGUF, hub id).

    Loading resolves it into a normal Hugging Face folder under ``resolved_dir`` (links to
    the original files, or a one-time GGUF conversion; cached) and returns that folder's
    path. Nodes then read what they need: the tokenizer alone, or the weights.

    Args:
        source: The model input. Named ``source``, not ``path``, because Kedro would turn a
            hub id such as ``Qwen/Qwen2.5-0.5B-Instruct`` into a local path.
        resolved_dir: Where resolved folders are kept.
        chat_template: A Jinja chat template (or a .jinja file) for models without one.
        link_files: Link a model folder's files (false: copy them, for a ``resolved_dir`` on
            storage that other machines share, as a Ray cluster's nodes do).
    """

    def __init__(self, *, source: str, resolved_dir: str = RESOLVED_DIR,
                 chat_template: str | None = None, link_files: bool = True,
                 metadata: dict[str, Any] | None = None) -> None:
        self._source = source
        self._link_files = link_files
        self._resolved_dir = resolved_dir
        self._chat_template = chat_template
        self.metadata = metadata

    def load(self) -> str:
        try:
            resolved = resolve_model(self._source, self._resolved_dir, self._chat_template,
                                     link_files=self._link_files)
        except (ModelResolutionError, ValueError) as exc:
            raise DatasetError(str(exc)) from exc
        return str(resolved.path)

    def save(self, data: Any) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only")

    def _exists(self) -> bool:
        # No stage writes a model source, so a run's check of its inputs has nothing to say
        # about it (Kedro's default warns instead); load names whatever is wrong with it.
        return True

    def _describe(self) -> dict[str, Any]:
        return {"source": self._source, "resolved_dir": self._resolved_dir}
