"""MLflow tracking: every run (and every sweep, as a parent run) lands in MLflow, nothing is lost.

- `translate`: a RunRecord as params, metrics, tags, run name and description (pure);
- `store`: the connection (URI, timeouts, credentials) and the experiment;
- `runs`: one run's upload, its marker file, `log_result` for the runner;
- `sweeps`: a sweep's parent run, its best job, its end;
- `sync`: offline upload of what missed MLflow (`python -m gpubench.tracking sync DIR`).

MLflow stays optional: it is imported only inside functions, so `tracking=none` never loads it.
The names below are the package's public face for the runner, the callbacks and the report.
"""

from gpubench.tracking.runs import (
    CONFIG_FILE,
    MARKER_FILE,
    PARENT_ENV,
    PARENT_FILE,
    log_result,
    read_overrides,
    upload,
    write_marker,
)
from gpubench.tracking.store import (
    Store,
    TrackingUnavailable,
    default_uri,
    open_store,
    resolve_uri,
    ui_hint,
    uri_problem,
)
from gpubench.tracking.sweeps import best_job, close_sweep, log_sweep_files, mark_ended, open_sweep
from gpubench.tracking.translate import RUN_STATUS

__all__ = [
    "CONFIG_FILE", "MARKER_FILE", "PARENT_ENV", "PARENT_FILE", "RUN_STATUS", "Store",
    "TrackingUnavailable", "best_job", "close_sweep", "default_uri", "log_result",
    "log_sweep_files", "mark_ended", "open_store", "open_sweep", "read_overrides",
    "resolve_uri", "ui_hint", "upload", "uri_problem", "write_marker",
]
