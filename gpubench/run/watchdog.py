"""A run whose step never returns (a dead mount, an endless kernel) still ends with its record
final: after no sign of life (a window starting, a fetch or step entered or left) for
`hang_limit_s` the record is written `failed`, the threads' stacks logged, the loader's workers
killed and the process exits 1, the only sure end with the main thread stuck in C code. This
thread runs while that code lets the GIL go (torch.cuda.synchronize does: Module.cpp
THCPModule_cudaSynchronize; so does a DataLoader's timed queue read). Unwatched, having no bound:
building the pipeline and model (not the first batch), a compiled phase's train steps,
profiling, what follows the last window."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

from gpubench.core.exits import ExitCode

log = logging.getLogger("gpubench")

HANG_MIN_S = 60.0  # a worker's start, a device's first step (cuDNN's autotuning) stay under it
POLL_S = 1.0

# what a call is doing, and how the time after it is named
FETCH = ("fetching its batch (the DataLoader: the dataset's __getitem__, its transform, the "
         "collate)", "fetching its batch")
MOVE = ("moving its batch to the device",) * 2
STEP = ("in its train step (the model's forward and backward, the optimizer)", "its train step")


def hang_limit_s(warmup_max_seconds: float, max_seconds: float) -> float:
    # twice a phase's whole budget: no step of a run within it comes near
    return max(HANG_MIN_S, 2.0 * (warmup_max_seconds + max_seconds))


class Watchdog:
    """Watches one run (`at`, `phase`, `watching`). `on_hang(line)` writes the record and returns
    the line to print, `on_end()` ends what would outlive the process; `poll_s=None`: no thread."""

    def __init__(self, limit_s: float, on_hang: Callable[[str], str | None],
                 on_end: Callable[[], object] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], object] = os._exit, poll_s: float | None = POLL_S) -> None:
        self.limit_s, self.on_hang, self.on_end = limit_s, on_hang, on_end
        self.clock, self.exit, self.poll_s = clock, exit, poll_s
        # (where, step, doing, since): replaced whole, so the thread reads one consistent state;
        # where None: not watching; doing None: inside a call that is not watched
        self._state: tuple[str | None, int, str | None, float] = (None, 0, None, 0.0)
        self._fired = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def at(self, where: str | None) -> None:  # a phase's window, a part of the build; None: off
        self._state = (where, 0, "stuck before its first step", self.clock())

    def _set(self, step: int, doing: str | None) -> None:
        self._state = (self._state[0], step, doing, self.clock())

    def wrapped(self, fn: Callable, doing: tuple[str, str], watched: bool = True,
                counts: bool = False) -> Callable:
        """`fn`, its calls signs of life: `doing[0]` until it returns (if `watched`), then after
        `doing[1]`. `counts`: each call is the next step."""
        during, after = (f"stuck {doing[0]}" if watched else None), f"stuck after {doing[1]}"

        def call(*args):
            step = self._state[1] + counts
            self._set(step, during)
            try:
                return fn(*args)
            finally:
                self._set(step, after)
        return call

    def phase(self, name: str, fetch: Callable, work: Callable, compiled: bool
              ) -> tuple[Callable, Callable]:
        """A phase's (fetch, work); a compiled train step is unwatched (compiles are unbounded)."""
        return (self.wrapped(fetch, FETCH, counts=True),
                self.wrapped(work, MOVE if name == "loader" else STEP,
                             watched=not (compiled and name != "loader")))

    @contextlib.contextmanager
    def watching(self, where: str, doing: str) -> Iterator[None]:
        """A region watched as one step (`doing` at `where`), not watched after it."""
        self.at(where)
        self._set(0, f"stuck {doing}")
        try:
            yield
        finally:
            self.at(None)

    def check(self) -> str | None:  # the line saying the run is hung; None while it is not
        where, step, doing, since = self._state
        waited = self.clock() - since
        if where is None or doing is None or waited <= self.limit_s:
            return None
        at = f"{where}, step {step}" if step else where
        return (f"{at}: {doing} for {waited:.0f} s (the hang limit: {self.limit_s:.0f} s, "
                f"2 x (bench.warmup_max_seconds + bench.max_seconds), at least {HANG_MIN_S:.0f})")

    def start(self) -> None:
        if self.poll_s is not None and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpubench-watchdog",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self.at(None)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        """Ends the process when the run is hung (see the module docstring); once."""
        line = self.check()
        if line is None or not self._fired.acquire(blocking=False):
            return
        try:  # the record first: nothing measured is lost
            line = self.on_hang(line) or line
        except Exception as e:
            line = f"{line} (its record not written: {type(e).__name__}: {e})"
        logs = [h for h in logging.getLogger().handlers + log.handlers  # the run's log file
                if isinstance(h, logging.FileHandler) and h.stream is not None
                and h.baseFilename != os.devnull]
        if logs:
            line += f"; the threads' stacks are in {logs[0].baseFilename}"
        log.error("hung: %s", line)
        for h in logs:
            h.flush()
        # faulthandler writes to the fd, past Python's buffers (a stream lacking one raises)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            faulthandler.dump_traceback(file=logs[0].stream if logs else sys.stderr,
                                        all_threads=True)
        try:
            self.on_end()
        except Exception as e:
            log.error("hung: not everything ended: %s: %s", type(e).__name__, e)
        print(f"gpubench: error: hung: {line}", file=sys.stderr, flush=True)
        self.exit(ExitCode.FAILED)
