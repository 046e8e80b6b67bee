"""Which pipe is narrowest, and what to turn next (reference article 003's method): the loader
phase is the most the data side can deliver, compute the most the device can, e2e what training
gets. GPU utilization never decides: with AMP the same utilization does ~1.7x the work."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field
from enum import Enum

from gpubench.analysis.labels import ABOVE_OWN_BOUND, Case, Step, rerun_text
from gpubench.analysis.noise import more_windows
from gpubench.analysis.workers import more_workers, workers
from gpubench.config.schema import PRELOAD_HELPS, is_amp
from gpubench.core.pipe import serial_bound
from gpubench.core.record import (
    PHASE_NAMES,
    Bottleneck,
    Flaw,
    Reason,
    RunRecord,
    bench_of,
    longer,
    window_plan,
    windows_of,
)
from gpubench.core.stats import TOLERANCE, Est, positive

# said after a reason whose percentages are medians of each round's ratio
PAIRED = " (percentages: the median of each round's ratio, not the ratio of the medians)"
TRACKS = 0.85  # e2e "tracks" a bound when it reaches this fraction of it
WELL_BELOW = 0.9  # the loader is "well below" compute under this fraction of it
ABOVE_BOUND = 0.10  # a single e2e window this far above its bound: a broken measurement
MOST_WINDOWS = 100  # more windows than are reasonable to advise


def combined_bound(compute: Est, device_data_s_per_image: Est | None) -> Est:
    """On a GPU the loader's device-side work (H2D copy, nvJPEG decode, GPU augment) runs in
    line with the step on the training stream: e2e reaches at most their serial_rate."""
    d = device_data_s_per_image
    return compute if d is None else serial_bound(compute, d)


@dataclass
class Verdict:
    bottleneck: Bottleneck
    case: Case  # why; `reason` words it with `figures`
    figures: dict = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    ratio: Est | None = None  # the ratio it rests on (e2e / bound, or loader / compute)
    margin: float | None = None  # how far its interval clears the threshold (> 0: conclusive)
    leaning: Bottleneck | None = None  # what an undecided rule leaned to
    overlap_loss: Est | None = None  # 1 - e2e/bound (at least 0); None: not measured
    # the ratio a question left open by wide intervals rests on, and the line it straddles
    open_ratio: Est | None = None
    open_line: float | None = None

    @property
    def reason(self) -> str:
        text = self.case.value.format(**self.figures, tracks=TRACKS, well_below=WELL_BELOW,
                                      loses=1 - TRACKS)
        # a ratio of paired windows is no ratio of the medians shown beside it (e2e 11.3 and
        # compute 7.7 read "105% of compute" where their medians came from other rounds)
        return text + PAIRED if self.figures.get("paired") else text

    @property
    def impossible(self) -> str | None:
        """e2e above its own bound, impossible in a steady run (a noise reason: run.summary)."""
        return ABOVE_OWN_BOUND.format(**self.figures) if self.case is Case.above_bound else None


def _paired(windows: dict | None, names: tuple[str, ...]) -> dict[str, list[float]] | None:
    """The phases' per-window throughputs of the rounds all finished, if 2+."""
    if not windows or any(not windows.get(n) for n in names):
        return None
    k = min(len(windows[n]) for n in names)
    out = {n: list(windows[n][:k]) for n in names}
    return out if k >= 2 and all(positive(x) for n in names for x in out[n]) else None


def _data_or_compute(figures: dict, data: Case, compute: Case) -> Verdict:
    """Data- or compute-bound from the loader's share of compute; across WELL_BELOW: open."""
    s = figures["supply"]
    if s.hi < WELL_BELOW:
        return Verdict(Bottleneck.data, data, figures, ratio=s, margin=WELL_BELOW - s.hi)
    if s.lo >= WELL_BELOW:
        return Verdict(Bottleneck.compute, compute, figures, ratio=s, margin=s.lo - WELL_BELOW)
    lean = Bottleneck.data if s.value < WELL_BELOW else Bottleneck.compute
    return Verdict(Bottleneck.inconclusive, Case.supply_open, figures, ratio=s, leaning=lean,
                   open_ratio=s, open_line=WELL_BELOW)


