"""Arithmetic on measured times: percentiles, one window's figures, windows pooled into a phase
with an interval, when warm-up has settled. Pure functions (no torch), tested on constructed
timings.

Why windows, and why an order-statistic interval (docs/guide.md, "Intervals"): steps are not
independent (a DataLoader delivers in bursts, a disturbance lasts many steps), so windows of
several steps, interleaved across phases, are the units. With 4-10 windows neither a t-interval
(one disturbed window drags the mean) nor a bootstrap (needs dozens of values) is trustworthy;
the order-statistic interval for the median is distribution-free: [x_(k), x_(n+1-k)] covers it
with probability 1 - 2 P(Binomial(n, 1/2) < k). The narrowest with coverage >= 95% is taken,
its exact coverage reported; below 6 windows none reaches 95%: [min, max] with its coverage.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from math import comb

CONFIDENCE = 0.95
# the one tolerance of the judgements over throughputs: how far below the fastest a
# recommended setup may be, and by how much a loader must clear compute to count as unblocking
# it (runs of one config differ by several percent; e2e loses a little more to the hand-over)
TOLERANCE = 0.05


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: list[float]) -> float:
    """The one median of gpubench (steps, windows, pooled runs, workers); NaN for no values."""
    return percentile(xs, 50)


def median_interval(xs: list[float], confidence: float = CONFIDENCE
                    ) -> tuple[float, float, float] | None:
    """(low, high, coverage): the narrowest order-statistic interval for the median whose
    coverage is >= `confidence`, or [min, max] with its coverage when none reaches it. None with
    fewer than 2 values (one window says nothing about spread)."""
    vals = sorted(x for x in xs if x is not None and math.isfinite(x))
    n = len(vals)
    if n < 2:
        return None

    def cover(k: int) -> float:  # 1 - 2 P(Binomial(n, 1/2) < k)
        return 1 - 2 * sum(comb(n, i) for i in range(k)) / 2**n

    # the largest k still covering `confidence` (cover falls as k grows); none: [min, max]
    k = max((k for k in range(2, n // 2 + 1) if cover(k) >= confidence), default=1)
    return vals[k - 1], vals[n - k], cover(k)


def holding(ci, value: float) -> tuple[float, float]:
    """An interval (lo, hi, ...) widened where needed to hold its figure; (value, value) with
    none. The figure beside an interval is not always the statistic the interval is for (a
    phase's throughput is its images over its seconds, the interval is for its windows'
    median), and a printed "x [lo-hi]" with x outside [lo, hi] would be read as an error."""
    if ci is None:
        return value, value
    return min(float(ci[0]), value), max(float(ci[1]), value)


def figure(v: float, spec: str = "") -> str:
    """A figure in `spec`, else without decimals from 100 up and with one below (812, 41.5)."""
    return format(v, spec or (".0f" if abs(v) >= 100 else ".1f"))


@dataclass(frozen=True)
class Est:
    """A measured figure with its interval (lo <= value <= hi; lo == hi: no spread measured):
    the one estimate of gpubench, with its one ratio (`over`) and rendering (`812 [790-840]`)."""

    value: float
    lo: float
    hi: float

    @classmethod
    def of(cls, x, ci=None) -> Est | None:
        """Widened to hold the figure; None when `x` measured nothing; an interval whose ends
        are not both measured is none."""
        if isinstance(x, Est):
            return x
        if not positive(x):
            return None
        ci = ci if ci and positive(ci[0]) and positive(ci[1]) else None
        return cls(float(x), *holding(ci, float(x)))

    @classmethod
    def median_of(cls, values: list[float]) -> Est:  # exact with fewer than two values
        m = median(values)
        return cls(m, *holding(median_interval(values), m))

    @classmethod
    def pooled(cls, ests: list[Est]) -> Est:
        """Repeats of one measurement: the median of their figures and of each interval end."""
        return cls(median([e.value for e in ests]), median([e.lo for e in ests]),
                   median([e.hi for e in ests]))

    @classmethod
    def envelope(cls, ests: list[Est]) -> Est:
        """Several measurements of one bound: the median figure inside the widest interval (a
        bound read from any of them must not look tighter than each one says)."""
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
    """(mean, std/mean) of step times; NaN where there are none (or the mean is not > 0)."""
    if not xs:
        return math.nan, math.nan
    mean = statistics.fmean(xs)
    # by hand, not statistics.pstdev: that one computes in exact fractions (slow at every
    # window's close) and raises on a NaN or inf step time, which must read NaN here
    std = math.sqrt(statistics.fmean((t - mean) ** 2 for t in xs))
    return mean, std / mean if mean > 0 else math.nan


@dataclass
class WindowStats:
    """One timed window of one phase."""

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
    # under torchrun: each rank's own images/sec (images_per_sec is then the run's, summed)
    ranks_images_per_sec: list[float] | None = None
    # from marks around each step's work: time the device waited for the host between steps,
    # and the device time of the work itself (on CUDA: events; on a CPU: the host clock)
    device_idle_s: float | None = None
    device_work_s: float | None = None
    # host time the steps' work spent blocked before its device work could be queued (nvJPEG
    # decode: torchvision synchronizes its own stream, parts/measure.py DeviceStart); None when
    # no step's work has such a part
    host_blocked_s: float | None = None

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items()
                if k not in ("step_times_s", "warmup_step_times_s")}


def stats_from(phase: str, batch_size: int, images: int, step_times: list[float], window_s: float,
               wait_s: float, warmup_times: list[float], warmup_s: float, truncated: bool,
               warmup_settled: bool | None = None) -> WindowStats:
    """Throughput is images over the whole window between the two edge syncs, not the mean of
    per-step rates, so gaps between steps count against it as they do in training."""
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


# ---------------------------------------------------------------- warm-up

# warm-up has settled when the mean step time of the last SETTLE_K steps is within
# SETTLE_TOLERANCE of the mean of the SETTLE_K before them. Means over several steps, not single
# steps: a DataLoader delivers in bursts, so single loader steps never look alike.
SETTLE_K = 4
SETTLE_TOLERANCE = 0.15
# steps after the first that warm-up always runs, whatever its time cap: the first step holds
# lazy init, cudnn autotuning and torch.compile; CUDA-graph recording (compile=reduce-overhead)
# and autotuned kernels' first real runs come in the next ones
MIN_AFTER_FIRST = 2


def settled(times: list[float], k: int = SETTLE_K, tol: float = SETTLE_TOLERANCE) -> bool:
    """Whether warm-up step times (the first excluded) have reached a steady level."""
    body = times[1:]
    if len(body) < 2 * k:
        return False
    a, b = statistics.fmean(body[-k:]), statistics.fmean(body[-2 * k:-k])
    return b > 0 and abs(a - b) <= tol * b


def steady_step_s(times: list[float], k: int = SETTLE_K) -> float | None:
    """The step time warm-up ended at: the mean of its last `k` steps, the first (compile,
    autotune, lazy init) left out; None with no step after the first."""
    body = times[1:][-k:]
    return statistics.fmean(body) if body else None


def window_steps(steps: int, min_s: float, step_s: float | None, cap_s: float) -> int:
    """The steps of a window whose length is fixed before it opens (under torchrun every rank
    runs the same count: none may stop on its own clock): `steps`, or as many more as last
    `min_s` at `step_s` seconds a step, but no more than fit in the window's cap `cap_s`."""
    if min_s <= 0 or step_s is None or not math.isfinite(step_s) or step_s <= 0:
        return steps
    need = math.ceil(min_s / step_s)
    if math.isfinite(cap_s):
        need = min(need, math.floor(cap_s / step_s))
    return max(steps, need)


