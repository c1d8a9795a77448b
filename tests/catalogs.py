"""Catalog pieces for tests that run pipelines with a bare runner."""

from __future__ import annotations

from kedro.io import MemoryDataset


class KeptDataset(MemoryDataset):
    """A MemoryDataset the runner does not release after its last reader, so that a test
    reads an intermediate output (one a later node consumes) after the run."""

    def _release(self) -> None:
        pass