def _pipe_figures(loader: Est, compute: Est, e2e: Est, device_data: Est | None,
                  windows: dict | None) -> dict:
    """The bounds and ratios the three-pipe cases rest on (paired from 2+ rounds, if any)."""
    compute_bound = combined_bound(compute, device_data)
    bound = Est(*map(min, astuple(loader), astuple(compute_bound)))
    paired = _paired(windows, PHASE_NAMES)
    if paired is None:
        tracking, supply, of_compute = (e2e.over(bound), loader.over(compute_bound),
                                        e2e.over(compute_bound))
    else:
        bounds = [combined_bound(Est.of(c), device_data).value for c in paired["compute"]]
        rounds = list(zip(paired["loader"], bounds, paired["e2e"], strict=True))
        tracking = Est.median_of([e / min(x, b) for x, b, e in rounds])
        supply = Est.median_of([x / b for x, b, _ in rounds])
        of_compute = Est.median_of([e / b for _, b, e in rounds])
    name = "compute" if compute_bound is compute else "compute + device data work"
    narrower = "the loader" if loader.value <= compute_bound.value else name
    return dict(loader=loader, compute=compute_bound, compute_name=name, e2e=e2e, bound=bound,
                narrower=narrower, tracking=tracking, supply=supply, of_compute=of_compute,
                paired=paired is not None,
                loss=Est(*(max(0.0, 1.0 - x) for x in (tracking.value, tracking.hi, tracking.lo))))


def _three_pipes(f: dict) -> Verdict:
    """e2e against the narrower bound first (above: disturbed), then which bound it tracks."""
    t = f["tracking"]
    # above what the pipes allow: its interval wholly above 1 + TOLERANCE, or a single window
    # more than ABOVE_BOUND above. Not above 1 alone: e2e may beat a bound measured alone by a
    # few percent (the loader phase waits for each copy, which e2e overlaps; an H100 read
    # 100.03% [100.0%-100.1%] of compute at batch 256, docs/gpu.md)
    if (t.value > 1.0 + ABOVE_BOUND) if t.exact else (t.lo > 1.0 + TOLERANCE):
        return Verdict(Bottleneck.inconclusive, Case.above_bound, f, ratio=t)
    if t.hi < TRACKS:
        return Verdict(Bottleneck.overlap, Case.overlap, f, ratio=t, margin=TRACKS - t.hi,
                       overlap_loss=f["loss"])
    if t.lo < TRACKS:  # straddles TRACKS: which pipe is narrowest is still decided on its own
        # interval, with the overlap loss's; only when that is open too is the run inconclusive
        v = _data_or_compute(f, Case.data_open_overlap, Case.compute_open_overlap)
        if v.bottleneck is Bottleneck.inconclusive:
            lean = Bottleneck.overlap if t.value < TRACKS else v.leaning
            return Verdict(Bottleneck.inconclusive, Case.both_open, f, ratio=t, leaning=lean,
                           overlap_loss=f["loss"], open_ratio=f["supply"], open_line=WELL_BELOW)
        v.overlap_loss, v.open_ratio, v.open_line = f["loss"], t, TRACKS
        return v
    v = _data_or_compute(f, Case.data_tracks, Case.compute_tracks)
    v.overlap_loss = f["loss"]
    if v.bottleneck is Bottleneck.compute:
        v.ratio, v.margin = t, min(v.margin, t.lo - TRACKS)
    elif v.bottleneck is Bottleneck.data:
        v.margin = min(v.margin, t.lo - TRACKS)
    return v


