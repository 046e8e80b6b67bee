"""The stderr gate: while Hydra composes the config and between a sweep's jobs, what is written
to stderr is held back (Hydra's multi-line failure report among it); a job's own output goes
straight through. When the command fails, gpubench.cli.errors drops the held report and prints
one line instead."""

from __future__ import annotations


class Gate:
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


class Stderr:
    """The gate while a command runs (None outside one, e.g. under tests calling main())."""

    gate: Gate | None = None

    def hold(self) -> None:
        if self.gate is not None:
            self.gate.open = False

    def release(self, keep: str | None = None) -> None:
        if self.gate is not None:
            self.gate.release(keep)

    def held(self) -> str:
        return self.gate.held() if self.gate is not None else ""


stderr = Stderr()


def release_stderr() -> None:
    """Called when a job starts: its output (warnings, progress) goes straight to the terminal."""
    stderr.release()


def hold_stderr() -> None:
    """Called when a job ends: what Hydra writes next (a failure report) is held back again."""
    stderr.hold()


# where Hydra's (or argparse's) failure report starts in what was held
_REPORT_STARTS = ("Traceback (most recent call last):",
                  "Set the environment variable HYDRA_FULL_ERROR", "Error executing job", "usage: ")


def before_report(text: str, ex: BaseException | None) -> str:
    """What was held before the failure report started (warnings from between the jobs)."""
    marks = list(_REPORT_STARTS)
    if ex is not None and str(ex).strip():
        marks.append(str(ex).strip().splitlines()[0])
    cut = min((i for i in (text.find(m) for m in marks) if i >= 0), default=len(text))
    return text[:cut]
