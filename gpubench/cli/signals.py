"""Ctrl-C and SIGTERM (what schedulers, `timeout` and Kubernetes send) end a command the same way:
the runner marks the run `killed` and keeps its phases, and the entry prints one line naming the
run's folder and exits 128 + the signal."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpubench.core import record
from gpubench.core.exits import ExitCode


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as a KeyboardInterrupt: every path that handles
    Ctrl-C (the runner marks the run killed and keeps its phases) handles it too."""


_main_pid: int | None = None


def _ignore_signal(signum, frame) -> None:
    # a Python-level no-op rather than SIG_DFL: a SIGCHLD already pending when the handler
    # changes still finds a Python handler to call
    return


def _on_sigterm(signum, frame) -> None:
    if os.getpid() != _main_pid:
        # a forked child inherited this handler (DataLoader workers replace it with torch's
        # own): it ends the way it did before, at once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    # `timeout`, Slurm and a terminal signal the whole process group, so DataLoader workers get
    # this SIGTERM too and die of it (torch's worker handler exits quietly only when the parent
    # sent it). torch's SIGCHLD handler in this process would then raise "DataLoader worker ...
    # killed by signal" halfway through marking the run killed, replacing this interrupt. The
    # run is ending: worker deaths from here on are expected, so SIGCHLD is no longer watched.
    signal.signal(signal.SIGCHLD, _ignore_signal)
    # Further SIGTERMs are ignored so the cleanup this one starts (results.json, MLflow) can
    # finish; SIGKILL still ends the process at once.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("SIGTERM")


def install_sigterm() -> None:
    # Python runs signal handlers in the main thread only, which is where the runner waits, so
    # the exception lands where Ctrl-C's would.
    global _main_pid
    _main_pid = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)


def interrupted_line(e: KeyboardInterrupt) -> tuple[str, ExitCode]:
    """The one line and exit status of a command that Ctrl-C or SIGTERM ended."""
    if isinstance(e, Terminated):
        name, code = "SIGTERM", ExitCode.SIGTERM
    else:
        name, code = "Ctrl-C", ExitCode.SIGINT
    run_dir = getattr(e, "run_dir", None)  # set by the entry when a run was under way
    rec = record.load(run_dir) if run_dir else None
    kept = ""
    if rec is not None:
        kept = (f"; status {rec.status.value}, {len(rec.phases)} measured phase(s) kept in "
                f"{Path(run_dir) / record.RESULTS_FILE}")
    return f"gpubench: interrupted by {name}{kept}", code
