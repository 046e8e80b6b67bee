"""Arithmetic on measured times (no torch). Windows of steps are the units (steps come in
bursts); with 4-10 of them the median's distribution-free interval is the one to trust
(docs/guide.md, "Intervals")."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from math import comb

CONFIDENCE = 0.95
# how far below the fastest a recommended setup may be, and by how much a loader must clear
# compute to unblock it (runs of one config differ by several percent; e2e loses a little more)
TOLERANCE = 0.05
# CPU time moves in clock ticks: a CPU share is read over at least 20 (a tick is then 5% of
# the span, the figure within 5 points of a core)
TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
MIN_CPU_SPAN_S = 20 * TICK_S
# the sampler's figures that are such shares (telemetry.monitor.Sample)
CPU_SHARES = frozenset({"host_cpu", "procs_cpu", "main_cpu", "workers_cpu"})
# warm-up has settled when the mean of the last SETTLE_K step times is within SETTLE_TOLERANCE
# of the SETTLE_K before them (means: a DataLoader's bursts keep single steps unalike)
SETTLE_K = 4
SETTLE_TOLERANCE = 0.15
# steps after the first that warm-up always runs, whatever its cap: the first holds lazy init,
# cudnn autotuning and torch.compile; CUDA-graph recording and autotuned kernels come next
MIN_AFTER_FIRST = 2
# each window's own figures a phase keeps (PhaseRecord.windows)
WINDOW_KEYS = ("images", "seconds", "images_per_sec", "steps", "step_time_cv", "truncated",
               "data_wait_fraction", "ranks_images_per_sec")


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: list[float]) -> float:
    """The one median of gpubench; NaN for no values."""
    return percentile(xs, 50)


def median_interval(xs: list[float]) -> tuple[float, float, float] | None:
    """(low, high, coverage): the narrowest [x_(k), x_(n+1-k)] covering the median with
    probability >= CONFIDENCE, else [min, max] (below 6 values); None with fewer than 2."""
    vals = sorted(x for x in xs if x is not None and math.isfinite(x))
    n = len(vals)
    if n < 2:
        return None

    def cover(k: int) -> float:  # 1 - 2 P(Binomial(n, 1/2) < k)
        return 1 - 2 * sum(comb(n, i) for i in range(k)) / 2**n

    # the largest k still covering CONFIDENCE (cover falls as k grows); none: [min, max]
    k = max((k for k in range(2, n // 2 + 1) if cover(k) >= CONFIDENCE), default=1)
    return vals[k - 1], vals[n - k], cover(k)


def holding(ci, value: float) -> tuple[float, float]:
    """An interval (lo, hi, ...) widened to hold its figure ((value, value) without one): "x
    [lo-hi]" with x outside reads wrong."""
    if ci is None:
        return value, value
    return min(float(ci[0]), value), max(float(ci[1]), value)


