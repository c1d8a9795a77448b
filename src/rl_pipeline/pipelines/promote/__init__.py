"""The promote stage: the candidate replaces the champion only on evidence."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
