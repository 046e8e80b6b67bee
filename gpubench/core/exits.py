"""The exit statuses of gpubench's commands: one table for the code that sets `$?` and the
scripts that check it."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a run's oom or failed status, a report with nothing to report, failed uploads
    BAD_INPUT = 2  # a config key, an override, a command-line argument (argparse's too)
    NOT_TRACKED = 3  # measured and kept, but not in MLflow (`python -m gpubench.tracking sync`)
    PEER_FAILED = 4  # a torchrun rank ended because another failed (waiting in a collective)
    OVER_CEILING = 5  # measured fine, peak memory above memory.ceiling (a finished trial)
    # 128 + the signal, as a shell reports a process a signal ended
    SIGINT = 128 + signal.SIGINT
    SIGTERM = 128 + signal.SIGTERM
    SIGHUP = 128 + signal.SIGHUP  # the terminal went away (a dropped ssh session)
    # stdout's reader went away (`| head`): Python ignores SIGPIPE, raises BrokenPipeError
    BROKEN_PIPE = 128 + signal.SIGPIPE


@dataclass(frozen=True)
class Refusal:
    """A job refused as bad input: its `hydra.overrides.task` and the line it printed."""
    overrides: tuple[str, ...]
    line: str


# the multirun's jobs refused as bad input in this process (a grid's job prints its line and
# returns, so one bad job does not end the sweep): search.jobs, the report's `refused:` lines
REJECTED: list[Refusal] = []


@contextmanager
def quiet_broken_pipe():
    """Around a command that prints: when its stdout's reader goes away (`| head`), end with
    BROKEN_PIPE and no traceback; stdout then points at /dev/null, so the interpreter's flush at
    exit does not fail again."""
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
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(ExitCode.BROKEN_PIPE)
