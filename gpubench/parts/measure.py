"""Timed windows of `fetch()` (host blocked: *data wait*) then `work(batch)` (asynchronous on a
GPU; returns the image count): warm-up excluded, the device synchronized only at the edges, step
times from CUDA events read after the closing sync (on a CPU, the host clock). Under torchrun
every rank runs as many steps, warm-up included (a rank a step ahead would wait in a barrier
while another is in DDP's all-reduce)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from gpubench.core.stats import (
    MIN_AFTER_FIRST,
    WindowStats,
    settled,
    stats_from,
    steady_step_s,
    window_steps,
)

if TYPE_CHECKING:
    from gpubench.parts.distributed import Dist


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock `now` (CPU)."""

    def __init__(self, device: str, now: Callable[[], float] = time.perf_counter):
        self.cuda, self.now = device == "cuda", now

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self):
        if not self.cuda:
            return self.now()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()  # queued on the current stream: costs no sync
        return ev

    def between(self, a, b) -> float:  # seconds from mark a to mark b, after sync() only
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a


class DeviceStart:
    """Called by the work when a part that blocks the host returns (torchvision's CUDA
    `decode_jpeg` syncs its pool stream at both ends, decode_jpegs_cuda.cpp): the step's device
    start, the time before it host-blocked. A no-op outside a window."""

    def __init__(self) -> None:
        self._clock: Clock | None = None
        self.at = 0.0  # host clock at the step's device start
        self.mark = None  # the step's device start mark
        self.moved = False  # the work reported a host-blocking part in this window

    def arm(self, clock: Clock) -> None:
        self._clock, self.moved = clock, False

    def disarm(self) -> None:
        self._clock = None

    def begin(self) -> float:  # by the window, right before a step's work
        self.at, self.mark = self._clock.now(), self._clock.mark()
        return self.at

    def __call__(self) -> None:  # by the work, when its host-blocking part has returned
        if self._clock is not None:
            self.begin()
            self.moved = True


def warm_up(fetch, work, clock: Clock, min_steps: int, max_steps: int | None,
            max_s: float, on_step: Callable[[], None] | None = None,
            agree: Callable[[bool], bool] = bool) -> tuple[list[float], float, bool | None]:
    """At least `min_steps`; with `max_steps` above it, on until `stats.settled` (within max_steps
    and max_s), as the ranks `agree`. (step times, seconds, steady here: None if not judged)."""
    perf = clock.now
    judge = max_steps is not None and max_steps > min_steps  # else a pinned warm-up
    limit = max(min_steps, max_steps or 0)
    # from the config alone, the same on every rank: MIN_AFTER_FIRST steps after the first
    floor = min(limit, max(min_steps, MIN_AFTER_FIRST + 1)) if judge else min_steps
    times: list[float] = []
    mine = ok = False  # this rank's judgement: done, and done because steady
    t0 = perf()
    for n in range(1, limit + 1):
        # Edge sync per warm-up step: unmeasured, and each step's time tells when they are steady
        clock.sync()
        a = clock.mark()
        work(fetch())
        b = clock.mark()
        clock.sync()
        times.append(clock.between(a, b))
        if on_step:
            on_step()
        if n < floor:
            continue
        if not mine:
            ok = judge and settled(times)
            mine = ok or not judge or perf() - t0 > max_s
        if agree(mine):
            break
    return times, perf() - t0, (ok if judge else None)


def run_window(phase: str, fetch: Callable[[], object], work: Callable[[object], int],
               batch_size: int, device: str, warmup_steps: int, steps: int,
               warmup_max_s: float, max_s: float, warmup_max_steps: int | None = None,
               on_open: Callable[[], None] | None = None,
               on_close: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.perf_counter,
               on_warm_step: Callable[[], None] | None = None, min_s: float = 0.0,
               ranks: Dist | None = None, step_s: float | None = None,
               device_start: DeviceStart | None = None) -> WindowStats:
    """Warm up, then a window of `steps` steps, on until it has lasted `min_s` (NVML averages over
    up to 1 s), closed early at `max_s`. Under torchrun (`ranks`) its length is fixed before it
    opens (steps for `min_s` at `step_s` or warm-up's step time; the ranks' most), uncapped:
    deciding inside would cost a device sync per step under NCCL (Dist._reduce)."""
    marker = Clock(device, clock)
    warm_times, warm_s, warm_ok = warm_up(fetch, work, marker, warmup_steps, warmup_max_steps,
                                          warmup_max_s, on_warm_step,
                                          ranks.all_done if ranks is not None else bool)
    if ranks is not None:
        est = step_s if step_s is not None else steady_step_s(warm_times)
        steps = ranks.most(window_steps(steps, min_s, est, max_s))
        min_s, max_s = 0.0, math.inf
    # Edge sync: all warm-up work is done on the device before the window opens.
    marker.sync()
    if on_open:
        on_open()
    start = device_start if device_start is not None else DeviceStart()
    start.arm(marker)
    wait = blocked = 0.0
    images, truncated = 0, False
    t0 = clock()
    marks = [marker.mark()]
    # a mark when each step's work is handed to the device: start(i) - end(i-1) is the device
    # idle waiting for the host, end(i) - start(i) the device time of work(i)
    starts = []
    try:
        while True:
            a = clock()
            batch = fetch()
            wait += clock() - a  # host blocked on the data side
            h = start.begin()
            images += work(batch)  # images in this batch, known on the host (no sync)
            blocked += start.at - h  # host blocked inside the work (0 unless it said so)
            starts.append(start.mark)
            marks.append(marker.mark())
            n, elapsed = len(starts), clock() - t0
            # a lower bound of the window's length: the closing sync only adds to it
            if n >= steps and elapsed >= min_s:
                break
            if elapsed > max_s:
                truncated = n < steps
                break
    finally:
        start.disarm()
    # Edge sync: the window closes when the device has finished every step it was given.
    marker.sync()
    window_s = clock() - t0
    if on_close:
        on_close()
    step_times = [marker.between(a, b) for a, b in zip(marks, marks[1:], strict=False)]
    stats = stats_from(phase, batch_size, images, step_times, window_s, wait, warm_times, warm_s,
                       truncated, warm_ok)
    stats.device_idle_s = sum(max(0.0, marker.between(m, s))
                              for m, s in zip(marks, starts, strict=False))
    stats.device_work_s = sum(max(0.0, marker.between(s, m))
                              for s, m in zip(starts, marks[1:], strict=True))
    stats.host_blocked_s = blocked if start.moved else None
    return stats
