"""The command line's error layer: every error that ends `gpubench` is one line on stderr.

Hydra reports a failure over several lines (a trimmed traceback, or a composition report plus a
hint about HYDRA_FULL_ERROR) and exits 1; argparse prints its usage line before its reason. While
Hydra composes the config and between jobs, stderr is held back (gpubench.cli.gate); a job's own
output goes straight through. When the command fails, the held report is dropped and one line is
printed instead, built from the exception Hydra caught (gpubench.cli.messages) or from argparse's
reason. With HYDRA_FULL_ERROR=1 nothing is held back and tracebacks show. Ctrl-C and SIGTERM end
the command with one line too (gpubench.cli.signals).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager

from gpubench.cli.gate import Gate, before_report, stderr
from gpubench.cli.messages import describe, held_line
from gpubench.cli.signals import install_sigterm, interrupted_line
from gpubench.config.errors import ConfigError
from gpubench.core.exits import ExitCode


class Exit(SystemExit):
    """A deliberate exit status chosen by the task (oom, failed, not tracked): passed through."""

    def __init__(self, code: ExitCode) -> None:
        super().__init__(code)


def _cause(e: SystemExit) -> BaseException | None:
    """The exception a SystemExit reports: bad input carried out of a Hydra callback is its code
    (a ConfigError); Hydra's run_and_report calls sys.exit(1) inside its `except`, so the
    exception it caught is the SystemExit's __context__; argparse exits after printing (no
    exception to read)."""
    if isinstance(e.code, ConfigError):
        return e.code
    cause = e.__context__
    if isinstance(cause, (SystemExit, KeyboardInterrupt, argparse.ArgumentError)):
        return None
    return cause


@contextmanager
def one_line_errors():
    """Around the whole command: one line for any error (see the module docstring)."""
    install_sigterm()
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    real = sys.stderr
    stderr.gate = sys.stderr = Gate(real)
    try:
        yield
    except Exit:
        raise
    except KeyboardInterrupt as e:
        stderr.release()
        line, code = interrupted_line(e)
        print(line, file=real)
        raise SystemExit(code) from None
    except SystemExit as e:
        if e.code in (ExitCode.OK, None):
            raise
        if e.__suppress_context__ and not isinstance(e.code, ConfigError):
            # `raise SystemExit(...) from None`: whoever exited has said why already
            raise
        cause, held = _cause(e), stderr.held()
        if isinstance(cause, BrokenPipeError):
            # the reader of stdout went away (`| head`): no line, no report; the entry's
            # quiet_broken_pipe ends the command with BROKEN_PIPE
            stderr.release(keep=before_report(held, cause))
            raise cause from None
        if cause is None and not held.strip():
            raise
        if cause is not None:
            line, code = describe(cause)
        else:
            line, code = held_line(held), ExitCode.BAD_INPUT
        stderr.release(keep=before_report(held, cause))
        print(f"gpubench: error: {line}", file=real)
        raise SystemExit(code) from None
    finally:
        stderr.release()
        sys.stderr = real
        stderr.gate = None
