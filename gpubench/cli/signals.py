"""Ctrl-C, SIGTERM (schedulers, `timeout`) and SIGHUP (a dropped ssh session) end a command alike:
the run marked `killed` with its phases kept, one line naming them, exit 128 + the signal."""

from __future__ import annotations

import os
import signal

from gpubench.core.exits import ExitCode
from gpubench.run.ending import ENDING_SIGNALS, expect_worker_deaths, kept

NAMES = dict(zip(ENDING_SIGNALS, ("Ctrl-C", "SIGTERM", "SIGHUP"), strict=True))


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP as a KeyboardInterrupt, so every Ctrl-C path handles it."""

    def __init__(self, signum: int) -> None:
        super().__init__(NAMES[signum])
        self.signum = signum


_main_pid: int | None = None


def _on_signal(signum, frame) -> None:
    if os.getpid() != _main_pid:
        # a forked child inherited this handler (DataLoader workers replace it): it ends at once
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    expect_worker_deaths()
    # ignore more of this signal so the cleanup (results.json, MLflow) can finish; SIGKILL won't
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated(signum)


def install_sigterm() -> None:
    """SIGTERM, SIGHUP raise Terminated in the main thread; one ignored at start (nohup) stays."""
    global _main_pid
    _main_pid = os.getpid()
    for s in ENDING_SIGNALS:
        if s != signal.SIGINT and signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _on_signal)


def killed_by_signal(code: int | None) -> bool:
    return code is not None and code - 128 in NAMES


def interrupted_line(e: KeyboardInterrupt) -> tuple[str, int]:
    signum = getattr(e, "signum", signal.SIGINT)
    run_dir = getattr(e, "run_dir", None)  # set by the entry when a run was under way
    what = kept(run_dir) if run_dir else None
    return (f"gpubench: interrupted by {NAMES[signum]}" + (f"; {what}" if what else ""),
            ExitCode(128 + signum))
