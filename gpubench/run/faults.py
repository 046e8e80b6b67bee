"""Fault injection (the `fault.*` keys): the failures a real run meets, on demand, so tests and
the docs' reliability table can show what a run does with them. An out-of-memory error above a
batch size (in the train step), a runtime error after some windows, and stalls of the kind
another process causes. Under torchrun `fault.rank` limits them to one rank."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpubench.config.settings import Fault
from gpubench.parts.distributed import fault_hits


class Faults:
    """The faults this rank injects."""

    def __init__(self, fault: Fault, rank: int) -> None:
        self.fault = fault
        self.here = fault_hits(fault.rank, rank)
        self.sleep = time.sleep  # how a stall passes: a test's stand-in moves its own clock

    @property
    def oom_above_batch(self) -> int | None:
        """The train step raises an out-of-memory error above this batch size (None: never)."""
        return self.fault.oom_above_batch if self.here else None

    def maybe_fail(self, windows: int) -> None:
        """A runtime error once `fault.fail_after_windows` windows are done (0: while building)."""
        f = self.fault
        if f.fail_message and self.here and windows == f.fail_after_windows:
            raise RuntimeError(f.fail_message)

    def staller(self) -> Callable[[], None]:
        """A function to call before each step: every `fault.stall_every`-th call sleeps
        `fault.stall_s` (an interruption of the kind another process causes)."""
        every = self.fault.stall_every if self.here else None
        seconds = self.fault.stall_s
        calls = 0

        def stall() -> None:
            nonlocal calls
            calls += 1
            if every and calls % every == 0:
                self.sleep(seconds)

        return stall
