"""The command line's error layer: every error that ends `gpubench` is one line on stderr.

Hydra reports a failure over several lines (a trimmed traceback, or a composition report plus a
hint about HYDRA_FULL_ERROR) and exits 1; argparse prints its usage line before its reason. While
Hydra composes the config and between jobs, stderr is held back; a job's own output goes straight
through. When the command fails, the held report is dropped and one line is printed instead,
built from the exception Hydra caught (unwrapped from InstantiationException to its cause) or
from argparse's reason. With HYDRA_FULL_ERROR=1 nothing is held back and tracebacks show.

Ctrl-C and SIGTERM (what schedulers, `timeout` and Kubernetes send) end the command the same way:
the runner marks the run `killed` and keeps its phases, and one line is printed (exit 130/143).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

# exit codes: bad input (what argparse uses too), a failure while running, and 128 + signal
BAD_INPUT, FAILED = 2, 1
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM


_KINDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "bool": "true or false"}


def one_line(report: str) -> str:
    """Condense Hydra's multi-line composition error (or argparse's output) into one line."""
    m = re.search(r"Could not find '([^']+)/([^']+)'", report)
    if m:
        group, value = m.groups()
        opts = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", report)
        allowed = ", ".join(o.strip() for o in opts.group(1).splitlines()) if opts else "?"
        return f"{group}={value} is not allowed: one of {allowed}"
    m = re.search(r"^\S+: error: (.+)$", report, re.MULTILINE)  # argparse: "prog: error: why"
    if m and report.lstrip().startswith("usage:"):
        return f"{m.group(1)} (see gpubench --help)"
    key = re.search(r"full_key: (\S+)", report)
    lines = [
        ln.strip()
        for ln in report.splitlines()
        if ln.strip()
        and not ln.startswith((" ", "\t"))
        and not ln.startswith(("Set the environment", "Config search path", "Error merging"))
    ]
    msg = lines[0] if lines else report.strip()
    m = re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", report)
    if m and key:
        return f"{key.group(1)}={m.group(1)} is not allowed: one of {m.group(2)}"
    m = (re.search(r"Value '([^']*)' of type '[^']*' could not be converted to (\w+)", report)
         or re.search(r"Value '([^']*)' is not a valid (bool)", report))
    if m and key:
        kind = _KINDS.get(m.group(2), m.group(2))
        return f"{key.group(1)}={m.group(1)} is not allowed: {kind}"
    return f"{key.group(1)}: {msg}" if key else msg


def root_cause(ex: BaseException) -> BaseException:
    """The error under Hydra's wrappers: instantiating the sweeper or a callback wraps whatever
    its constructor raised in an InstantiationException whose text is 'Error in call to target'."""
    from hydra.errors import InstantiationException

    seen = set()
    while isinstance(ex, InstantiationException) and ex.__cause__ is not None and id(ex) not in seen:
        seen.add(id(ex))
        ex = ex.__cause__
    return ex


def _flat(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe(ex: BaseException) -> tuple[str, int]:
    """One line and an exit code for the exception that ended the command."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gpubench.config.errors import ConfigError
    from gpubench.core.files import WriteError

    ex = root_cause(ex)
    if isinstance(ex, ConfigError):
        return str(ex), BAD_INPUT
    if isinstance(ex, (HydraException, OmegaConfBaseException)):
        # the report Hydra would print: its message, and for a bad override OmegaConf's cause
        report = str(ex)
        if isinstance(ex.__cause__, OmegaConfBaseException):
            report += "\n" + str(ex.__cause__)
        return _flat(one_line(report)), BAD_INPUT
    if isinstance(ex, WriteError):  # already one line: the path, the reason, the free space
        return str(ex), FAILED
    if isinstance(ex, OSError):
        # the path is the useful part: "[Errno 30] Read-only file system: '/x'" reads backwards
        where = f"{ex.filename}: " if ex.filename and str(ex.filename) not in str(ex.strerror) else ""
        return f"{where}{_flat(ex.strerror or str(ex))} ({type(ex).__name__})", FAILED
    if isinstance(ex, ValueError) and str(ex).strip():
        # a setting refused by the sweeper or a library (a search space, a sampler): its own
        # message names it. Other types (TypeError, KeyError...) keep their name: a failure.
        return _flat(str(ex)), BAD_INPUT
    return f"{type(ex).__name__}: {_flat(str(ex))}", FAILED


class Exit(SystemExit):
    """A deliberate exit status chosen by the task (oom, failed, not tracked): passed through."""


