"""Which MLflow tracking stores live on this machine's disk."""

from __future__ import annotations


def is_local_store(uri: str | None) -> bool:
    """Whether the tracking store at ``uri`` is a SQLite database or a folder on this
    machine (None: MLflow's default, ./mlruns) rather than a server. Only this machine
    reaches it, and a tracking server refuses a path on it as a model version's source.

    mlflow's ``is_local_uri`` answers for folders and servers (``databricks`` included) but
    not for SQLite, which it counts as remote."""
    from mlflow.utils.uri import is_local_uri

    return not uri or uri.startswith("sqlite:") or is_local_uri(uri)