# ---------------------------------------------------------------- windows pooled into a phase


# each window's own figures a phase keeps (PhaseRecord.windows)
WINDOW_KEYS = ("images", "seconds", "images_per_sec", "steps", "step_time_cv", "truncated",
               "data_wait_fraction", "ranks_images_per_sec")


def _share(parts: list, total: float) -> float | None:
    """sum(parts) / total; None when a part is unknown or there is no total."""
    return sum(parts) / total if total > 0 and None not in parts else None


def pool(windows: list[WindowStats]) -> dict:
    """A phase's figures from its windows: the median window throughput and its interval;
    step-time percentiles over all measured steps; data wait over all windows' time."""
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


# ---------------------------------------------------------------- figures rounded to their interval


def supported_place(value: float, ci) -> int | None:
    """The decimal place (10**place) of the last digit of `value` that its interval `ci`
    supports; None without an interval. The last digit kept is the first one the interval
    leaves uncertain: +-5% keeps 3 significant figures (812.3 [771.7-852.9] -> 812 [772-853]),
    +-0.5% keeps 4, +-50% keeps 2; never fewer than 1. Every figure logged beside its interval
    (MLflow's metrics and names, the run's description) is rounded by this one rule."""
    if ci is None or len(ci) < 2 or not all(finite(x) for x in (value, ci[0], ci[1])):
        return None
    half = abs(float(ci[1]) - float(ci[0])) / 2
    if value == 0 or half == 0:
        return None
    digits = max(1, 1 - math.floor(math.log10(half / abs(value))))
    return math.floor(math.log10(abs(value))) - digits + 1


def round_at(x: float, place: int | None) -> float:  # unchanged for no place
    if place is None or not finite(x):
        return x
    return float(round(x, -place))


def text_at(x: float, place: int | None, default: str = ".1f") -> str:
    """`x` written to 10**place, without an exponent: '812', '1250', '0.0123'; with no place,
    in the `default` format."""
    if place is None:
        return format(x, default)
    return f"{round_at(x, place):.{max(0, -place)}f}"


def finite_number(v) -> float | None:
    """`v` as a float when it is a finite int or float (a bool is no figure), else None: the one
    test of "was this measured" that every reader of a record applies."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def finite(x) -> bool:
    return finite_number(x) is not None


def positive(x) -> bool:
    """A measured figure: finite and above zero (not None, NaN or a bool)."""
    return finite(x) and x > 0
