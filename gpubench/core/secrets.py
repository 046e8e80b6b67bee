"""Credentials never leave the process in clear. Tracking URIs and Optuna storages may carry
a password (`postgresql://u:pw@db/x`); everything gpubench writes (files, MLflow params, tags
and artifacts, Optuna user attributes) or prints goes through `mask_secrets`, the one masking
function. Dependency-free, so any module may import it.
"""

from __future__ import annotations

import logging
import re
import sys
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"

# scheme://user:password@  -> scheme://user:***@   (the user name is kept: it helps debugging)
# (greedy up to the last @ before the path: an unencoded @ inside the password stays hidden;
# Hydra escapes the colons of an override as `\:` when it logs or saves it). The scheme and its
# slashes are optional: a malformed URI (`postgresql:u:pw@db`, `u:pw@db`) is shown in the error
# line that rejects it, and keeps its password hidden there too.
_USERINFO = re.compile(r"((?:\b[A-Za-z][A-Za-z0-9+.\-]*\\?:/{0,2})?[^\s/@:'\"\\]*\\?:)"
                       r"([^\s/'\"]+)(@)")
# ?password=...&  or  &token=...  in a URL's query (psycopg, some object stores)
_QUERY = re.compile(r"([?&](?:password|passwd|pwd|token|secret|access_key|secret_key)=)([^&\s'\"]+)",
                    re.IGNORECASE)


def mask_secrets(obj):
    """`obj` with every URL password (userinfo or query) replaced by ***: a string, or every
    string of a JSON-like tree (dicts, lists, tuples); anything else as it is."""
    if isinstance(obj, dict):
        return {k: mask_secrets(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(mask_secrets(v) for v in obj)
    if not isinstance(obj, str) or ("@" not in obj and "=" not in obj):
        return obj
    return _QUERY.sub(rf"\1{MASK}", _USERINFO.sub(rf"\1{MASK}\3", obj))


def say(text: str, level: str = "warning") -> None:
    """One `gpubench: warning: ...` (or error) line on stderr, masked like everything printed."""
    print(mask_secrets(f"gpubench: {level}: {text}"), file=sys.stderr, flush=True)


def error_text(e: BaseException) -> str:
    """An exception as a message's cause: its whole text on one line (never cut mid-sentence),
    masked; its type's name when it has no text. MLflow's and the drivers' errors span lines
    and may quote the URL they were given."""
    return mask_secrets(" ".join(str(e).split())) or type(e).__name__


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(uri without `user:password@`, user, password) for http(s) URIs; other URIs unchanged.
    MLflow's REST client takes credentials from MLFLOW_TRACKING_USERNAME/PASSWORD, not from
    the URL: left in the URL, `requests` resolves `user:pw@host` as a host name."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri, None, None
    host = parts.netloc.rpartition("@")[2]
    user = unquote(parts.username) if parts.username is not None else None
    pw = unquote(parts.password) if parts.password is not None else None
    return urlunsplit(parts._replace(netloc=host)), user, pw


def without_masked_password(uri: str) -> str:
    """A URI read back from a file gpubench wrote, its mask dropped: the driver then falls
    back to the environment (PGPASSWORD, ~/.pgpass) instead of sending *** as the password."""
    return uri.replace(f":{MASK}@", "@")


def mask_logging() -> None:
    """Mask passwords in every log record of this process from now on. Done where records are
    created, not by a handler's filter: Hydra replaces the handlers before and after each job,
    and its launchers log every job's overrides (a URI with its password among them)."""
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_secrets", False):
        return

    def masked(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: logging reports it at emit time, as usual
            return record
        clean = mask_secrets(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return record

    masked.masks_secrets = True
    logging.setLogRecordFactory(masked)
