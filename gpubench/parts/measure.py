"""Timed windows: warm-up excluded, the device synchronized only at the window edges.

A window runs `fetch()` (host side: blocking on the next batch is *data wait*) then `work(batch)`
(transfer + train step, launched asynchronously on a GPU; returns the batch's image count)
step after step. Per-step times come from CUDA events recorded after each step, read only after
the closing sync, so no step ever waits for the device; on a CPU every op is synchronous and the
host clock is exact. The arithmetic lives in gpubench/core/stats.py.

Under torchrun every rank must run the same number of steps, warm-up included: a rank one step
ahead would sit in the window's barrier while another is in DDP's all-reduce, and NCCL would
hang until its watchdog. So warm-up ends when all ranks say done (`Dist.all_done`, where the
device is synchronized anyway), and a window's length is fixed before it opens (`Dist.most`).
"""

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

    def between(self, a, b) -> float:
        """Seconds from mark a to mark b; call only after sync()."""
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a

    def deltas(self, marks: list) -> list[float]:
        return [self.between(a, b) for a, b in zip(marks, marks[1:], strict=False)]


class DeviceStart:
    """Where a step's device work begins when its work blocks the host first. torchvision's
    CUDA `decode_jpeg` synchronizes its own pool stream before and after the decode
    (torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp, CUDAJpegDecoder::decode_images:
    `cudaStreamSynchronize(stream)` at both ends): the host is blocked for the whole decode and
    none of it queues on the training stream. So the work calls this object when such a part
    returns: the window takes the step's device start from there, and counts the host time
    before it as host-blocked. Outside a window (warm-up, profiling) a call does nothing."""

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
    """Run steps until they are steady: at least `min_steps`; with `max_steps` above it, on
    until `stats.settled` (bounded by max_steps and max_s); otherwise exactly `min_steps`.
    `on_step`: called after each step's closing sync (the device is idle: reading the loss
    waits for nothing). `agree`: the ranks' common decision from this rank's "done", asked after
    every step from the floor on; a rank's own "done" holds once said. Returns (step times,
    seconds, whether this rank found the steps steady: None when not judged)."""
    perf = clock.now
    judge = max_steps is not None and max_steps > min_steps  # else a pinned warm-up
    limit = max(min_steps, max_steps or 0)
    # at least MIN_AFTER_FIRST steps after the first, whatever the time cap (compile, graphs);
    # floor and limit come from the config alone, so they are the same on every rank
    floor = min(limit, max(min_steps, MIN_AFTER_FIRST + 1)) if judge else min_steps
    times: list[float] = []
    mine = ok = False  # this rank's judgement: done, and done because steady
    t0 = perf()
    for n in range(1, limit + 1):
        # Edge sync per warm-up step: warm-up is not measured, and reading each step's time
        # is what tells when steps have become steady (a sync here costs nothing we report).
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
    """Warm up (see `warm_up`), then one measured window of `steps` steps, run on until it has
    lasted `min_s` (NVML's readings average over up to 1 s), closed early by the time cap
    `max_s`. `clock` is the host clock in seconds (tests pass one they advance themselves).

    Under torchrun (`ranks`) the window's length is fixed before it opens: `steps`, or more to
    last `min_s` at `step_s` seconds a step (else the step time warm-up ended at), the largest
    count of any rank, with no time cap inside: deciding inside the window would cost a device
    sync per step under NCCL (Dist._reduce). `device_start`: what the work calls after a
    host-blocking part."""
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
    images = 0
    truncated = False
    t0 = clock()
    marks = [marker.mark()]
    # a mark when each step's work is handed to the device: on CUDA it executes when the
    # stream reaches it, so start(i) - end(i-1) is the device waiting for the host (idle), and
    # end(i) - start(i) the device time of work(i)
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
            # the host clock is a lower bound of the window's length: the closing sync can
            # only add to it, so a window closed here has lasted at least min_s
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
    stats = stats_from(phase, batch_size, images, marker.deltas(marks), window_s, wait,
                       warm_times, warm_s, truncated, warm_ok)
    stats.device_idle_s = sum(max(0.0, marker.between(m, s))
                              for m, s in zip(marks, starts, strict=False))
    stats.device_work_s = sum(max(0.0, marker.between(s, m))
                              for s, m in zip(starts, marks[1:], strict=True))
    stats.host_blocked_s = blocked if start.moved else None
    return stats
