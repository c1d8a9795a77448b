"""The merge stage: a standalone model from base plus LoRA adapter, verified."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
