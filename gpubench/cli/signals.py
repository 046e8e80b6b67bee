"""Ctrl-C, SIGTERM (schedulers, `timeout`, Kubernetes) and SIGHUP (a dropped ssh session) end a
command the same way: the runner marks the run `killed` and keeps its phases, the entry prints
one line naming what the run kept (gpubench.run.ending.kept) and exits 128 + the signal."""

from __future__ import annotations

import os
import signal

from gpubench.core.exits import ExitCode
from gpubench.run.ending import ENDING_SIGNALS, expect_worker_deaths, kept

# the words the one line names each ending signal by
NAMES = dict(zip(ENDING_SIGNALS, ("Ctrl-C", "SIGTERM", "SIGHUP"), strict=True))


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP as a KeyboardInterrupt: every path that handles Ctrl-C handles it."""

    def __init__(self, signum: int) -> None:
        super().__init__(NAMES[signum])
        self.signum = signum


_main_pid: int | None = None


def _on_signal(signum, frame) -> None:
    if os.getpid() != _main_pid:
        # a forked child inherited this handler (DataLoader workers replace it with torch's
        # own): it ends the way it did before, at once
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    expect_worker_deaths()
    # Further signals of this kind are ignored so the cleanup this one starts (results.json,
    # MLflow) can finish; SIGKILL still ends the process at once.
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated(signum)


def install_sigterm() -> None:
    """SIGTERM and SIGHUP raise Terminated in the main thread (where Python runs handlers and
    the runner waits); one this process was started ignoring (`nohup`'s SIGHUP) stays so."""
    global _main_pid
    _main_pid = os.getpid()
    for s in ENDING_SIGNALS:
        if s != signal.SIGINT and signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _on_signal)


def killed_by_signal(code: int | None) -> bool:
    """Whether a command's exit status says one of the ending signals stopped it."""
    return code is not None and code - 128 in NAMES


def interrupted_line(e: KeyboardInterrupt) -> tuple[str, int]:
    """The one line and exit status (128 + the signal) of a command that a signal ended."""
    signum = getattr(e, "signum", signal.SIGINT)
    run_dir = getattr(e, "run_dir", None)  # set by the entry when a run was under way
    what = kept(run_dir) if run_dir else None
    return (f"gpubench: interrupted by {NAMES[signum]}" + (f"; {what}" if what else ""),
            ExitCode(128 + signum))