class Undecided(Enum):
    """Why no number of windows is advised to settle an open question."""

    on_line = "on_line"  # no number of windows tells its side
    too_wide = "too_wide"  # this spread would take more windows than are reasonable


def windows_to_decide(ratio: Est, line: float, repeats: int) -> int | Undecided:
    """How many windows would put `ratio`'s interval wholly on one side of `line` (it narrows
    about as 1/sqrt(windows)); Undecided on the line or past MOST_WINDOWS."""
    reach = ratio.value - ratio.lo if line < ratio.value else ratio.hi - ratio.value
    gap = abs(ratio.value - line)
    if reach <= 0 or gap <= 0.005 * line:
        return Undecided.on_line
    # 20% spare: the estimate is rough
    need = max(math.ceil(repeats * (reach / gap) ** 2 * 1.2), repeats + 1)
    return need if need <= MOST_WINDOWS else Undecided.too_wide


def classify(loader, compute, e2e, data_wait_fraction: float | None = None,
             intervals: dict | None = None, device_data_s_per_image=None,
             windows: dict | None = None) -> Verdict:
    """The narrowest pipe from images/sec (or `Est`), `intervals` and `windows` (interleaved
    rounds): `inconclusive` unless the ratio's interval lies wholly on one side of its line."""
    iv = intervals or {}
    loader_ips, compute_ips, e2e_ips = (Est.of(x, iv.get(name)) for name, x in
                                        zip(PHASE_NAMES, (loader, compute, e2e), strict=True))
    if loader_ips and compute_ips and e2e_ips:
        device_data = Est.of(device_data_s_per_image, iv.get("device_data"))
        return _three_pipes(_pipe_figures(loader_ips, compute_ips, e2e_ips, device_data, windows))
    if loader_ips and compute_ips:  # without e2e: which of the two bounds is narrower
        paired = _paired(windows, ("loader", "compute"))
        supply = (Est.median_of([x / c for x, c in zip(*paired.values(), strict=True)])
                  if paired else loader_ips.over(compute_ips))
        return _data_or_compute(dict(loader=loader_ips, compute=compute_ips, supply=supply,
                                     paired=bool(paired)), Case.data_no_e2e, Case.compute_no_e2e)
    if e2e_ips and data_wait_fraction is not None and not math.isnan(data_wait_fraction):
        if data_wait_fraction > 0.25:
            return Verdict(Bottleneck.data, Case.waits_on_data, dict(wait=data_wait_fraction))
        return Verdict(Bottleneck.compute, Case.waits_little, dict(wait=data_wait_fraction))
    return Verdict(Bottleneck.unknown, Case.too_few_phases)


@dataclass
class Knobs:
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
    oom: bool = False  # the run ran out of memory: the advice is about fitting, not speed
    memory_of: str = "the device"  # what memory_fraction is a fraction of (RunRecord.memory_of)


