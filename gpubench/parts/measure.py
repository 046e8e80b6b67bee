"""Timed windows: warm-up excluded, the device synchronized only at the window edges.

A window runs `fetch()` (host side: blocking on the next batch is *data wait*) then `work(batch)`
(transfer + train step, launched asynchronously on a GPU; returns the batch's image count)
step after step. Per-step times come from CUDA events recorded on the stream after each step,
read only after the closing sync, so no step ever waits for the device; on a CPU every op is
synchronous and the host clock is exact. The arithmetic lives in gpubench/stats.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from gpubench.core.stats import MIN_AFTER_FIRST, WindowStats, percentile, settled, stats_from

__all__ = ["Clock", "WindowStats", "percentile", "run_window", "stats_from", "warm_up"]


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU). `now` is the host
    clock (seconds): window edges, data wait and the time caps read it, and CPU marks too."""

    def __init__(self, device: str, now: Callable[[], float] = time.perf_counter):
        self.cuda = device == "cuda"
        self.now = now

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()  # queued on the current stream: costs no sync
            return ev
        return self.now()

    def deltas(self, marks: list) -> list[float]:
        """Seconds between consecutive marks; call only after sync()."""
        if self.cuda:
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:], strict=False)]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def warm_up(fetch, work, clock: Clock, min_steps: int, max_steps: int | None,
            max_s: float, on_step: Callable[[], None] | None = None
            ) -> tuple[list[float], float, bool | None]:
    """Run steps until they are steady: at least `min_steps`; with `max_steps` above it, on
    until `stats.settled` (bounded by max_steps and max_s); otherwise exactly `min_steps` (a
    pinned warm-up, or a re-warm between windows that drains what the loader buffered).
    `on_step`: called after each step's closing sync (the runner reads the loss there: the
    device is idle, so it waits for nothing). Returns (step times, seconds, settled: None when
    not judged)."""
    perf = clock.now
    # max_steps == min_steps pins a fixed warm-up: nothing to judge
    judge = max_steps is not None and max_steps > min_steps
    limit = max(min_steps, max_steps or 0)
    # at least MIN_AFTER_FIRST steps after the first, whatever the time cap (compile, graphs)
    floor = min(limit, max(min_steps, MIN_AFTER_FIRST + 1)) if judge else min_steps
    times: list[float] = []
    done = False
    t0 = perf()
    n = 0
    while n < limit:
        # Edge sync per warm-up step: warm-up is not measured, and reading each step's time
        # is what tells when steps have become steady (a sync here costs nothing we report).
        clock.sync()
        a = clock.mark()
        work(fetch())
        b = clock.mark()
        clock.sync()
        times.extend(clock.deltas([a, b]))
        if on_step:
            on_step()
        n += 1
        if n < floor:
            continue
        if judge and settled(times):
            done = True
            break
        if not judge and n >= min_steps:
            break
        if perf() - t0 > max_s:
            break
    return times, perf() - t0, (done if judge else None)


def run_window(
    phase: str,
    fetch: Callable[[], object],
    work: Callable[[object], int],
    batch_size: int,
    device: str,
    warmup_steps: int,
    steps: int,
    warmup_max_s: float,
    max_s: float,
    warmup_max_steps: int | None = None,
    on_open: Callable[[], None] | None = None,
    on_close: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    on_warm_step: Callable[[], None] | None = None,
) -> WindowStats:
    """Warm up (see `warm_up`), then one measured window of up to `steps` steps. `clock` is the
    host clock in seconds (tests pass one they advance themselves)."""
    marker = Clock(device, clock)
    perf = clock
    warm_times, warm_s, warm_ok = warm_up(fetch, work, marker, warmup_steps, warmup_max_steps,
                                          warmup_max_s, on_warm_step)

    # --- the measured window
    # Edge sync: all warm-up work is done on the device before the window opens.
    marker.sync()
    if on_open:
        on_open()
    wait = 0.0
    images = 0
    truncated = False
    t0 = perf()
    marks = [marker.mark()]
    # a mark when each step's work is handed to the device: on CUDA it executes when the
    # stream reaches it, so start(i) - end(i-1) is the device waiting for the host (idle), and
    # end(i) - start(i) the device time of work(i) (in the loader phase: copy, decode, augment)
    starts = []
    for i in range(steps):
        a = perf()
        batch = fetch()
        wait += perf() - a  # host blocked on the data side
        starts.append(marker.mark())
        images += work(batch)  # images in this batch, known on the host (no sync)
        marks.append(marker.mark())
        if perf() - t0 > max_s and i + 1 < steps:
            truncated = True
            break
    # Edge sync: the window closes when the device has finished every step it was given.
    marker.sync()
    window_s = perf() - t0
    if on_close:
        on_close()
    stats = stats_from(phase, batch_size, images, marker.deltas(marks), window_s, wait,
                       warm_times, warm_s, truncated, warm_ok)
    n = len(starts)
    stats.device_idle_s = sum(max(0.0, d) for d in (
        marker.deltas([marks[i], starts[i]])[0] for i in range(n)))
    stats.device_work_s = sum(max(0.0, marker.deltas([starts[i], marks[i + 1]])[0])
                              for i in range(n))
    return stats
