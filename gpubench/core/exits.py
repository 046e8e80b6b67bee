"""The exit statuses of gpubench's commands: one table, so a script that checks `$?` and the
code that sets it read the same numbers."""

from __future__ import annotations

import signal
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
    # 128 + the signal, as a shell reports a process that a signal ended
    SIGINT = 128 + signal.SIGINT
    SIGTERM = 128 + signal.SIGTERM

    @property
    def interrupted(self) -> bool:
        """Ctrl-C or SIGTERM ended the command."""
        return self in (ExitCode.SIGINT, ExitCode.SIGTERM)
