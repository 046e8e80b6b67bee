"""Every error that ends `gpubench` is one line on stderr. Hydra runs with HYDRA_FULL_ERROR=1, so
it raises what it caught (run_and_report) for gpubench.cli.messages to word; set by the user,
tracebacks show."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from hydra._internal.utils import get_args_parser

from gpubench.cli.messages import describe
from gpubench.cli.signals import install_sigterm, interrupted_line
from gpubench.config.errors import ConfigError
from gpubench.core.secrets import say

FULL_ERROR = "HYDRA_FULL_ERROR"


class Exit(SystemExit):
    """An exit status the task chose (oom, failed, not tracked): passed through."""


class JobFailed(BaseException):
    """A run's exception (its __cause__) carried past Hydra's run_job, which prints "Error
    executing job" for an Exception."""


def _refuse(message: str):
    raise ValueError(message)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command's arguments by Hydra's parser; an unknown flag raises ArgumentError."""
    parser = get_args_parser()

    def error(message: str):
        if message.startswith("unrecognized arguments"):
            # argparse takes positionals in one run: a flag between overrides ends it
            intermixed = get_args_parser()
            intermixed.error = _refuse  # type: ignore[method-assign]
            with contextlib.suppress(ValueError):
                intermixed.parse_intermixed_args(argv)
                message += ("; the flags (-m, -cd DIR, ...) go before or after all the "
                            "overrides, not between them")
        raise argparse.ArgumentError(None, message)

    parser.error = error  # type: ignore[method-assign]
    return parser.parse_args(argv)


@contextlib.contextmanager
def one_line_errors():
    install_sigterm()
    if os.environ.get(FULL_ERROR) == "1":
        try:
            yield
        except SystemExit as e:
            if isinstance(e.code, ConfigError):  # a callback's bad input: its traceback, as asked
                raise e.code from None
            raise
        return
    given = argparse.Namespace(overrides=[], multirun=False)
    before, os.environ[FULL_ERROR] = os.environ.get(FULL_ERROR), "1"
    try:
        given = arguments()
        yield
    except KeyboardInterrupt as e:
        line, code = interrupted_line(e)
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone: keep 129
            print(line, file=sys.stderr)
        raise SystemExit(code) from None
    except (Exception, JobFailed, SystemExit) as e:
        if isinstance(e, SystemExit) and not isinstance(e.code, ConfigError):
            raise  # an exit code, or Python's, passed through
        # a SystemExit: bad input carried out of a Hydra callback (config.prechecks.InputCheck)
        ex = e.code if isinstance(e, SystemExit) else e.__cause__ if isinstance(e, JobFailed) else e
        if isinstance(ex, BrokenPipeError):
            # the reader of stdout went away: quiet_broken_pipe ends it, no line
            raise ex from None
        line, code = describe(ex, given.overrides, given.multirun)
        say(line, "error")
        raise SystemExit(code) from None
    finally:
        os.environ.pop(FULL_ERROR)
        if before is not None:
            os.environ[FULL_ERROR] = before
