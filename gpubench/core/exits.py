"""The exit statuses of gpubench's commands: one table, so a script that checks `$?` and the
code that sets it read the same numbers."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # a run or command failed while running (a run's oom or failed status, a report with
    # nothing to report, uploads that failed)
    FAILED = 1
    # bad input: a config key, an override, a command-line argument (what argparse uses too)
    BAD_INPUT = 2
    # measured and kept, but the run did not reach MLflow (`python -m gpubench.tracking sync`)
    NOT_TRACKED = 3
    # a torchrun rank ended because another rank failed (its main thread sits in a collective
    # that will never complete)
    PEER_FAILED = 4
    # measured fine, but its peak memory is above memory.ceiling: the setting does not fit
    # (a sweep's job with this status is a finished trial, and the sweep goes on)
    OVER_CEILING = 5
    # 128 + the signal, as a shell reports a process that a signal ended
    SIGINT = 128 + signal.SIGINT
    SIGTERM = 128 + signal.SIGTERM
    SIGHUP = 128 + signal.SIGHUP  # the terminal went away (a dropped ssh session)
    # the reader of stdout went away (`gpubench --help | head`): what a shell reports for a
    # writer that SIGPIPE ended; Python ignores SIGPIPE and raises BrokenPipeError instead
    BROKEN_PIPE = 128 + signal.SIGPIPE

    @property
    def interrupted(self) -> bool:
        """Ctrl-C, SIGTERM or SIGHUP ended the command."""
        return self in (ExitCode.SIGINT, ExitCode.SIGTERM, ExitCode.SIGHUP)


@contextmanager
def quiet_broken_pipe():
    """Around a command that prints: when the reader of its stdout goes away (`| head`), end
    with BROKEN_PIPE and no traceback. What is left to print has no reader; stdout is pointed
    at /dev/null so the interpreter's own flush at exit does not fail a second time."""
    try:
        try:
            yield
        finally:  # what is still buffered goes now, while a broken pipe can still be caught
            sys.stdout.flush()
    except BrokenPipeError:
        pass
    except SystemExit as e:
        # rich's console exits 1 on a broken pipe (Console.on_broken_pipe): the same event
        if not isinstance(e.__context__, BrokenPipeError):
            raise
    else:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(ExitCode.BROKEN_PIPE)
