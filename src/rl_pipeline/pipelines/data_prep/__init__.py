"""The data_prep stage: raw records to verl-ready prompt parquet files."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
