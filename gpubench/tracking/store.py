"""The connection to an MLflow tracking store: where runs go, how long to wait, credentials.
An http(s) URI's `user:password@` moves into MLFLOW_TRACKING_USERNAME / _PASSWORD while we talk
to the server (MLflow's REST client reads them there; in the URL the host would be `user:pw@host`);
database URIs keep theirs (SQLAlchemy needs them). Anything written or printed is masked."""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from filelock import FileLock

from gpubench.core.files import retry
from gpubench.core.secrets import mask_secrets, split_credentials, without_masked_password
from gpubench.core.uris import SQLITE_PREFIX, sqlite_path
from gpubench.tracking.translate import experiment_tags, page


def no_telemetry() -> None:
    """Off unless set: MLflow 3 sends usage telemetry (3.17: mlflow/telemetry/utils.py)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


no_telemetry()

# a tag value this plain is safe inside a quoted MLflow filter; anything else is compared here
_PLAIN_VALUE = re.compile(r"[\w.\-:]+")
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}  # when a database URL names none


class TrackingUnavailable(RuntimeError):
    """The tracking store could not be reached or refused the upload."""


def default_uri(cwd: str | Path | None = None) -> str:
    """The embedded store: sqlite under <cwd>/outputs, no server needed."""
    return f"{SQLITE_PREFIX}{Path(cwd or Path.cwd()).resolve() / 'outputs' / 'mlflow.db'}"


def resolve_uri(uri: str | None) -> str:
    return str(uri) if uri else default_uri()


def uri_problem(uri: str | None) -> str | None:
    """What is wrong with a tracking URI's form (None when it can be used), never a password."""
    from gpubench.config.errors import ConfigError
    from gpubench.config.uris import check_tracking_uri

    try:
        if uri:  # else the embedded default store
            check_tracking_uri(uri)
    except ConfigError as e:
        return e.allowed
    return None


def ui_hint(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """A link to open: on the server itself, or on the `mlflow ui` that serves a local store."""
    route = page(experiment_id, run_id)  # the training view, gpubench's saved columns
    uri = mask_secrets(uri)
    if uri.startswith(("http://", "https://")):
        return f"{split_credentials(uri)[0].rstrip('/')}/{route}"
    # `mlflow ui` serves a local store at its default --host and --port
    return f"`mlflow ui --backend-store-uri {uri}`, then open http://127.0.0.1:5000/{route}"


def _probe(uri: str, timeout_s: float) -> None:
    """Fail within timeout_s when the store does not answer: a server's /health (with MLflow's
    credentials), else one connection to a database's TCP port or PostgreSQL's Unix socket
    (`?host=/dir`): MLflow would retry creating its engine for about 100 s."""
    parts = urlsplit(uri)
    base = parts.scheme.partition("+")[0]
    port = (parts.port or DB_PORTS[base]) if base in DB_PORTS else None
    sock_dir = parse_qs(parts.query).get("host", [""])[0]
    try:
        if uri.startswith(("http://", "https://")):
            req = urllib.request.Request(f"{uri.rstrip('/')}/health")
            if (user := os.environ.get("MLFLOW_TRACKING_USERNAME")) is not None:
                pair = f"{user}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}".encode()
                req.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
            elif token := os.environ.get("MLFLOW_TRACKING_TOKEN"):
                req.add_header("Authorization", f"Bearer {token}")
            urllib.request.urlopen(req, timeout=timeout_s).close()
        elif base in DB_PORTS and parts.hostname:
            socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
        elif base == "postgresql" and sock_dir.startswith("/"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sk:
                sk.settimeout(timeout_s)
                sk.connect(f"{sock_dir}/.s.PGSQL.{port}")
    except urllib.error.HTTPError:
        pass  # it answered: reachable (a proxy may not route /health; auth is MLflow's call)
    except (OSError, ValueError) as e:
        raise TrackingUnavailable(f"no answer: {mask_secrets(str(getattr(e, 'reason', e)))}") from e


class Store:
    """An MLflow client on one tracking URI and experiment (created if new); `uri` is masked."""

    def __init__(self, uri: str, connect: str, experiment: str):
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):  # store creation chatter at INFO; keep warnings
            logging.getLogger(name).setLevel(logging.WARNING)
        if db := sqlite_path(connect):
            db.parent.mkdir(parents=True, exist_ok=True)  # sqlite creates the file, not the dir
        self.uri, self.experiment = mask_secrets(uri), experiment
        # two processes making a new store's tables or experiment at once collide ("table ...
        # already exists", "Online migration expected to match one row", an experiment made
        # meanwhile): on sqlite one at a time holds `<db>.lock` (the kernel frees it if its
        # holder dies); elsewhere the loser retries, and finds what the winner made
        lock = FileLock(f"{db}.lock", thread_local=False) if db else contextlib.nullcontext()
        # a sqlite store's artifacts beside it (outputs/mlartifacts), not MLflow's ./mlruns in cwd
        artifacts = (db.parent / "mlartifacts").resolve().as_uri() if db else None

        def create() -> None:
            with lock:
                self.client = MlflowClient(tracking_uri=connect)
                exp = self.client.get_experiment_by_name(experiment)
                # its description, kind and runs-table view only on experiments gpubench creates
                self.experiment_id = exp.experiment_id if exp is not None else \
                    self.client.create_experiment(experiment, artifact_location=artifacts,
                                                  tags=experiment_tags())

        retry(create, 3, wait_s=0.5)

    def find(self, tag: str, value: str) -> list:
        """Live runs of this experiment whose tag `tag` equals `value`; a value (from a file)
        enters the filter only when plain, so a quote cannot break or widen it."""
        from mlflow.utils import get_results_from_paginated_fn

        value = str(value)
        filt = f"tags.{tag} = '{value}'" if _PLAIN_VALUE.fullmatch(value) else ""
        runs = get_results_from_paginated_fn(lambda n, token: self.client.search_runs(
            [self.experiment_id], filt, max_results=n, page_token=token), 1000)
        return [r for r in runs if r.data.tags.get(tag) == value]


@contextlib.contextmanager
def connection(uri: str, timeout_s: float = 10.0):
    """The URL MLflow's client gets for `uri` (credentials moved to MLflow's variables), once the
    store answered (else TrackingUnavailable), within MLflow's limits while the block runs."""
    connect, *pair = split_credentials(without_masked_password(uri))
    names = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    # MLflow's HTTP client retries 7 times with exponential backoff and a 120 s timeout: a dead
    # server would hold a finished benchmark for minutes
    env = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout_s))),
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
           "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
           "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # one line of ours instead
           **{k: v for k, v in zip(names, pair, strict=True) if v is not None}}
    saved = {k: os.environ[k] for k in env if k in os.environ}
    os.environ.update(env)
    try:
        _probe(connect, timeout_s)
        yield connect
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


@contextlib.contextmanager
def open_store(uri: str, experiment: str, timeout_s: float = 10.0):
    with connection(uri, timeout_s) as connect:
        yield Store(uri, connect, experiment)
