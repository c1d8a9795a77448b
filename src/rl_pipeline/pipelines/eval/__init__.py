"""The eval stage: base versus trained model on the validation prompts."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
