"""The recommendation rule, shared by the report, the search loop and the sweep's MLflow
parent: rows of measured configurations, their ranking, and reference article 003's pick.

Among feasible configurations (status ok, peak memory under memory.ceiling) within `tolerance`
(5%) of the fastest, keep AMP on when AMP measured faster, pin_memory on, then the smallest batch
size and the fewest loader workers.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

from gpubench.analysis.select import knob_of, left_out
from gpubench.analysis.workers import fewest_workers, workers
from gpubench.config.keys import Role
from gpubench.config.knobs import compared, role
from gpubench.config.schema import FaultConfig, is_amp
from gpubench.core.files import flatten
from gpubench.core.record import Flaw, RunRecord
from gpubench.core.stats import TOLERANCE, Est, holding, median, median_interval

# sections of the config a recommendation consists of; bench (how to measure), tracking and
# fault injection are not part of a training setup
SETUP_KEYS = ("dataset", "model", "loader", "precision", "step", "channels_last", "compile",
              "memory")


# what a recommended config holds: the setup and `bench` as the chosen run measured it (steps,
# windows, warm-up, phases, seed, and the step's own knobs: optimizer, grad_accum_steps,
# cudnn_benchmark). Without `bench`, a rerun measures the defaults' length and lands outside
# the interval the recommendation was made on. Tracking and fault injection stay out.
RERUN_KEYS = (*SETUP_KEYS, "bench")

# fault injection as configured by default (none): a run with any other value is a test of a
# failure path and never pooled with anything
NO_FAULT = {f"fault.{k}": v for k, v in asdict(FaultConfig()).items()}


@dataclass
class Row:
    """One measured configuration: a run record (gpubench.core.record decides what its status,
    throughput and feasibility mean) and its config as dotted keys."""

    label: str  # how the user finds it: its job folder, else a trial number or MLflow run id
    record: RunRecord
    flat: dict[str, Any] = field(default_factory=dict)
    # the sweep's confirm step: the same configuration measured again, interleaved with the
    # other top trials; when present, the figures below pool them with the record
    confirms: list[RunRecord] = field(default_factory=list)
    # its study's label (a trial number, `compute-3`) when `label` names its folder instead
    trial: str | None = None

    def __post_init__(self) -> None:
        if not self.flat:
            self.flat = flatten(self.record.config)

    @property
    def status(self) -> str:
        return self.record.status.value

    @property
    def throughput(self) -> float:
        """The record's throughput; the median over all measurements once confirmed."""
        if self.confirms and self.pooled:
            return median(self.pooled)
        return self.record.throughput

    @property
    def measurements(self) -> list[RunRecord]:
        """The trial's own record, then its confirm step's re-measurements (search.loop)."""
        return [self.record, *self.confirms]

    @property
    def pooled(self) -> list[float]:
        """Throughputs of every measurement that measured (a crashed confirm has none)."""
        return [m.throughput for m in self.measurements if m.status.measured]

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% interval of the throughput: over the confirm step's measurements when it ran
        (gpubench.core.stats.median_interval), else the run's own, over its windows; the figure
        itself when there is nothing to spread over."""
        if self.confirms:
            return holding(median_interval(self.pooled), self.throughput)
        return self.record.throughput_interval

    # the record's own figures, read through the row
    peak = property(attrgetter("record.peak_memory_fraction"))
    ceiling = property(attrgetter("record.memory_ceiling"))
    rung = property(attrgetter("record.rung"))
    feasible = property(attrgetter("record.feasible"))
    full = property(attrgetter("record.full"))

    @property
    def data(self) -> dict:
        return self.record.to_dict()

    @property
    def dir(self) -> str | None:
        return str(self.record.dir) if self.record.dir is not None else None

    @property
    def stable(self) -> bool:
        """False when the run itself found its measurement disturbed (noise_reasons); once
        confirmed, also when any re-measurement was disturbed or did not measure, or when the
        measurements disagree: their own intervals share no common figure."""
        if any(map(_flawed, self.measurements)):
            return False
        ivs = [m.throughput_interval for m in self.measurements]
        return max(lo for lo, _ in ivs) <= min(hi for _, hi in ivs)

    @property
    def steadiness(self) -> str:
        """Why the row ranks where it does among feasible rows, in a word: `stable` (or
        `confirmed` once re-measured alike), `too short` (its only flaw: windows too brief to
        judge), `disturbed` (a measurement found itself disturbed or did not measure),
        `disagreed` (re-measurements whose intervals share no figure), `-` (not judged: a
        record written before the checks)."""
        if self.record.measurement_stable is None and not self.confirms:
            return "-"
        if self.stable:
            return "confirmed" if self.confirms else "stable"
        flawed = list(filter(_flawed, self.measurements))
        if not flawed:
            return "disagreed"
        short = all(m.status.measured and m.noise_reasons
                    and all(r.kind is Flaw.too_short for r in m.noise_reasons) for m in flawed)
        return "too short" if short else "disturbed"

    @property
    def confirmed(self) -> bool:
        """Re-measured by the confirm step and found stable."""
        return bool(self.confirms) and self.stable

    def knob(self, name: str) -> Any:
        """A knob by its short name (gpubench.config.knobs.SHORT)."""
        v = knob_of(self.flat.get, name)
        if v is None and name == "precision":  # a study's param is the group, not the key
            v = self.flat.get("precision")
        return v

    @property
    def amp(self) -> bool:
        return is_amp(self.knob("precision"))


def _flawed(m: RunRecord) -> bool:
    """The measurement found itself disturbed, or did not measure."""
    return m.measurement_stable is False or not m.status.measured


def row_of(rec: RunRecord, label: str) -> Row:
    return Row(label, rec)


def latest_per_setup(rows: list[Row]) -> list[Row]:
    """One row per training setup: an experiment collects screens and full measurements of the
    same setup, and repeats across sweeps (a sweep's confirm step among them). The row is the
    newest of the longest measurements; the others of that length that repeat it exactly
    (`repeats`) are pooled as a sweep dir's confirm jobs are (Row.confirms): dropping them
    would throw measurements away and let one lucky run stand for the setup."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        cfg = r.record.config
        # a loader-only run or a probe is another kind of measurement of the setup: never
        # the row that stands for (and hides) its training measurement
        key = json.dumps({**{k: cfg.get(k) for k in SETUP_KEYS}, "kind": left_out(r.record)},
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    out = []
    for group in groups.values():
        def steps(r: Row) -> int:
            return int(r.record.config.get("bench", {}).get("steps") or 0)

        longest = max(steps(r) for r in group)
        same = sorted((r for r in group if steps(r) == longest),
                      key=lambda r: r.record.started_at or "", reverse=True)
        head = same[0]
        head.confirms = [r.record for r in same[1:]
                         if r.record.status.final and repeats(r.record, head.record)]
        out.append(head)
    return out


def _what_ran(rec: RunRecord) -> dict[str, Any]:
    return {k: v for k, v in flatten(rec.config or {}).items() if role(k) is not Role.measure}


def faulted(rec: RunRecord) -> bool:
    """The run had fault injection configured (any fault.* off its default)."""
    cfg = flatten(rec.config or {})
    return any(cfg.get(k, v) != v for k, v in NO_FAULT.items())


def repeats(rec: RunRecord, of: RunRecord) -> bool:
    """`rec` measured the same thing as `of` again: the whole config equal except how long and
    how it was measured and tracked (Role.measure), on the same device model, and neither had
    fault injection."""
    return (rec.env.get("device_name") == of.env.get("device_name")
            and not faulted(rec) and not faulted(of) and _what_ran(rec) == _what_ran(of))


def varying(rows: list[Row]) -> list[str]:
    """Config keys that differ between rows: the swept knobs (any key that tells runs apart:
    gpubench.config.knobs.compared), in a stable order."""
    keys: dict[str, set] = {}
    for r in rows:
        for k, v in r.flat.items():
            if compared(k):
                keys.setdefault(k, set()).add(json.dumps(v, default=str))
    return [k for k, vals in keys.items() if len(vals) > 1 or any(k not in r.flat for r in rows)]


def ranked(rows: list[Row]) -> list[Row]:
    """Feasible first, full-length measurements before short screens, stable before disturbed,
    fastest first."""
    return sorted(rows, key=lambda r: (not r.feasible, not r.full, not r.stable, -r.throughput))


@dataclass
class Recommendation:
    best: Row
    chosen: Row
    tolerance: float
    reasons: list[str]


def with_interval(r: Row) -> str:
    return f"{Est(r.throughput, *r.interval):.1f}"


def near_best(r: Row, best: Row, tolerance: float) -> bool:
    """Within `tolerance` of the best, judged on intervals: even the low end of the row's
    interval reaches (1 - tolerance) of the best's median. A noisy row that only might be
    that fast does not qualify, so noise never picks a smaller, slower configuration."""
    return r is best or r.interval[0] >= (1.0 - tolerance) * best.throughput


def amp_effect(amp: Row, plain: Row) -> str:
    """'faster', 'slower' or 'same': AMP's best against the best without it, on intervals."""
    if amp.interval[0] > plain.interval[1]:
        return "faster"
    # single windows (no spread) fall in the two cases above unless the figures are equal
    if amp.interval[1] < plain.interval[0]:
        return "slower"
    return "same"


def recommend(rows: list[Row], tolerance: float = TOLERANCE) -> Recommendation | None:
    """Reference article 003's pick: among full-length, feasible, stable measurements within
    `tolerance` of the fastest (on intervals), AMP on when it measured faster beyond the
    intervals, pin_memory on, then the smallest batch and the fewest workers (large batches
    can hurt the model and take memory; extra workers cost host RAM). A screen or a probe is
    too short to compare speeds; a run that found its own measurement disturbed is never the
    recommendation, and the report says when the fastest figure came from one."""
    full = [r for r in rows if r.feasible and left_out(r.record) is None]
    ok = [r for r in full if r.stable]
    reasons = []
    if full and not ok:
        ok = full
        reasons.append("UNCONFIRMED: every measurement flagged itself (disturbed or too short: "
                       "noise_reasons); rerun the recommended config on a quiet machine, with "
                       "longer windows where too short, before trusting it")
    if not ok:
        return None
    # once the confirm step ran, the reference is the fastest confirmed configuration: a trial
    # measured once may have been lucky
    best = max([r for r in ok if r.confirmed] or ok, key=lambda r: r.throughput)
    if any(r.confirms for r in rows) and not best.confirmed:
        reasons.append("UNCONFIRMED: no top trial measured alike when re-measured (confirm "
                       "step); rerun the recommended config on a quiet machine before trusting it")
    near = [r for r in ok if near_best(r, best, tolerance)]
    # the headline follows the first UNCONFIRMED warning, when there is one
    reasons.insert(min(1, len(reasons)), f"fastest {'stable ' if best.stable else ''}feasible: "
                   f"{with_interval(best)} img/s; {len(near)} configuration(s) within "
                   f"{tolerance:.0%} of it on their intervals")
    fastest = max(full, key=lambda r: r.throughput)
    if fastest is not best:
        reasons.append(f"the fastest figure, run {fastest.label} at {with_interval(fastest)} "
                       f"img/s, {why_not_best(fastest)}; it is not recommended until a rerun on a "
                       "quiet machine confirms it")
    amp, plain = [r for r in ok if r.amp], [r for r in ok if not r.amp]
    if amp and plain:
        a = max(amp, key=lambda r: r.throughput)
        p = max(plain, key=lambda r: r.throughput)
        effect = amp_effect(a, p)
        figures = (f"with AMP {with_interval(a)} img/s, without {with_interval(p)} "
                   f"({a.throughput / p.throughput - 1:+.1%}")
        if effect == "same":
            reasons.append(f"AMP made no measurable difference: {figures}, inside the intervals)")
        else:
            helps = effect == "faster"
            near = [r for r in near if r.amp == helps] or near
            reasons.append(f"AMP {'on' if helps else 'off'}: best {figures})")
    # pinning only exists for copies to a GPU: on a CPU-only run it is not a knob at all
    on_gpu = any(r.record.env.get("device") == "cuda" for r in near)
    pinned = [r for r in near if r.knob("pin_memory") is True]
    if on_gpu and pinned and len(pinned) < len(near):
        near = pinned
        reasons.append("pin_memory on: page-locked buffers make host-to-device copies cheaper")

    def size(r: Row, name: str) -> float:
        v = r.knob(name)
        return math.inf if v is None else float(v)

    chosen = min(near, key=lambda r: (size(r, "batch_size"), size(r, "num_workers"),
                                      -r.throughput))
    picked = [f"{what} ({v})" for what, v in (("smallest batch size", chosen.knob("batch_size")),
                                              ("fewest workers", chosen.knob("num_workers")))
              if v is not None]
    reasons.append(f"{' and '.join(picked) or 'no batch size or workers recorded: the fastest'}"
                   f" within {tolerance:.0%}: {with_interval(chosen)} img/s, "
                   f"{chosen.throughput / best.throughput:.0%} of the fastest")
    reasons += _workers_check(rows, chosen, best, tolerance)
    return Recommendation(best, chosen, tolerance, reasons)


def why_not_best(r: Row) -> str:
    """Why the fastest figure is not the reference, from the row itself: its own measurement
    found itself disturbed, its confirm step's re-measurements were disturbed or disagreed, or
    it was measured once while the confirm step re-measured other trials."""
    own = r.record
    if own.measurement_stable is False:
        why = ", ".join(r.text for r in own.noise_reasons) or "noise_reasons not recorded"
        return f"was measured unstable ({why})"
    if r.confirms and not r.stable:
        return (f"was not confirmed: its {len(r.confirms)} re-measurement(s) by the confirm step "
                "were disturbed, failed or disagreed with it")
    return ("is unconfirmed: its own measurement found no disturbance, but the confirm step "
            "re-measured other trials, not this one")


def _workers_check(rows: list[Row], chosen: Row, best: Row, tolerance: float) -> list[str]:
    """The loader phase's view (gpubench.analysis.workers.fewest_workers): how many workers
    out-run compute at the chosen setup's batch size (the loader phase runs no model, so all
    precisions count), in one line. Where it names another worker count than the recommendation,
    the line says which decides: training measured end to end, since the loader phase alone
    leaves out what training adds (with 0 workers the main process loads between steps)."""
    batch = chosen.knob("batch_size")
    same = [r for r in rows if r.knob("batch_size") == batch and r.record.status.measured]
    pick = fewest_workers([(r.knob("num_workers"), r.record.loader_images_per_sec) for r in same],
                          chosen.record.compute_images_per_sec, tolerance)
    mine, theirs = chosen.knob("num_workers"), pick.num_workers
    if theirs is None:
        return []
    if not pick.unblocks or mine is None or theirs == mine:
        return [f"loader check: {pick.reason}"]
    loads = (f"the loader phase alone has {workers(theirs)} out-run compute "
             f"({pick.loader_images_per_sec:.1f} img/s against {pick.compute.value:.1f})")
    if theirs > mine:
        return [f"loader check: {loads}, yet training with {workers(mine)} came within "
                f"{tolerance:.0%} of the fastest: the training measurement decides"]
    trained = [r for r in same if r.feasible and r.full and r.knob("num_workers") == theirs
               and left_out(r.record) is None]
    serial = " (with 0 workers the main process loads each batch between steps)" \
        if theirs == 0 else ""
    if not trained:
        return [f"loader check: {loads}, but training with {workers(theirs)} was not "
                f"measured: {workers(mine)} is the fewest measured end to end within "
                f"{tolerance:.0%}; measure loader.num_workers={theirs} end to end to try fewer"]
    t = max(trained, key=lambda r: r.throughput)
    return [f"loader check: {loads}, but training with {workers(theirs)} measured "
            f"{with_interval(t)} img/s, {t.throughput / best.throughput:.0%} of the fastest, "
            f"not within {tolerance:.0%} on its interval{serial}: the training measurement "
            f"decides, {workers(mine)}"]
