"""Merged models in MLflow's Model Registry: their versions, what each carries, and the
``candidate`` and ``champion`` aliases.

A version refers to a merged model where the Data Catalog keeps it (its ``source`` is the
versioned folder's ``file://`` URI; the tags name the folder and the catalog version), so
gigabytes of weights are not copied into MLflow's artifact store; with
``registry.copy_weights`` the merge run logs the weights (transformers flavour) and the
version is made from them instead. Either way a version carries the train and merge runs, the
prompt versions, the run identity, the base model, the engine and the SHA-256 of every weight
file; eval adds its results, and the promote stage moves the aliases.

Every write to the registry is made here: its vocabulary (:mod:`.names`), its versions and
eval's results on them (:mod:`.versions`), and the promote stage's gate
(:mod:`.promotion`). The nodes call these in a few lines.
"""

from rl_pipeline.model_registry.names import (
    CANDIDATE,
    CHAMPION,
    EVAL_RUN_TAG,
    EVIDENCE_FILE,
    PATH_TAG,
    PROMOTED_TAG,
    QUICK_CHECK_TAG,
    REASONS_TAG,
    REFUSED_TAG,
    STORAGE_TAG,
    TAG_LIMIT,
    RegistryError,
    tag_value,
)
from rl_pipeline.model_registry.promotion import promote_candidate
from rl_pipeline.model_registry.versions import (
    alias,
    alias_folders,
    client,
    is_folder,
    is_registered,
    mark_folder_removed,
    model_folder,
    read_evidence,
    record_eval,
    register_merged_model,
    version_for_folder,
    version_tags,
)

__all__ = [
    "CANDIDATE", "CHAMPION", "EVAL_RUN_TAG", "EVIDENCE_FILE", "PATH_TAG", "PROMOTED_TAG",
    "QUICK_CHECK_TAG", "REASONS_TAG", "REFUSED_TAG", "STORAGE_TAG", "TAG_LIMIT",
    "RegistryError", "alias", "alias_folders", "client", "is_folder", "is_registered",
    "mark_folder_removed",
    "model_folder", "promote_candidate", "read_evidence", "record_eval",
    "register_merged_model", "tag_value", "version_for_folder", "version_tags",
]
