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


# Query parameters that carry a secret in the URLs of tracking servers and their proxies.
_SECRET_QUERY = ("token", "key", "secret", "password", "passwd", "auth", "sig", "credential")


def uri_credentials(uri: str | None) -> str | None:
    """``uri`` with its credentials masked, when it carries any (a user name or password, or a
    query parameter such as ``?token=``); None when it carries none.

    MLflow prints the tracking URI of every run it ends ("View run ... at: URI/#/..."), and
    verl logs the URI its workers are given as a parameter: a secret in it ends in logs and
    in MLflow. Servers take a login from MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD
    (or MLFLOW_TRACKING_TOKEN) instead."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    parts = urlsplit(uri or "")
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret = [k for k, _ in query if any(word in k.lower() for word in _SECRET_QUERY)]
    if not (parts.username or parts.password or secret):
        return None
    netloc = parts.netloc.rpartition("@")[2]
    if parts.username or parts.password:
        netloc = f"***@{netloc}"
    masked = urlencode([(k, "***" if k in secret else v) for k, v in query], safe="*")
    return parts._replace(netloc=netloc, query=masked).geturl()
