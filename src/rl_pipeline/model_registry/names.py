"""The Model Registry's vocabulary: its aliases, the tags a reviewer reads, and their limit.
Every registry write goes through :mod:`rl_pipeline.model_registry`; these are its names."""

from __future__ import annotations

import json
from typing import Any

from rl_pipeline.errors import UserError

CANDIDATE = "candidate"
CHAMPION = "champion"
PATH_TAG = "catalog.path"
STORAGE_TAG = "storage"  # where the weights are: the catalog's folder, an MLflow copy, removed
EVIDENCE_FILE = "registry/evidence.json"
REFUSED_TAG = "promote.refused_against"  # the reference a candidate was refused against
PROMOTED_TAG = "promote.promoted_over"  # the reference a champion was promoted over
REASONS_TAG = "promote.reasons"
# The gate's settings (metric, guards, min_prompts) a refusal was decided with: a rerun of
# promote with other settings decides again.
GATE_TAG = "promote.gate"
PROMOTE_RUN_TAG = "promote.run_id"  # the promote run that last decided on a version
EVAL_RUN_TAG = "eval.run_id"  # the eval run whose evidence a version carries
QUICK_CHECK_TAG = "eval.quick_check"  # "true": that eval answered some prompts only
# The earlier versions whose weight files all have this version's SHA-256s (a merge rerun
# of an unchanged training result), comma-separated.
SAME_WEIGHTS_TAG = "same_weights_as"
WEIGHT_TAG_PREFIX = "sha256."  # + a weight file's name: its SHA-256
TAG_LIMIT = 5000  # MLflow keeps tag values up to 8000 characters


class RegistryError(UserError, ValueError):
    """The registry lacks what a stage needs (a candidate, its eval, a champion's weights)."""


def tag_value(value: Any) -> str:
    """``value`` as a tag holds it: text as it is, anything else as JSON, cut to
    :data:`TAG_LIMIT` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:TAG_LIMIT]
