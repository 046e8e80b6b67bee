"""A run stopped from outside (Ctrl-C, SIGTERM, SIGHUP) still ends with its record final: `Hold`
keeps a second signal waiting meanwhile. `kept` says what it left."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from gpubench.core import record
from gpubench.core.secrets import mask_secrets
from gpubench.core.stats import count

# the signals that end a run the way Ctrl-C does (gpubench.cli.signals names them)
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def expect_worker_deaths() -> None:
    """A worker's death is expected from here: `timeout`, Slurm, a terminal signal the whole group,
    and torch's SIGCHLD handler would raise "killed by signal" mid-way through the record."""
    # a Python no-op, not SIG_DFL: a SIGCHLD pending as the handler changes still finds one
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)


class Hold:
    """Around a run: the ending signals act as before until the first one or `arm()`, then wait in
    `late` (skipping the upload; `replay()` delivers one). Main thread only, as Python's handlers."""

    def __init__(self) -> None:
        self.late: list[int] = []
        self.armed = False
        self._before: dict = {}

    def __enter__(self) -> Hold:
        if threading.current_thread() is threading.main_thread():
            for s in ENDING_SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                    self._before[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._before.items():
            # one the delivered handler changed meanwhile stays as it left it (gpubench's
            # SIGTERM handler ignores later SIGTERMs, so the cleanup it starts can finish)
            if signal.getsignal(s) == self._on_signal:
                signal.signal(s, handler)
        self._before = {}

    def arm(self) -> None:  # measuring is over: a signal from here waits
        self.armed = True

    def _on_signal(self, signum, frame) -> None:
        if self.armed:
            self.late.append(signum)
            expect_worker_deaths()
            return
        self.armed = True  # the first signal ends measuring; the next ones wait
        _deliver(signum, self._before[signum], frame)

    def replay(self) -> None:
        """A signal that waited, delivered now through the handler in place (or the default)."""
        if self.late:
            _deliver(self.late[0], signal.getsignal(self.late[0]), None)


def _deliver(signum: int, handler, frame) -> None:
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def kept(run_dir: str | Path) -> str | None:
    """What a stopped run left in `run_dir` (and the upload command when MLflow lacks it)."""
    rec = record.load(run_dir)
    if rec is None:
        return None
    run_dir = Path(run_dir)
    text = (f"status {rec.status.value}, {count(len(rec.phases), 'measured phase')} kept in "
            f"{run_dir / record.RESULTS_FILE}")
    if rec.extra.get("picture"):
        text += f" and {Path(rec.extra['picture']).name}"
    tracking = (rec.config or {}).get("tracking") or {}
    if tracking.get("backend", "none") != "none":
        from gpubench.tracking import resolve_uri, runs

        if not runs.read(run_dir / runs.MARKER_FILE).get("synced"):
            uri = resolve_uri(tracking.get("uri"))
            text += f"; not in MLflow: {runs.sync_command(run_dir, uri)}"
    return mask_secrets(text)