def advise(bottleneck: Bottleneck, k: Knobs) -> list[str]:
    gpu, starved = k.device == "cuda", bottleneck in (Bottleneck.data, Bottleneck.overlap)
    rules = [
        (Step.contention, bottleneck is Bottleneck.overlap and not gpu and k.num_workers > 0),
        (Step.workers_from_zero if gpu else Step.workers_from_zero_on_cpu,
         starved and k.num_workers == 0),
        (Step.more_workers, bottleneck is Bottleneck.data and 0 < k.num_workers < k.cpu_count),
        (Step.pin_memory, starved and gpu and not k.pin_memory),
        (Step.preload, starved and k.dataset in PRELOAD_HELPS and not k.preload),
        (Step.augment_on_device, starved and gpu and k.augment_on == "cpu"),
        (Step.more_cpu if gpu else Step.more_cpu_on_cpu,
         bottleneck is Bottleneck.data and k.num_workers >= k.cpu_count),
    ]
    if bottleneck is Bottleneck.compute:
        frac = k.memory_fraction
        rules += [
            (Step.amp if gpu else Step.amp_on_cpu, not is_amp(k.precision)),
            (Step.channels_last, gpu and k.is_conv and not k.channels_last and is_amp(k.precision)),
            (Step.compile, gpu and k.compile == "off"),
            (Step.larger_batch, frac is not None and frac < 0.6 * k.ceiling),
            (Step.on_cpu, not gpu),
        ]
    rules.append((Step.all_phases, bottleneck is Bottleneck.unknown and not k.oom))
    if k.oom:  # first: no speed advice helps a run that does not fit
        rules[:0] = [(Step.smaller_batch, k.batch_size > 1),
                     (Step.amp_for_memory, not is_amp(k.precision))]
    n = k.num_workers
    figures = dict(vars(k), workers=workers(n), s="s" * (n == 1), double_batch=2 * k.batch_size,
                   half_batch=max(1, k.batch_size // 2),
                   more_workers=more_workers(n, k.device, k.cpu_count))
    return [step.value.format(**figures) for step in [s for s, on in rules if on][:3]]


def judge(loader, compute, e2e, data_wait_fraction: float | None, knobs: Knobs,
          intervals: dict | None = None, noise_reasons: list[Reason] | None = None,
          remedies: list[str] | None = None, device_data_s_per_image=None,
          windows: dict | None = None, record: RunRecord | None = None) -> Verdict:
    """The verdict and its advice. A disturbed run (`noise_reasons`) is `inconclusive` whatever
    its figures, advised its `remedies`; a question left open only by wide intervals gets the
    windows that would decide it."""
    v = classify(loader, compute, e2e, data_wait_fraction, intervals, device_data_s_per_image,
                 windows)
    if noise_reasons and v.bottleneck is not Bottleneck.unknown:
        lean = v.leaning if v.bottleneck is Bottleneck.inconclusive else v.bottleneck
        # no open question: more windows do not decide a disturbed run, its remedies do
        v = Verdict(Bottleneck.inconclusive, Case.unstable_leaning if lean else Case.unstable,
                    dict(flaws="; ".join(r.text for r in noise_reasons), lean=lean),
                    ratio=v.ratio, leaning=lean, overlap_loss=v.overlap_loss)
    decide = _to_decide(v, record)
    if v.bottleneck is Bottleneck.inconclusive:
        v.advice = [decide] if decide else (remedies or [])[:3] or [more_windows(record)]
    else:
        v.advice = advise(v.bottleneck, knobs) + ([decide] if decide else [])
    return v


def _to_decide(v: Verdict, record: RunRecord | None) -> str | None:
    """The command that would settle the question `v` leaves open, from the spread measured."""
    bench, steps, repeats = bench_of(record)
    if v.open_ratio is None or steps is None:
        return None
    repeats, per_window = window_plan(steps, repeats)
    what = ("whether overlap costs more than "
            f"{1 - TRACKS:.0%}" if v.bottleneck is not Bottleneck.inconclusive else "the verdict")
    n = windows_to_decide(v.open_ratio, v.open_line, repeats)
    if n is Undecided.on_line:
        return (f"{what}: the figure sits on the {v.open_line:.0%} line, where no number of "
                "windows tells its side; the difference is too small to matter")
    if n is Undecided.too_wide:  # off the line, but so spread that more windows hardly narrow
        steadier = rerun_text([Flaw.disturbed, Flaw.too_short], str(longer(record)))
        return (f"{what}: the figure ({v.open_ratio:.0%}) is off the {v.open_line:.0%} line, "
                f"but at the spread measured it would take over {MOST_WINDOWS} windows to tell; "
                f"steadier windows tell sooner: {steadier}")
    more = longer(record, (n * per_window, n))  # it may set a least window (too brief ones)
    least = (bench.get("min_window_s") or 0.0) if more.min_window_s is None else more.min_window_s
    return (f"{more}: about {windows_of(n, per_window, least)} would decide {what} (from the "
            "spread measured)")
