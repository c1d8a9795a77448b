"""The preflight pipeline: check a training configuration on any machine, train nothing."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
