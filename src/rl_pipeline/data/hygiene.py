"""Duplicates, train/validation overlap and the validation split, on work frames."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rl_pipeline.data.prompts import DataError


def drop_duplicate_questions(work: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Keep the first of each group of identical questions; also return how many were dropped."""
    keep = ~work["question"].duplicated(keep="first")
    return work[keep].reset_index(drop=True), int((~keep).sum())


def split_validation(work: pd.DataFrame, fraction: float, seed: int
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split a seeded random fraction of the rows off as validation (at least one row each)."""
    n = len(work)
    if n < 2:
        raise DataError(f"cannot split a validation set off {n} training row(s); "
                         "give a validation input (raw_val) or more training data")
    n_val = min(n - 1, max(1, round(n * fraction)))
    order = np.random.default_rng(seed).permutation(n)
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
    return (work.iloc[train_idx].reset_index(drop=True),
            work.iloc[val_idx].reset_index(drop=True))


def train_val_overlap(train: pd.DataFrame, val: pd.DataFrame) -> pd.Series:
    """A boolean mask over train: the rows whose question also appears in val."""
    return train["question"].isin(set(val["question"]))
