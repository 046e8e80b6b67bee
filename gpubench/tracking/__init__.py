"""MLflow tracking: every run (and every sweep, as a parent run) lands in MLflow, nothing is lost.
`translate` (a record as MLflow sees it, pure), `store` (the connection), `runs` (one run's
upload and marker), `sweeps` (a sweep's parent run), `sync` (offline upload of what missed
MLflow). MLflow is imported only inside functions, so `tracking=none` never loads it.
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
