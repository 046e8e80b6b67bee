"""Timed windows: warm-up excluded, the device synchronized only at the window edges.

A window runs `fetch()` (host side: blocking on the next batch is *data wait*) then `work(batch)`
(transfer + train step, launched asynchronously on a GPU; returns the batch's image count)
step after step. Per-step times come
from CUDA events recorded on the stream after each step, read only after the closing sync, so
no step ever waits for the device; on a CPU every op is synchronous and the host clock is exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()  # queued on the current stream: costs no sync
            return ev
        return time.perf_counter()

    def deltas(self, marks: list) -> list[float]:
        """Seconds between consecutive marks; call only after sync()."""
        if self.cuda:
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:], strict=False)]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class WindowStats:
    phase: str
    batch_size: int
    steps: int
    images: int
    seconds: float
    images_per_sec: float
    data_wait_s: float
    data_wait_fraction: float
    step_time_p50_s: float
    step_time_p95_s: float
    step_time_mean_s: float
    step_time_cv: float  # std/mean: how steady the steps are
    warmup_steps: int
    warmup_seconds: float
    first_step_s: float  # includes lazy init / cudnn autotune / torch.compile
    truncated: bool  # the time cap closed the window before `steps`
    step_times_s: list[float] = field(default_factory=list)
    warmup_step_times_s: list[float] = field(default_factory=list)
    # under torchrun: each rank's own images/sec (images_per_sec is then the run's, summed)
    ranks_images_per_sec: list[float] | None = None

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("step_times_s")
        d.pop("warmup_step_times_s")
        return d


def stats_from(
    phase: str,
    batch_size: int,
    images: int,
    step_times: list[float],
    window_s: float,
    wait_s: float,
    warmup_times: list[float],
    warmup_s: float,
    truncated: bool,
) -> WindowStats:
    """Pure arithmetic on measured times (kept apart so it is testable on constructed input).
    Throughput is images over the whole window between the two edge syncs, not the mean of
    per-step rates, so gaps between steps count against it as they do in training."""
    n = len(step_times)
    mean = sum(step_times) / n if n else math.nan
    var = sum((t - mean) ** 2 for t in step_times) / n if n else math.nan
    return WindowStats(
        phase=phase,
        batch_size=batch_size,
        steps=n,
        images=images,
        seconds=window_s,
        images_per_sec=(images / window_s) if window_s > 0 else math.nan,
        data_wait_s=wait_s,
        data_wait_fraction=(wait_s / window_s) if window_s > 0 else math.nan,
        step_time_p50_s=percentile(step_times, 50),
        step_time_p95_s=percentile(step_times, 95),
        step_time_mean_s=mean,
        step_time_cv=(math.sqrt(var) / mean) if n and mean > 0 else math.nan,
        warmup_steps=len(warmup_times),
        warmup_seconds=warmup_s,
        first_step_s=(warmup_times or step_times or [math.nan])[0],
        truncated=truncated,
        step_times_s=step_times,
        warmup_step_times_s=warmup_times,
    )


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
    on_open: Callable[[], None] | None = None,
    on_close: Callable[[], None] | None = None,
) -> WindowStats:
    clock = Clock(device)
    perf = time.perf_counter

    # --- warm-up: excluded from the figures, but timed so the warm-up curve can be shown
    # Edge sync: whatever ran before (another phase, model build) is finished before we start.
    clock.sync()
    t_w = perf()
    marks = [clock.mark()]
    for _ in range(warmup_steps):
        work(fetch())
        marks.append(clock.mark())
        if perf() - t_w > warmup_max_s:
            break
    # Edge sync: all warm-up work is done on the device before the window opens.
    clock.sync()
    warmup_s = perf() - t_w
    warmup_times = clock.deltas(marks)

    # --- the measured window
    if on_open:
        on_open()
    wait = 0.0
    images = 0
    truncated = False
    t0 = perf()
    marks = [clock.mark()]
    for i in range(steps):
        a = perf()
        batch = fetch()
        wait += perf() - a  # host blocked on the data side
        images += work(batch)  # images in this batch, known on the host (no sync)
        marks.append(clock.mark())
        if perf() - t0 > max_s and i + 1 < steps:
            truncated = True
            break
    # Edge sync: the window closes when the device has finished every step it was given.
    clock.sync()
    window_s = perf() - t0
    if on_close:
        on_close()
    return stats_from(
        phase, batch_size, images, clock.deltas(marks), window_s, wait, warmup_times, warmup_s, truncated
    )