def figure(v: float, spec: str = "") -> str:
    """In `spec`, else without decimals from 100 up and with one below (812, 41.5)."""
    return format(v, spec or (".0f" if abs(v) >= 100 else ".1f"))


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 run`, `3 runs` (`plural` where it is not the noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


@dataclass(frozen=True)
class Est:
    """A measured figure in its interval (lo == hi: no spread), as `812 [790-840]`."""

    value: float
    lo: float
    hi: float

    @classmethod
    def of(cls, x, ci=None) -> Est | None:
        """None when `x` measured nothing; an interval with an unmeasured end is none."""
        if isinstance(x, Est):
            return x
        if not positive(x):
            return None
        ci = ci if ci and positive(ci[0]) and positive(ci[1]) else None
        return cls(float(x), *holding(ci, float(x)))

    @classmethod
    def median_of(cls, values: list[float]) -> Est:
        m = median(values)
        return cls(m, *holding(median_interval(values), m))

    @classmethod
    def pooled(cls, ests: list[Est]) -> Est:
        """Repeats of one measurement: the median of their figures and of each interval end."""
        return cls(median([e.value for e in ests]), median([e.lo for e in ests]),
                   median([e.hi for e in ests]))

    @classmethod
    def envelope(cls, ests: list[Est]) -> Est:
        """Measurements of one bound: the median figure in the widest interval."""
        return cls(median([e.value for e in ests]), min(e.lo for e in ests),
                   max(e.hi for e in ests))

    @property
    def exact(self) -> bool:
        return self.lo == self.hi

    def over(self, other: Est) -> Est:  # the interval from the extremes (conservative)
        return Est(self.value / other.value, self.lo / other.hi, self.hi / other.lo)

    def __format__(self, spec: str) -> str:  # `x [lo-hi]`; `.0%`: `94% [91%-97%]`
        if self.exact:
            return figure(self.value, spec)
        return f"{figure(self.value, spec)} [{figure(self.lo, spec)}-{figure(self.hi, spec)}]"


def spread(xs: list[float]) -> tuple[float, float]:
    """(mean, std/mean); NaN where there are none (or the mean is not > 0)."""
    if not xs:
        return math.nan, math.nan
    mean = statistics.fmean(xs)
    # not statistics.pstdev: exact fractions (slow at every window's close), and it raises on
    # a NaN or inf, which must read NaN here
    std = math.sqrt(statistics.fmean((t - mean) ** 2 for t in xs))
    return mean, std / mean if mean > 0 else math.nan


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
    warmup_settled: bool | None = None
    step_times_s: list[float] = field(default_factory=list)
    warmup_step_times_s: list[float] = field(default_factory=list)
    ranks_images_per_sec: list[float] | None = None  # under torchrun
    # the device's wait for the host between steps, its time on the work (CUDA events or clock)
    device_idle_s: float | None = None
    device_work_s: float | None = None
    # host time blocked before the device work could be queued (nvJPEG decode: torchvision
    # syncs its own stream, parts/measure.py DeviceStart); None when no step has such a part
    host_blocked_s: float | None = None

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items()
                if k not in ("step_times_s", "warmup_step_times_s")}


def stats_from(phase: str, batch_size: int, images: int, step_times: list[float], window_s: float,
               wait_s: float, warmup_times: list[float], warmup_s: float, truncated: bool,
               warmup_settled: bool | None = None) -> WindowStats:
    """Throughput is images over the window between its edge syncs, not a mean of per-step
    rates: gaps between steps count against it as in training."""
    mean, cv = spread(step_times)
    return WindowStats(
        phase, batch_size, len(step_times), images, window_s,
        images_per_sec=(images / window_s) if window_s > 0 else math.nan,
        data_wait_s=wait_s, data_wait_fraction=(wait_s / window_s) if window_s > 0 else math.nan,
        step_time_p50_s=percentile(step_times, 50), step_time_p95_s=percentile(step_times, 95),
        step_time_mean_s=mean, step_time_cv=cv,
        warmup_steps=len(warmup_times), warmup_seconds=warmup_s,
        first_step_s=(warmup_times or step_times or [math.nan])[0], truncated=truncated,
        warmup_settled=warmup_settled, step_times_s=step_times, warmup_step_times_s=warmup_times)


def settled(times: list[float]) -> bool:
    """Whether warm-up step times (the first excluded) reached a steady level."""
    body, k = times[1:], SETTLE_K
    if len(body) < 2 * k:
        return False
    a, b = statistics.fmean(body[-k:]), statistics.fmean(body[-2 * k:-k])
    return b > 0 and abs(a - b) <= SETTLE_TOLERANCE * b


def steady_step_s(times: list[float]) -> float | None:
    """The mean of warm-up's last SETTLE_K step times, the first left out; None without more."""
    body = times[1:][-SETTLE_K:]
    return statistics.fmean(body) if body else None


def window_steps(steps: int, min_s: float, step_s: float | None, cap_s: float) -> int:
    """A window's steps, fixed before it opens (under torchrun no rank may stop on its own
    clock): `steps`, or more to last `min_s` at `step_s` a step, no more than fit in `cap_s`."""
    if min_s <= 0 or step_s is None or not math.isfinite(step_s) or step_s <= 0:
        return steps
    need = math.ceil(min_s / step_s)
    if math.isfinite(cap_s):
        need = min(need, math.floor(cap_s / step_s))
    return max(steps, need)


def _share(parts: list, total: float) -> float | None:
    return sum(parts) / total if total > 0 and None not in parts else None


def pool(windows: list[WindowStats]) -> dict:
    """A phase's figures: the windows' median throughput; step times over all their steps."""
    first = windows[0]
    ips = [w.images_per_sec for w in windows]
    steps = [t for w in windows for t in w.step_times_s]
    seconds = sum(w.seconds for w in windows)
    wait = sum(w.data_wait_s for w in windows)
    images = sum(w.images for w in windows)
    mean, cv = spread(steps)
    ci = median_interval(ips)
    ranks = None if first.ranks_images_per_sec is None else [
        median(list(r)) for r in zip(*(w.ranks_images_per_sec for w in windows), strict=True)]
    return {
        "phase": first.phase, "batch_size": first.batch_size, "steps": len(steps),
        "images": images, "seconds": seconds, "images_per_sec": median(ips),
        "images_per_sec_ci": None if ci is None else [ci[0], ci[1]],
        "images_per_sec_ci_coverage": None if ci is None else ci[2],
        "repeats": len(windows),
        "windows": [{k: getattr(w, k) for k in WINDOW_KEYS} for w in windows],
        "data_wait_s": wait, "data_wait_fraction": wait / seconds if seconds > 0 else math.nan,
        "step_time_p50_s": percentile(steps, 50), "step_time_p95_s": percentile(steps, 95),
        "step_time_mean_s": mean, "step_time_cv": cv,
        "warmup_steps": first.warmup_steps, "warmup_seconds": first.warmup_seconds,
        "warmup_settled": first.warmup_settled, "first_step_s": first.first_step_s,
        "truncated": any(w.truncated for w in windows), "ranks_images_per_sec": ranks,
        "device_idle_fraction": _share([w.device_idle_s for w in windows], seconds),
        "device_work_seconds_per_image": _share([w.device_work_s for w in windows], images),
        "host_blocked_seconds_per_image": _share([w.host_blocked_s for w in windows], images),
    }


def supported_place(value: float, ci) -> int | None:
    """The place (10**place) of `value`'s first digit `ci` leaves uncertain: +-5% keeps 3
    figures (812.3 [771.7-852.9] -> 812 [772-853]), +-0.5% 4, +-50% 2, never fewer than 1;
    None without an interval."""
    if ci is None or len(ci) < 2 or not all(finite(x) for x in (value, ci[0], ci[1])):
        return None
    half = abs(float(ci[1]) - float(ci[0])) / 2
    if value == 0 or half == 0:
        return None
    digits = max(1, 1 - math.floor(math.log10(half / abs(value))))
    return math.floor(math.log10(abs(value))) - digits + 1


def round_at(x: float, place: int | None) -> float:  # unchanged for no place
    return x if place is None or not finite(x) else float(round(x, -place))


def outward(ci, place: int | None) -> list[float]:
    """An interval's ends rounded away from its middle to 10**place, so it still holds the
    measured one (to nearest, 894-1329 read 900-1300)."""
    if place is None or not all(finite(x) for x in ci):
        return list(ci)
    q, digits = 10.0 ** place, max(0, -place)
    return [round(math.floor(ci[0] / q) * q, digits), round(math.ceil(ci[1] / q) * q, digits)]


def text_at(x: float, place: int | None) -> str:
    """`x` written to 10**place without an exponent ('812', '0.0123'), else to one decimal."""
    return f"{x:.1f}" if place is None else f"{round_at(x, place):.{max(0, -place)}f}"


def finite_number(v) -> float | None:
    """`v` as a float when a finite int or float (a bool is no figure), else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def finite(x) -> bool:
    return finite_number(x) is not None


def positive(x) -> bool:
    return finite(x) and x > 0
