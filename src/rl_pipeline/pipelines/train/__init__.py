"""The train pipeline: preflight, then training with the configured engine."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
