"""Fault injection (the `fault.*` keys): the failures a real run meets (an OOM above a batch size,
a runtime error after some windows, stalls), on demand, for tests and the docs' reliability
table. Under torchrun `fault.rank` limits them to one rank."""

from __future__ import annotations

import itertools
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
        """The train step raises an OOM above this batch size (None: never)."""
        return self.fault.oom_above_batch if self.here else None

    def maybe_fail(self, windows: int) -> None:
        """A runtime error once `fault.fail_after_windows` windows are done (0: while building)."""
        f = self.fault
        if f.fail_message and self.here and windows == f.fail_after_windows:
            raise RuntimeError(f.fail_message)

    def staller(self) -> Callable[[], None]:
        """Called before each step: every `fault.stall_every`-th call sleeps `fault.stall_s`."""
        every = self.fault.stall_every if self.here else None
        calls = itertools.count(1)

        def stall() -> None:
            if every and next(calls) % every == 0:
                self.sleep(self.fault.stall_s)

        return stall
