"""Which pipe is narrowest, and what to turn next. Pure functions of measured figures.

The rule compares three throughputs (reference article 003's method): the loader phase is the
most the data side can deliver, the compute phase the most the device can, and e2e what the
training loop gets. GPU utilization never decides the verdict: with AMP a GPU at the same
utilization does ~1.7x the work (article 003), so utilization is context, not evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpubench.analysis.labels import ABOVE_OWN_BOUND, Case, Step
from gpubench.analysis.noise import more_windows
from gpubench.analysis.workers import workers
from gpubench.config.schema import is_amp
from gpubench.core.pipe import serial_rate
from gpubench.core.record import PHASE_NAMES, Bottleneck, Reason, window_plan
from gpubench.core.stats import TOLERANCE, Est, positive

# e2e "tracks" a bound when it reaches this fraction of it
TRACKS = 0.85
# the loader is "well below" compute when it delivers less than this fraction of it
WELL_BELOW = 0.9
# with single windows (no interval), e2e this far above its bound is a broken measurement
ABOVE_BOUND = 0.10


def smaller(a: Est, b: Est) -> Est:
    return Est(min(a.value, b.value), min(a.lo, b.lo), min(a.hi, b.hi))


def combined_bound(compute: Est, device_data_s_per_image: Est | None) -> Est:
    """On a GPU the loader's device-side work (H2D copy, nvJPEG decode, GPU augment) runs on
    the training stream in e2e, one after the other with the step: e2e can reach at most
    gpubench.core.pipe.serial_rate of compute and the device data time per image, not compute
    itself."""
    if device_data_s_per_image is None:
        return compute
    d = device_data_s_per_image
    return Est(serial_rate(compute.value, d.value), serial_rate(compute.lo, d.hi),
               serial_rate(compute.hi, d.lo))


@dataclass
class Verdict:
    bottleneck: Bottleneck
    # why, as data: the case the rule decided and the figures it rests on (Est, shares, names);
    # `reason` turns them into the sentence a reader sees (analysis.labels.Case)
    case: Case
    figures: dict = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    # the ratio the verdict rests on (e2e / bound, or loader / compute) and its interval
    ratio: Est | None = None
    # how far that ratio's interval stays clear of the rule's threshold (share; > 0 conclusive)
    margin: float | None = None
    # what the rule leaned to when it could not decide
    leaning: Bottleneck | None = None
    # the share of the narrower bound e2e loses to imperfect overlap (1 - e2e/bound, at least
    # 0), with its interval; None when e2e or a bound was not measured
    overlap_loss: Est | None = None
    # the ratio a question left open by wide intervals rests on, and the line it straddles:
    # what `windows_to_decide` needs
    open_ratio: Est | None = None
    open_line: float | None = None

    @property
    def reason(self) -> str:
        return self.case.value.format(**self.figures, tracks=TRACKS, well_below=WELL_BELOW,
                                      loses=1 - TRACKS)

    @property
    def impossible(self) -> str | None:
        """What the figures show cannot be in a steady run (e2e above its own bound): a sign
        the measurement was disturbed, which the run records as a noise reason (run.summary)."""
        if self.case is not Case.above_bound:
            return None
        return ABOVE_OWN_BOUND.format(**self.figures)


def _paired(windows: dict | None, names: tuple[str, ...]) -> dict[str, list[float]] | None:
    """The phases' per-window throughputs, round by round (cut to the rounds all of them
    finished), or None when there are fewer than two rounds or a window measured nothing."""
    if not windows or any(not windows.get(n) for n in names):
        return None
    k = min(len(windows[n]) for n in names)
    out = {n: list(windows[n][:k]) for n in names}
    if k < 2 or not all(positive(x) for n in names for x in out[n]):
        return None
    return out


def _data_or_compute(figures: dict, data: Case, compute: Case) -> Verdict:
    """Data- or compute-bound from the loader's share of compute (`figures["supply"]`), with the
    case each names; an interval across WELL_BELOW is inconclusive."""
    s = figures["supply"]
    if s.hi < WELL_BELOW:
        return Verdict(Bottleneck.data, data, figures, ratio=s, margin=WELL_BELOW - s.hi)
    if s.lo >= WELL_BELOW:
        return Verdict(Bottleneck.compute, compute, figures, ratio=s, margin=s.lo - WELL_BELOW)
    lean = Bottleneck.data if s.value < WELL_BELOW else Bottleneck.compute
    return Verdict(Bottleneck.inconclusive, Case.supply_open, figures, ratio=s, leaning=lean,
                   open_ratio=s, open_line=WELL_BELOW)


@dataclass(frozen=True)
class Pipes:
    """The three measured pipes and the bounds e2e is judged against."""

    loader: Est
    compute: Est
    e2e: Est
    # what compute allows e2e: compute itself, or compute plus the device's data work
    compute_bound: Est
    # the narrower of the loader and compute_bound: the most e2e can reach
    bound: Est

    @classmethod
    def of(cls, loader: Est, compute: Est, e2e: Est, device_data: Est | None) -> Pipes:
        compute_bound = combined_bound(compute, device_data)
        return cls(loader, compute, e2e, compute_bound, smaller(loader, compute_bound))

    def figures(self, r: Ratios) -> dict:
        """What the sentences of the three-pipe cases quote (analysis.labels.Case)."""
        name = "compute" if self.compute_bound is self.compute else "compute + device data work"
        narrower = "the loader" if self.loader.value <= self.compute_bound.value else name
        return dict(loader=self.loader, compute=self.compute_bound, compute_name=name,
                    e2e=self.e2e, bound=self.bound, narrower=narrower, tracking=r.tracking,
                    supply=r.supply, of_compute=r.of_compute, loss=overlap_loss(r.tracking))


@dataclass(frozen=True)
class Ratios:
    """The ratios the rule rests on, with their intervals."""

    tracking: Est  # e2e over the narrower bound: does e2e reach what the pipes allow?
    supply: Est  # the loader over compute's bound: which pipe is narrower?
    of_compute: Est  # e2e over compute's bound (the compute-bound reason quotes it)

    @classmethod
    def of(cls, p: Pipes, device_data: Est | None, windows: dict | None) -> Ratios:
        """From the pipes' intervals, or pairwise from the windows of interleaved rounds when
        there are at least two."""
        paired = _paired(windows, PHASE_NAMES)
        if paired is None:
            return cls(p.e2e.over(p.bound), p.loader.over(p.compute_bound),
                       p.e2e.over(p.compute_bound))
        bounds = [combined_bound(Est.of(c), device_data).value for c in paired["compute"]]
        rounds = list(zip(paired["loader"], bounds, paired["e2e"], strict=True))
        return cls(Est.median_of([e / min(x, b) for x, b, e in rounds]),
                   Est.median_of([x / b for x, b, _ in rounds]),
                   Est.median_of([e / b for _, b, e in rounds]))


def _above_bound(tracking: Est) -> bool:
    """e2e above what the pipes allow: its interval wholly above 1 + TOLERANCE, or a single
    window more than ABOVE_BOUND above it.

    Not above 1 alone: each bound is a phase measured on its own, and e2e may beat it by a
    few percent without anything being disturbed (in the loader phase the main process waits
    for each batch's copy to the device, which in e2e overlaps the step). On an H100 e2e
    read 103% [100%-125%] of the loader phase and, at batch 256, 100.03% [100.0%-100.1%] of
    compute: intervals that narrow put any such offset wholly above 1 (docs/gpu.md)."""
    if tracking.exact:
        return tracking.value > 1.0 + ABOVE_BOUND
    return tracking.lo > 1.0 + TOLERANCE


def _three_pipes(p: Pipes, r: Ratios) -> Verdict:
    """The rule with all three phases: e2e against the narrower bound first (above it: a
    disturbed run; well below it: no overlap), then which bound it tracks."""
    t, f = r.tracking, p.figures(r)
    if _above_bound(t):
        return Verdict(Bottleneck.inconclusive, Case.above_bound, f, ratio=t)
    if t.hi < TRACKS:
        return Verdict(Bottleneck.overlap, Case.overlap, f, ratio=t, margin=TRACKS - t.hi,
                       overlap_loss=f["loss"])
    if t.lo < TRACKS:
        return _straddles_tracking(f)
    v = _data_or_compute(f, Case.data_tracks, Case.compute_tracks)
    v.overlap_loss = f["loss"]
    if v.bottleneck is Bottleneck.compute:
        v.ratio, v.margin = t, min(v.margin, t.lo - TRACKS)
    elif v.bottleneck is Bottleneck.data:
        v.margin = min(v.margin, t.lo - TRACKS)
    return v


def _straddles_tracking(f: dict) -> Verdict:
    """e2e's interval straddles the line between tracking a bound and poor overlap. Two
    questions were folded into one here, and each gets what its own interval decides: which
    pipe is narrowest (the loader against compute's bound) and how much e2e loses to imperfect
    overlap (1 - e2e/bound: its interval, which may reach 0). Only when the first is open too
    is the run inconclusive, with what it leans to."""
    t = f["tracking"]
    pipe = _data_or_compute(f, Case.data_open_overlap, Case.compute_open_overlap)
    if pipe.bottleneck in (Bottleneck.data, Bottleneck.compute):
        pipe.overlap_loss, pipe.open_ratio, pipe.open_line = f["loss"], t, TRACKS
        return pipe
    lean = Bottleneck.overlap if t.value < TRACKS else pipe.leaning
    return Verdict(Bottleneck.inconclusive, Case.both_open, f, ratio=t, leaning=lean,
                   overlap_loss=f["loss"], open_ratio=f["supply"], open_line=WELL_BELOW)


def overlap_loss(tracking: Est) -> Est:
    """The share of the narrower bound e2e loses: 1 - e2e/bound, never below 0 (e2e at or
    above its bound loses nothing)."""
    return Est(max(0.0, 1.0 - tracking.value), max(0.0, 1.0 - tracking.hi),
               max(0.0, 1.0 - tracking.lo))


def windows_to_decide(ratio: Est, line: float, repeats: int, most: int = 100) -> int | None:
    """How many windows would put `ratio`'s interval wholly on one side of `line`, from the
    spread measured: an interval of the median narrows about as 1/sqrt(windows), so its side
    that reaches across the line must shrink to the figure's distance from the line. None when
    the figure sits on the line (no number of windows would tell) or more than `most` would
    be needed."""
    reach = ratio.value - ratio.lo if line < ratio.value else ratio.hi - ratio.value
    gap = abs(ratio.value - line)
    if reach <= 0 or gap <= 0.005 * line:
        return None
    need = math.ceil(repeats * (reach / gap) ** 2 * 1.2)  # 20% spare: the estimate is rough
    need = max(need, repeats + 1)
    return need if need <= most else None


def _loader_and_compute(loader: Est, compute: Est, windows: dict | None) -> Verdict:
    """Without e2e: which of the two bounds is narrower."""
    paired = _paired(windows, ("loader", "compute"))
    supply = loader.over(compute)
    if paired:
        supply = Est.median_of([x / c for x, c in zip(*paired.values(), strict=True)])
    f = dict(loader=loader, compute=compute, supply=supply)
    return _data_or_compute(f, Case.data_no_e2e, Case.compute_no_e2e)


def classify(loader, compute, e2e, data_wait_fraction: float | None = None,
             intervals: dict | None = None, device_data_s_per_image=None,
             windows: dict | None = None) -> Verdict:
    """The narrowest pipe, judged on intervals. `loader`, `compute`, `e2e` are images/sec (or
    `Est`); `intervals` maps the same names to [lo, hi]; `windows` to the per-window figures
    of interleaved rounds, from which the ratios are taken pairwise. A verdict is given only
    when the interval of the ratio it rests on lies wholly on one side of the rule's
    threshold; otherwise it is `inconclusive`, with what it leaned to."""
    iv = intervals or {}
    loader_ips = Est.of(loader, iv.get("loader"))
    compute_ips = Est.of(compute, iv.get("compute"))
    e2e_ips = Est.of(e2e, iv.get("e2e"))
    if loader_ips and compute_ips and e2e_ips:
        device_data = Est.of(device_data_s_per_image, iv.get("device_data"))
        pipes = Pipes.of(loader_ips, compute_ips, e2e_ips, device_data)
        return _three_pipes(pipes, Ratios.of(pipes, device_data, windows))
    if loader_ips and compute_ips:
        return _loader_and_compute(loader_ips, compute_ips, windows)
    if e2e_ips and data_wait_fraction is not None and not math.isnan(data_wait_fraction):
        # e2e alone: how much of the loop waits on data
        if data_wait_fraction > 0.25:
            return Verdict(Bottleneck.data, Case.waits_on_data, dict(wait=data_wait_fraction))
        return Verdict(Bottleneck.compute, Case.waits_little, dict(wait=data_wait_fraction))
    return Verdict(Bottleneck.unknown, Case.too_few_phases)


@dataclass
class Knobs:
    """The current settings the advice refers to."""

    device: str
    num_workers: int
    cpu_count: int
    pin_memory: bool
    preload: bool
    augment_on: str
    precision: str
    channels_last: bool
    compile: str
    batch_size: int
    dataset: str
    memory_fraction: float | None
    ceiling: float
    is_conv: bool = True


def next_steps(bottleneck: Bottleneck | str, k: Knobs) -> list[Step]:
    """The next steps for a verdict and the current settings, most effective first."""
    bottleneck = Bottleneck(bottleneck)
    gpu, starved = k.device == "cuda", bottleneck in (Bottleneck.data, Bottleneck.overlap)
    rules = [
        (Step.contention, bottleneck is Bottleneck.overlap and not gpu and k.num_workers > 0),
        (Step.workers_from_zero, starved and k.num_workers == 0),
        (Step.more_workers, bottleneck is Bottleneck.data and 0 < k.num_workers < k.cpu_count),
        (Step.pin_memory, starved and gpu and not k.pin_memory),
        (Step.preload, starved and k.dataset in ("imagefolder", "fake_jpeg", "cifar10")
         and not k.preload),
        (Step.augment_on_device, starved and gpu and k.augment_on == "cpu"),
        (Step.more_cpu, bottleneck is Bottleneck.data and k.num_workers >= k.cpu_count),
    ]
    if bottleneck is Bottleneck.compute:
        frac = k.memory_fraction
        rules += [
            (Step.amp if gpu else Step.amp_on_cpu,
             k.precision in ("torch_default", "fp32", "tf32")),
            (Step.channels_last, gpu and k.is_conv and not k.channels_last
             and is_amp(k.precision)),
            (Step.compile, gpu and k.compile == "off"),
            (Step.larger_batch, frac is not None and frac < 0.6 * k.ceiling),
            (Step.on_cpu, not gpu),
        ]
    rules.append((Step.all_phases, bottleneck is Bottleneck.unknown))
    return [step for step, applies in rules if applies][:3]


def advise(bottleneck: Bottleneck | str, k: Knobs) -> list[str]:
    """1-3 concrete next steps in words, filled from the settings."""
    n = k.num_workers
    figures = dict(vars(k), workers=workers(n), s="s" * (n == 1), double_batch=2 * k.batch_size,
                   more_workers=min(k.cpu_count, max(2 * n, n + 1)))
    return [step.value.format(**figures) for step in next_steps(bottleneck, k)]


def judge(loader, compute, e2e, data_wait_fraction: float | None, knobs: Knobs,
          intervals: dict | None = None, noise_reasons: list[Reason] | None = None,
          remedies: list[str] | None = None, device_data_s_per_image=None,
          windows: dict | None = None, repeats: int | None = None,
          steps: int | None = None) -> Verdict:
    """The verdict and its advice. A run whose measurement was disturbed (`noise_reasons`)
    gets no confident verdict, whatever its figures say: `inconclusive`, with the reasons and
    what to do about them (`remedies`), and what the figures leaned to. A question left open
    only by wide intervals gets the number of windows that would decide it (`repeats` windows
    of `steps` in all were measured)."""
    v = classify(loader, compute, e2e, data_wait_fraction, intervals, device_data_s_per_image,
                 windows)
    if noise_reasons and v.bottleneck is not Bottleneck.unknown:
        lean = v.leaning if v.bottleneck is Bottleneck.inconclusive else v.bottleneck
        # no open question: more windows do not decide a disturbed run, its remedies do
        v = Verdict(Bottleneck.inconclusive, Case.unstable_leaning if lean else Case.unstable,
                    dict(flaws="; ".join(r.text for r in noise_reasons), lean=lean),
                    ratio=v.ratio, leaning=lean, overlap_loss=v.overlap_loss)
    decide = _to_decide(v, repeats, steps)
    if v.bottleneck is Bottleneck.inconclusive:
        v.advice = [decide] if decide else (remedies or [])[:3] or [more_windows(steps, repeats)]
    else:
        v.advice = advise(v.bottleneck, knobs) + ([decide] if decide else [])
    return v


def _to_decide(v: Verdict, repeats: int | None, steps: int | None) -> str | None:
    """The command that would settle the question `v` leaves open, from the spread measured."""
    if v.open_ratio is None or not repeats or not steps:
        return None
    what = ("whether overlap costs more than "
            f"{1 - TRACKS:.0%}" if v.bottleneck is not Bottleneck.inconclusive else "the verdict")
    n = windows_to_decide(v.open_ratio, v.open_line, repeats)
    if n is None:
        return (f"{what}: the figure sits too near the {v.open_line:.0%} line for more windows "
                "to tell in reasonable time; the difference is too small to matter")
    per_window = window_plan(steps, repeats)[1]
    return (f"bench.repeats={n} bench.steps={n * per_window}: about {n} windows of "
            f"{per_window} steps would decide {what} (from the spread measured)")
