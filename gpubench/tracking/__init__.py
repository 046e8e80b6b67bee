"""MLflow tracking: every run (and every sweep, as a parent run) lands in MLflow, nothing is lost.
`translate` (a record as MLflow sees it), `store` (the connection), `runs` (one run's upload),
`sweeps` (a sweep's parent run), `sync` (later upload of what missed MLflow). MLflow is imported
only inside functions, so `tracking=none` never loads it."""

from gpubench.tracking.runs import (
    CONFIG_FILE,
    MARKER_FILE,
    PARENT_ENV,
    PARENT_FILE,
    log_result,
    upload,
)
from gpubench.tracking.store import default_uri, open_store, resolve_uri
from gpubench.tracking.sweeps import best_job, close_sweep, log_sweep_files, mark_ended, open_sweep

__all__ = [
    "CONFIG_FILE", "MARKER_FILE", "PARENT_ENV", "PARENT_FILE", "best_job", "close_sweep",
    "default_uri", "log_result", "log_sweep_files", "mark_ended", "open_store", "open_sweep",
    "resolve_uri", "upload",
]
