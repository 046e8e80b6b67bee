"""Which URLs name a database, and where a sqlite URL's file is: the one answer for the config
checks, the tracking store, the sweeper's storage and the sweep manifest."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# SQLAlchemy databases an Optuna RDB storage opens (a driver may follow: postgresql+psycopg)
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")
# MLflow's SQL tracking stores: the same less oracle, which MLflow's store does not support
MLFLOW_SQL_SCHEMES = tuple(s for s in SQL_SCHEMES if s != "oracle")

SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Path | None:
    """The file a `sqlite:///path` URL names (relative to the working directory unless it
    starts with a fourth slash), None for any other URL."""
    if str(url).startswith(SQLITE_PREFIX):
        return Path(str(url)[len(SQLITE_PREFIX):])
    return None


def same_store(a: str | None, b: str | None) -> bool:
    """Whether two tracking URIs name one store: compared without their `user:password@` (a
    URI read back from a file has its password masked) and with the host's case folded."""
    if not a or not b:
        return False

    def bare(uri: str) -> str:
        parts = urlsplit(uri)
        host = parts.netloc.rpartition("@")[2].lower()
        return urlunsplit(parts._replace(scheme=parts.scheme.lower(), netloc=host)).rstrip("/")

    return bare(str(a)) == bare(str(b))
