"""`tracking.uri` (MLflow's store) and `hydra.sweeper.storage` (Optuna's), checked before any
work: a malformed one failed only when the run was logged or the study opened."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpubench.config.errors import ConfigError
from gpubench.core.secrets import mask_secrets
from gpubench.core.uris import MLFLOW_SQL_SCHEMES, SQL_SCHEMES, sqlite_path

# The tracking stores MLflow 3.17 opens: its file store (`file:`, a folder path) raises "in
# maintenance mode" unless MLFLOW_ALLOW_FILE_STORE is true (FileStore.__init__); its Unity Catalog
# schemes (databricks-uc, uc) always raise as tracking URIs (_get_databricks_uc_rest_store).
TRACKING_SCHEMES = ("http", "https", *MLFLOW_SQL_SCHEMES, "databricks")
FILE_STORE_OPT_IN = "MLFLOW_ALLOW_FILE_STORE"
FILE_STORE_REFUSED = (" (MLflow 3 refuses file stores, `file:` or a folder path: use "
                      "sqlite:///path/mlflow.db, where `mlflow migrate-filestore` moves an old "
                      f"./mlruns, or set {FILE_STORE_OPT_IN}=true)")
STORAGE_SCHEMES = SQL_SCHEMES  # Optuna's RDB storage takes a SQLAlchemy URL
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$")


def check_tracking_uri(uri: Any) -> None:
    """tracking.uri (`sync --uri`, `report --tracking-uri`): a store MLflow opens."""
    if uri == "databricks":  # store names, not paths (mlflow/tracking/registry.py)
        return
    named = uri in ("databricks-uc", "uc")
    # MLflow's opt-in, read as MLflow reads a boolean (_BooleanEnvironmentVariable: "true", "1")
    file_ok = not named and os.environ.get(FILE_STORE_OPT_IN, "").strip().lower() in ("true", "1")
    try:
        check_uri("tracking.uri", uri, TRACKING_SCHEMES + ("file",) * file_ok, path_ok=file_ok)
    except ConfigError as e:
        if not (file_ok or named) and str(uri).strip() and local_store(str(uri))[1]:
            # `file:` or a bare path: say what to use instead
            raise ConfigError(e.key, e.value, e.allowed + FILE_STORE_REFUSED) from None
        raise


def check_uri(key: str, uri: Any, schemes: tuple[str, ...], path_ok: bool = False) -> None:
    """`path_ok`: a bare local path is a store too."""
    if uri is None:
        return
    # the line names the URI, never its password
    text, shown = str(uri), mask_secrets(str(uri))
    allowed = f"a URI with scheme {', '.join(schemes)}" + (" or a local path" if path_ok else "")
    if not text.strip() or any(c.isspace() for c in text):
        raise ConfigError(key, shown, allowed + " (no spaces)")
    m = _SCHEME.match(text)
    if m is None or (path_ok and len(m.group(1)) == 1):  # no scheme (or a Windows drive letter)
        if path_ok:
            return
        raise ConfigError(key, shown, allowed)
    scheme, rest = m.group(1).lower(), m.group(2)
    base, _, driver = scheme.partition("+")
    if base not in schemes or (driver and base not in SQL_SCHEMES):
        raise ConfigError(key, shown, allowed + (" (+driver for databases)" if driver else ""))
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 - ValueError: not a number, or past 65535
    except ValueError:
        raise ConfigError(key, shown, f"{allowed}, with a port number in [0, 65535]") from None
    if base in ("http", "https") and not parts.hostname:
        raise ConfigError(key, shown, f"{base}://host[:port][/path]")
    # an in-memory sqlite:// is an Optuna storage (a throwaway study), never a tracking store:
    # no run logged there outlives the process
    memory_ok = key != "tracking.uri" and rest == "//"
    if base == "sqlite" and not (memory_ok or (rest.startswith("///") and len(rest) > 3)):
        raise ConfigError(key, shown, "sqlite:///relative/path.db or sqlite:////absolute/path.db"
                          + (" or sqlite://" if key != "tracking.uri" else ""))
    if base in SQL_SCHEMES and base != "sqlite" and (not rest.startswith("//") or rest == "//"):
        raise ConfigError(key, shown, f"{scheme}://[user[:password]@]host[:port]/database")
    if base == "file" and not parts.path:
        raise ConfigError(key, shown, "file:///absolute/folder")


def local_store(uri: str) -> tuple[Path | None, bool]:
    """(path, is a folder) of a tracking store on this disk; (None, False): a server, remote DB."""
    db = sqlite_path(uri)
    if db is not None:
        return db, False
    m = _SCHEME.match(uri)
    if m is None or len(m.group(1)) == 1:  # a bare path (or a Windows drive letter)
        return Path(uri), True
    if m.group(1).lower() == "file":
        return Path(urlsplit(uri).path), True
    return None, False
