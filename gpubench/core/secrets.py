"""Credentials never leave the process in clear: URIs may carry a password
(`postgresql://u:pw@db/x`), so everything gpubench writes (files, MLflow, Optuna) or prints
goes through `mask_secrets`. Dependency-free, so any module may import it."""

from __future__ import annotations

import logging
import re
import sys
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"

# scheme://user:password@ -> scheme://user:***@ (the user helps debugging). Greedy to the last
# @ before the path (an unencoded @ in the password stays hidden); Hydra escapes an override's
# colons as `\:`; scheme and slashes optional: a malformed URI (`u:pw@db`) in an error line too.
_USERINFO = re.compile(r"((?:\b[A-Za-z][A-Za-z0-9+.\-]*\\?:/{0,2})?[^\s/@:'\"\\]*\\?:)"
                       r"([^\s/'\"]+)(@)")
# ?password=...&  or  &token=...  in a URL's query (psycopg, some object stores)
_QUERY = re.compile(
    r"([?&](?:password|passwd|pwd|token|secret|access_key|secret_key)=)([^&\s'\"]+)", re.IGNORECASE)


def mask_secrets(obj):
    """`obj` (a string, or a JSON-like tree's strings) with URL passwords masked."""
    if isinstance(obj, dict):
        return {k: mask_secrets(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(mask_secrets(v) for v in obj)
    if not isinstance(obj, str) or ("@" not in obj and "=" not in obj):
        return obj
    return _QUERY.sub(rf"\1{MASK}", _USERINFO.sub(rf"\1{MASK}\3", obj))


def say(text: str, level: str = "warning") -> None:
    print(mask_secrets(f"gpubench: {level}: {text}"), file=sys.stderr, flush=True)


def error_text(e: BaseException) -> str:
    """An exception's whole text on one line, masked (MLflow's and drivers' errors span lines
    and quote URLs); its type's name when it has none."""
    return mask_secrets(" ".join(str(e).split())) or type(e).__name__


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(uri without `user:password@`, user, password) for http(s), other URIs unchanged: MLflow
    takes them from MLFLOW_TRACKING_USERNAME/PASSWORD; `requests` reads `user:pw@host` as a host."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri, None, None
    host = parts.netloc.rpartition("@")[2]
    user, pw = (None if v is None else unquote(v) for v in (parts.username, parts.password))
    return urlunsplit(parts._replace(netloc=host)), user, pw


def without_masked_password(uri: str) -> str:
    """A URI read back from a file, its mask dropped: the driver falls back to the environment
    (PGPASSWORD, ~/.pgpass) instead of sending *** as the password."""
    return uri.replace(f":{MASK}@", "@")


def mask_logging() -> None:
    """Mask every log record of this process from now on, where records are made: Hydra
    replaces the handlers (and filters) around each job, and logs overrides with passwords."""
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
