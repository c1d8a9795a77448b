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


# Words of the query parameters that carry a secret in the URLs of tracking servers and
# their proxies (access_token, api_key, X-Amz-Signature; not author).
_SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "pwd",
                           "auth", "sig", "signature", "credential", "credentials"})


def uri_credentials(uri: str | None) -> str | None:
    """``uri`` with its credentials masked, when it carries any (a password; a server's user
    name, where a token is given; a query parameter such as ``?token=``); None when it
    carries none. (A database's user name alone is no secret: its password may be in
    ~/.pgpass.)

    MLflow prints the tracking URI of every run it ends ("View run ... at: URI/#/..."), and
    verl logs the URI its workers are given as a parameter: a secret in it ends in logs and
    in MLflow. Servers take a login from MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD
    (or MLFLOW_TRACKING_TOKEN) instead."""
    import re
    from urllib.parse import parse_qsl, urlencode, urlsplit

    parts = urlsplit(uri or "")
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret = [k for k, _ in query
              if _SECRET_WORDS & set(re.split(r"[^a-z0-9]+", k.lower()))]
    login = parts.password or (parts.username and parts.scheme in ("http", "https"))
    if not (login or secret):
        return None
    netloc = parts.netloc
    if login:
        netloc = f"***@{netloc.rpartition('@')[2]}"
    masked = urlencode([(k, "***" if k in secret else v) for k, v in query], safe="*")
    return parts._replace(netloc=netloc, query=masked).geturl()
