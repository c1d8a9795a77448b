"""The base model as a catalog entry: a path handed to nodes, never weights in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError


class ModelSourceDataset(AbstractDataset[None, str]):
    """A model folder or GGUF file on disk; loads as its path.

    Nodes decide what to read (the tokenizer alone, or the weights), so loading the entry
    costs nothing.
    """

    def __init__(self, *, path: str, metadata: dict[str, Any] | None = None) -> None:
        self._path = path
        self.metadata = metadata

    def load(self) -> str:
        path = Path(self._path)
        if not path.exists():
            raise DatasetError(
                f"base model not found: {path}. Expected a Hugging Face model folder or a "
                ".gguf file; `make model` fetches the default SmolLM2-135M-Instruct GGUF."
            )
        return str(path)

    def save(self, data: Any) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only")

    def _exists(self) -> bool:
        return Path(self._path).exists()

    def _describe(self) -> dict[str, Any]:
        return {"path": self._path}