class _Gate:
    """sys.stderr for the whole command: holds what is written while closed, passes it straight
    through while open. One object throughout, so a logging handler or library that kept a
    reference to sys.stderr never writes into a buffer nobody reads. Not an io class: those
    define fileno/isatty/encoding themselves, and a job must see the real stream's (torch's
    faulthandler, rich's terminal detection)."""

    def __init__(self, real) -> None:
        self.real, self.open, self._held = real, False, []

    def write(self, text: str) -> int:
        if self.open:
            return self.real.write(text)
        self._held.append(text)
        return len(text)

    def flush(self) -> None:
        if self.open:
            self.real.flush()

    def held(self) -> str:
        return "".join(self._held)

    def release(self, keep: str | None = None) -> None:
        """Open the gate; write what was held (or `keep` instead of it)."""
        text, self._held = self.held(), []
        self.real.write(text if keep is None else keep)
        self.real.flush()
        self.open = True

    def __getattr__(self, name):  # fileno, isatty, encoding...: the real stream's
        return getattr(self.real, name)


class _Stderr:
    """The gate while a command runs (None outside one, e.g. under tests calling main())."""

    gate: _Gate | None = None

    def hold(self) -> None:
        if self.gate is not None:
            self.gate.open = False

    def release(self, keep: str | None = None) -> None:
        if self.gate is not None:
            self.gate.release(keep)

    def held(self) -> str:
        return self.gate.held() if self.gate is not None else ""


_stderr = _Stderr()


def release_stderr() -> None:
    """Called when a job starts: its output (warnings, progress) goes straight to the terminal."""
    _stderr.release()


def hold_stderr() -> None:
    """Called when a job ends: what Hydra writes next (a failure report) is held back again."""
    _stderr.hold()


def _before_report(text: str, ex: BaseException | None) -> str:
    """What was held before Hydra's failure report started (warnings from between the jobs)."""
    marks = ["Traceback (most recent call last):", "Set the environment variable HYDRA_FULL_ERROR",
             "Error executing job", "usage: "]
    if ex is not None and str(ex).strip():
        marks.append(str(ex).strip().splitlines()[0])
    cut = min((i for i in (text.find(m) for m in marks) if i >= 0), default=len(text))
    return text[:cut]


_main_pid: int | None = None


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


def _ignore_signal(signum, frame) -> None:
    # a Python-level no-op rather than SIG_DFL: a SIGCHLD already pending when the handler
    # changes still finds a Python handler to call
    return


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as a KeyboardInterrupt: every path that handles
    Ctrl-C (the runner marks the run killed and keeps its phases) handles it too."""


def install_sigterm() -> None:
    # Python runs signal handlers in the main thread only, which is where the runner waits, so
    # the exception lands where Ctrl-C's would.
    global _main_pid
    _main_pid = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)


def _interrupted_line(e: KeyboardInterrupt) -> tuple[str, int]:
    from gpubench.core import record

    name, code = ("SIGTERM", EXIT_SIGTERM) if isinstance(e, Terminated) else ("Ctrl-C", EXIT_SIGINT)
    run_dir = getattr(e, "run_dir", None)  # set by the entry when a run was under way
    rec = record.load(run_dir) if run_dir else None
    kept = ""
    if rec is not None:
        kept = (f"; status {rec.status.value}, {len(rec.phases)} measured phase(s) kept in "
                f"{Path(run_dir) / record.RESULTS_FILE}")
    return f"gpubench: interrupted by {name}{kept}", code


@contextmanager
def one_line_errors():
    """Around the whole command: one line for any error (see the module docstring)."""
    install_sigterm()
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    real = sys.stderr
    _stderr.gate = sys.stderr = _Gate(real)
    try:
        yield
    except Exit:
        raise
    except KeyboardInterrupt as e:
        _stderr.release()
        line, code = _interrupted_line(e)
        print(line, file=real)
        raise SystemExit(code) from None
    except SystemExit as e:
        from gpubench.config.errors import ConfigError

        if e.code in (0, None):
            raise
        if isinstance(e.code, ConfigError):  # bad input carried out of a Hydra callback
            cause: BaseException | None = e.code
        elif e.__suppress_context__:
            # `raise SystemExit(...) from None`: whoever exited has said why already
            raise
        else:
            # Hydra's run_and_report calls sys.exit(1) inside its `except`, so the exception
            # it caught is the SystemExit's __context__; argparse exits after printing
            cause = e.__context__
            if isinstance(cause, (SystemExit, KeyboardInterrupt, argparse.ArgumentError)):
                cause = None
        held = _stderr.held()
        if cause is None and not held.strip():
            raise
        if cause is not None:
            line, code = describe(cause)
        else:
            line, code = one_line(held), BAD_INPUT
        _stderr.release(keep=_before_report(held, cause))
        print(f"gpubench: error: {line}", file=real)
        raise SystemExit(code) from None
    finally:
        _stderr.release()
        sys.stderr = real
        _stderr.gate = None
