"""Which URLs name a database, and where a sqlite URL's file is."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# SQLAlchemy databases an Optuna RDB storage opens (a driver may follow: postgresql+psycopg)
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")
# MLflow's SQL tracking stores: the same less oracle, which MLflow's store does not support
MLFLOW_SQL_SCHEMES = tuple(s for s in SQL_SCHEMES if s != "oracle")

SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///path` URL (relative unless a fourth slash), else None."""
    text = str(url)
    return Path(text.removeprefix(SQLITE_PREFIX)) if text.startswith(SQLITE_PREFIX) else None


def same_store(a: str | None, b: str | None) -> bool:
    """Two tracking URIs name one store: `user:password@` (read back masked) and case aside."""
    if not a or not b:
        return False

    def bare(uri: str) -> str:
        parts = urlsplit(uri)
        host = parts.netloc.rpartition("@")[2].lower()
        return urlunsplit(parts._replace(scheme=parts.scheme.lower(), netloc=host)).rstrip("/")

    return bare(str(a)) == bare(str(b))
