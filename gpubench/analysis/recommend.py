"""The recommendation rule shared by the report, the search loop and the sweep's MLflow parent:
rows of measured configurations, their ranking, and reference article 003's pick (`recommend`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from operator import attrgetter
from typing import Any

from gpubench.analysis.labels import flaw_words, rerun_text
from gpubench.analysis.select import (
    FAULT_TRIGGERS,
    NO_FAULT,
    as_faulted,
    faulted,
    knob_of,
    left_out,
)
from gpubench.analysis.workers import (
    compute_bound,
    fewest_workers,
    least_cores,
    setup_of_run,
    workers,
)
from gpubench.config.keys import Role
from gpubench.config.knobs import DATA_KEYS, KEYS, acts, compared, role
from gpubench.config.schema import is_amp
from gpubench.core.files import flatten
from gpubench.core.record import PLAN_KEYS, Flaw, Rung, RunRecord, interval_label_of, longer
from gpubench.core.stats import TOLERANCE, Est, count, holding, median, median_interval

# a recommended config: every section holding a workload key or a knob, `bench` as the chosen
# run measured it (else a rerun measures the defaults' length, outside the interval the pick
# was made on) and the memory ceiling it was judged by; never tracking (the team's) or faults
RERUN_KEYS = (*dict.fromkeys(n.split(".")[0] for n in KEYS if role(n) in (Role.workload, Role.knob)
                             and not n.startswith("bench.")), "memory", "bench")  # setup first
# the data pipe's knobs but the workers: the loader check pools only rows alike in these
LOADER_SETTING = tuple(k for k in DATA_KEYS if k != "loader.num_workers")


@dataclass
class Row:
    """One measured configuration: a run record and its config as dotted keys."""

    label: str  # its job folder, else a trial number or MLflow run id
    record: RunRecord
    flat: dict[str, Any] = field(default_factory=dict)
    # re-measurements (the confirm step's, a grid's repeats), pooled with the record
    confirms: list[RunRecord] = field(default_factory=list)
    trial: str | None = None  # its study's label (`compute-3`) when `label` names its folder
    stage: str | None = None  # sweep=pipes' stage study (`compute`, `data-<digest>`)

    def __post_init__(self) -> None:
        if not self.flat:
            self.flat = flatten(self.record.config)

    @property
    def throughput(self) -> float:
        return median(self.pooled) if self.confirms and self.pooled else self.record.throughput

    @property
    def measurements(self) -> list[RunRecord]:
        return [self.record, *self.confirms]

    @property
    def as_ranked(self) -> RunRecord:
        """Its record with the ranking's pooled figure and interval (MLflow's parent)."""
        if not (self.confirms and self.pooled):
            return self.record
        return replace(self.record, images_per_sec=self.throughput,
                       images_per_sec_ci=list(self.interval))

    @property
    def pooled(self) -> list[float]:
        return [m.throughput for m in self.measurements if m.status.measured]

    @property
    def _pooled_ci(self):
        """(lo, hi, coverage, widened): the median's interval over the measurements, never
        narrower than the median of their own ends (two close repeats' [min, max] was narrower
        than either's own). None without confirms (not cached: confirms join a row later)."""
        if not self.confirms or (ci := median_interval(self.pooled)) is None:
            return None
        own = [iv for m in self.measurements if m.status.measured
               and (iv := m.throughput_interval)[0] < iv[1]]  # one window: no interval of its own
        if not own:
            return (*ci, False)
        low = min(ci[0], median([lo for lo, _ in own]))
        high = max(ci[1], median([hi for _, hi in own]))
        return low, high, ci[2], (low, high) != ci[:2]

    @property
    def _alone(self) -> RunRecord:
        """The record that stands for the row without a pooled interval: the one measured (a
        failed run's one measured repeat), else its own."""
        measured = [m for m in self.measurements if m.status.measured]
        return measured[0] if len(measured) == 1 else self.record

    @property
    def interval(self) -> tuple[float, float]:
        ci = self._pooled_ci
        return self._alone.throughput_interval if ci is None else holding(ci, self.throughput)

    @property
    def widened(self) -> bool:
        """`interval` reaches past its measurements' [min, max], to their own ends."""
        ci = self._pooled_ci
        return ci is not None and ci[3]

    @property
    def interval_coverage(self) -> float:
        """Pooled: its measurements' (3 of them: [min, max], 75%)."""
        ci = self._pooled_ci
        return self._alone.interval_coverage if ci is None else ci[2]

    status = property(attrgetter("record.status.value"))
    peak = property(attrgetter("record.peak_memory_fraction"))
    ceiling = property(attrgetter("record.memory_ceiling"))
    rung = property(attrgetter("record.rung"))
    feasible = property(attrgetter("record.feasible"))
    full = property(attrgetter("record.full"))

    @property
    def dir(self) -> str | None:
        return str(self.record.dir) if self.record.dir is not None else None

    @property
    def stable(self) -> bool:
        """No measurement flawed, and their intervals share a common figure."""
        if any(map(_flawed, self.measurements)):
            return False
        ivs = [m.throughput_interval for m in self.measurements]
        return max(lo for lo, _ in ivs) <= min(hi for _, hi in ivs)

    @property
    def steadiness(self) -> Steadiness:  # why it ranks where it does among feasible rows
        if self.record.measurement_stable is None and not self.confirms:
            return Steadiness.unchecked
        if self.stable:
            return Steadiness.confirmed if self.confirms else Steadiness.stable
        return Steadiness.flawed if self.flaws else Steadiness.disagreed

    @property
    def flaws(self) -> list[Flaw]:
        """Its flawed measurements' reason kinds, once each in Flaw's order; one flawed without
        reasons (failed, or an older record's bare flag): `other`."""
        kinds = {k for m in filter(_flawed, self.measurements)
                 for k in [r.kind for r in m.noise_reasons if m.status.measured] or [Flaw.other]}
        return [k for k in Flaw if k in kinds]

    @property
    def standing(self) -> str:
        """The ranking's status: the steadiness, a flawed row's flaws in words."""
        s = self.steadiness
        return ", ".join(flaw_words(self.flaws)) if s is Steadiness.flawed else s.value

    @property
    def confirmed(self) -> bool:
        return bool(self.confirms) and self.stable

    @property
    def stepped(self) -> bool:
        """Re-measured by a search's confirm step, not only repeated by a grid's runs."""
        return any(Rung.of(m.rung) is Rung.confirm for m in self.confirms)

    def knob(self, name: str) -> Any:
        v = knob_of(self.flat.get, name)
        if v is None and name == "precision":  # a study's param is the group, not the key
            v = self.flat.get("precision")
        return v

    @property
    def amp(self) -> bool:
        return is_amp(self.knob("precision"))


def _flawed(m: RunRecord) -> bool:
    return m.measurement_stable is False or not m.status.measured


def latest_per_setup(rows: list[Row]) -> list[Row]:
    """One row per setup measured one way (_what_ran and PLAN_KEYS): the newest measurement (a
    trial before its confirm runs), the others that repeat it pooled as confirms (one lucky
    run must not stand for the setup). A search's trial rows pass as they are."""
    out = [r for r in rows if r.trial is not None]
    groups: dict[str, list[Row]] = {}
    for r in (r for r in rows if r.trial is None):
        # a loader-only run or a probe must never stand for (and hide) a training measurement,
        # nor a run measured another way (its plan: a column of the ranking) for this one
        key = json.dumps({**_what_ran(r.record), "kind": left_out(r.record),
                          "plan": _plan(r.record)}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    for group in groups.values():
        # a confirm run re-measures its trial, never stands for it: the head is the full run,
        # so every figure read from its record (loader check, cpu %, rung, parent) agrees
        same = sorted(group, reverse=True, key=lambda r: (Rung.of(r.record.rung) is not
                                                         Rung.confirm, r.record.started_at or ""))
        head = same[0]
        # a search row holds its confirm rounds already; called again, none twice
        had = [m for m in head.confirms if all(m is not r.record for r in same)]
        head.confirms = [*had, *(r.record for r in same[1:] if r.record.status.final
                                 and repeats(r.record, head.record))]
        out.append(head)
    return out


def _what_ran(rec: RunRecord) -> dict[str, Any]:
    """Its config less how it was measured and the keys that did not act (faults: as_faulted)."""
    return as_faulted(rec, {k: v for k, v in acted(rec).items() if role(k) is not Role.measure})


def acted(rec: RunRecord) -> dict[str, Any]:
    """A run's flat config values of the keys that acted in it (knobs.acts)."""
    flat = flatten(rec.config or {})
    get = ran_with(rec, flat)
    return {k: v for k, v in flat.items() if acts(k, get)}


def ran_with(rec: RunRecord, flat: dict[str, Any]) -> Callable[[str], Any]:
    """A run's config as knobs.acts reads it: `bench.device` as it ran (auto resolved,
    env.device), 0 workers where none is recorded."""
    def get(k: str) -> Any:
        if k == "bench.device" and flat.get(k) in (None, "auto"):
            return rec.env.get("device")
        return flat.get(k) or (0 if k == "loader.num_workers" else None)
    return get


def repeats(rec: RunRecord, of: RunRecord) -> bool:
    """`rec` measured what `of` did again, the same way (PLAN_KEYS), neither faulted: a run cut
    at bench.max_seconds=0.3 pooled with a full one made an interval narrower than either's."""
    return (rec.env.get("device_name") == of.env.get("device_name") and not faulted(rec)
            and not faulted(of) and _what_ran(rec) == _what_ran(of) and _plan(rec) == _plan(of))


def _plan(rec: RunRecord) -> tuple:
    return tuple(rec.knob(k) for k in PLAN_KEYS)


def acting(r: Row, key: str) -> bool:
    """Whether `key` acts in row `r` (knobs.acts; a row records every key)."""
    return acts(key, ran_with(r.record, r.flat))


def varying(rows: list[Row]) -> list[str]:
    """The compared keys (knobs.compared) that differ between the rows where they act, the
    plan where it differs, and a fault injected in some (it read like its twin without it)."""
    keys: dict[str, set] = {}
    # a fault key only where a fault acted in some row; in a row without one, only its
    # triggers' values (a stall_s that shaped nothing read 0.05 beside a stalled run's: a column)
    fault = any(faulted(r.record) for r in rows)
    for r in rows:
        hit = faulted(r.record)
        for k, v in r.flat.items():
            if (fault and (hit or k in FAULT_TRIGGERS)) if k in NO_FAULT else (
                    compared(k) or k in PLAN_KEYS):
                vals = keys.setdefault(k, set())
                if acting(r, k):
                    vals.add(json.dumps(v, default=str))
    # a row without the key (a trial known only to its study) differs by it, but for a fault
    # (absent: no injection) and a plan key (unknown for a run that left no record)
    for k in set(FAULT_TRIGGERS) & keys.keys():
        if any(k not in r.flat for r in rows):
            keys[k].add(json.dumps(NO_FAULT[k], default=str))
    return [k for k, vals in keys.items() if len(vals) > 1 or k not in NO_FAULT
            and k not in PLAN_KEYS and any(k not in r.flat for r in rows)]


def ranked(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (not r.feasible, not r.full, not r.stable, -r.throughput))


@dataclass
class Recommendation:
    best: Row
    chosen: Row
    reasons: list[str]
    unconfirmed: str | None = None  # the reasons' UNCONFIRMED line, if any


def with_interval(r: Row) -> str:
    return f"{Est(r.throughput, *r.interval):.1f}"


def fastest_of(best: Row) -> str:
    return f"fastest {'stable ' if best.stable else ''}feasible"


def coverage_of(r: Row) -> str:
    """`, 95% interval`: what `with_interval(r)`'s bracket covers; widened, `at least 50%`
    (no figure says how much more than the pooled coverage)."""
    if r.interval[0] == r.interval[1]:
        return ""
    return f", {'at least ' if r.widened else ''}{interval_label_of([r.interval_coverage])}"


def interval_label(rows: list[Row], phases: bool = False) -> str:
    """A column's or axis' label; with `phases`, of their phases' own intervals too."""
    measured = [r for r in rows if r.record.status.measured]
    covers = [*(r.interval_coverage for r in measured if r.interval[0] != r.interval[1]),
              *(c for r in measured if phases for c in r.record.coverages)]
    # a widened row covers more than its pooled coverage, by no known figure (coverage_of)
    if covers and any(r.widened for r in measured):
        return f"at least {interval_label_of([min(covers)])}"
    return interval_label_of(covers)


class Steadiness(Enum):
    """A feasible row's standing (Row.standing)."""

    stable = "stable"
    confirmed = "confirmed"  # stable over its confirm step's re-measurements
    flawed = "flawed"  # a measurement flagged itself: its kinds (Row.flaws) say how
    disagreed = "disagreed"  # its re-measurements' intervals do not overlap
    unchecked = "-"  # written before the checks


class Effect(Enum):
    """What AMP did to the best throughput, worded where it is shown."""

    faster = "faster"
    slower = "slower"
    same = "same"  # within the tolerance, inside overlapping intervals
    open = "open"  # overlapping intervals, medians further apart: not decided


def amp_effect(amp: Row, plain: Row, tolerance: float = TOLERANCE) -> Effect:
    """On intervals; overlapping, `same` only within `tolerance` (28% apart inside wide
    intervals is not decided, not "no difference")."""
    if amp.interval[0] > plain.interval[1]:
        return Effect.faster
    # single windows (no spread) fall in the two cases above unless the figures are equal
    if amp.interval[1] < plain.interval[0]:
        return Effect.slower
    return Effect.same if abs(amp.throughput / plain.throughput - 1) <= tolerance else Effect.open


def recommend(rows: list[Row], tolerance: float = TOLERANCE) -> Recommendation | None:
    """Reference article 003's pick: among full, feasible, stable measurements within
    `tolerance` of the fastest (on intervals), AMP on when it measured faster, pin_memory on,
    then the smallest batch (large ones hurt the model) and the fewest workers (host RAM)."""
    full = [r for r in rows if r.feasible and left_out(r.record) is None]
    # a faulted run tests a failure path: never the pick (its rerun config drops the fault),
    # unless nothing else measured
    full = [r for r in full if not faulted(r.record)] or full
    if not full:
        return None
    ok = [r for r in full if r.stable]
    flawed = [] if ok else [k for k in Flaw if any(k in r.flaws for r in full)]
    ok = ok or full
    # once the confirm step re-measured the top trials, the fastest confirmed one (a trial
    # measured once may have been lucky; a grid's repeats are not the top: not preferred)
    best = max([r for r in ok if r.confirmed and r.stepped] or ok, key=lambda r: r.throughput)
    unconfirmed = None
    # where measurements flagged themselves, the flaws' line (below) says it all
    stepped = any(r.stepped for r in rows)
    if not best.confirmed and not flawed and (stepped or not best.stable):
        # what the re-measured trials' flaws ask (a quiet machine where they only disagreed)
        again = [k for k in Flaw if any(k in r.flaws for r in rows if r.confirms)]
        what = ("no top trial measured alike when re-measured (confirm step)" if stepped else
                "no setup measured alike in the runs repeating it")
        unconfirmed = (f"UNCONFIRMED: {what}; {rerun_text(again, what='the recommended config')}"
                       " before trusting it")
    # on the low end of its interval: noise never picks a smaller, slower configuration
    near = [r for r in ok if r is best or r.interval[0] >= (1.0 - tolerance) * best.throughput]
    others = len(near) - 1  # less the best itself
    others_text = count(others, "other configuration") if others else "no other configuration"
    reasons = [f"{fastest_of(best)}: {with_interval(best)} "
               f"img/s; {others_text} within {tolerance:.0%} of it at the low end of its interval"]
    fastest = max(full, key=lambda r: r.throughput)
    if fastest is not best:
        reasons.append(f"the fastest figure, run {fastest.label} at {with_interval(fastest)} "
                       f"img/s, {why_not_best(fastest)}; it is not recommended until a "
                       f"{rerun_text(fastest.flaws or [Flaw.unconfirmed])} confirms it")
    amp, plain = [r for r in ok if r.amp], [r for r in ok if not r.amp]
    if amp and plain:
        a, p = (max(g, key=lambda r: r.throughput) for g in (amp, plain))
        effect = amp_effect(a, p, tolerance)
        figures = (f"with AMP {with_interval(a)} img/s, without {with_interval(p)} "
                   f"({a.throughput / p.throughput - 1:+.1%}")
        if effect is Effect.same:
            reasons.append(f"AMP made no measurable difference: {figures}, inside the intervals)")
        elif effect is Effect.open:
            reasons.append(f"AMP's effect is not decided: {figures}, but the intervals overlap: "
                           "measure longer)")
        else:
            helps = effect is Effect.faster
            near = [r for r in near if r.amp == helps] or near
            reasons.append(f"AMP {'on' if helps else 'off'}: best {figures})")
    # pinning only exists for copies to a GPU: on a CPU-only run it is no knob
    on_gpu = any(r.record.env.get("device") == "cuda" for r in near)
    pinned = [r for r in near if r.knob("pin_memory") is True]
    if on_gpu and pinned and len(pinned) < len(near):
        near = pinned
        reasons.append("pin_memory on: page-locked buffers make host-to-device copies cheaper")

    def size(r: Row, name: str) -> float:
        v = r.knob(name)
        return math.inf if v is None else float(v)

    chosen = min(near, key=lambda r: (size(r, "batch_size"), size(r, "num_workers"), -r.throughput))
    picked = [f"{what} ({v})" for what, v in (("smallest batch size", chosen.knob("batch_size")),
                                              ("fewest workers", chosen.knob("num_workers")))
              if v is not None]
    reasons.append(f"{' and '.join(picked) or 'no batch size or workers recorded: the fastest'}"
                   f" within {tolerance:.0%}: {with_interval(chosen)} img/s, "
                   f"{chosen.throughput / best.throughput:.0%} of the fastest")
    reasons += _workers_check(rows, chosen, best, tolerance)
    if flawed:  # its own "measure longer" where asked; others only disagreed: a quiet machine
        every = all(r.flaws for r in full)
        asks = flawed if every else [*flawed, Flaw.unconfirmed]
        what = ("every measurement flagged itself" if every else "no setup measured steadily: "
                "the others disagreed when re-measured, these flagged themselves")
        unconfirmed = (
            f"UNCONFIRMED: {what} ({', '.join(flaw_words(flawed))}; results.json noise_reasons); "
            f"{rerun_text(asks, str(longer(chosen.record)), 'the recommended config')} before "
            "trusting it")
    return Recommendation(best, chosen, [*([unconfirmed] if unconfirmed else []), *reasons],
                          unconfirmed)


def why_not_best(r: Row) -> str:
    own = r.record
    if own.measurement_stable is False:
        why = ", ".join(r.text for r in own.noise_reasons) or "noise_reasons not recorded"
        return f"was measured unstable ({why})"
    if r.confirms and not r.stable:
        by = "by the confirm step" if r.stepped else "(runs repeating it)"
        return (f"was not confirmed: its {count(len(r.confirms), 're-measurement')} {by} "
                f"{'was' if len(r.confirms) == 1 else 'were'} disturbed, failed or "
                "disagreed with it")
    return ("is unconfirmed: its own measurement found no disturbance, but the confirm step "
            "re-measured other trials, not this one")


def _workers_check(rows: list[Row], chosen: Row, best: Row, tolerance: float) -> list[str]:
    """The loader phase's fewest workers at the chosen batch size and data setting (any
    precision: it runs no model); where it differs from the pick, training decides."""
    batch = chosen.knob("batch_size")
    same = [r for r in rows if r.knob("batch_size") == batch and r.record.status.measured
            and all(r.flat.get(k) == chosen.flat.get(k) for k in LOADER_SETTING
                    if acting(r, k) and acting(chosen, k))]  # its loader, but for workers
    # with intervals: a median alone above compute clears nothing (workers.clears)
    rates = [(r.knob("num_workers"), m.loader_images_per_sec, m.loader_images_per_sec_ci)
             for r in same for m in r.measurements if m.status.measured]
    bound = compute_bound((m for r in rows for m in r.measurements), setup_of_run(chosen.record))[0]
    cores = least_cores(m for r in same for m in r.measurements)
    pick = fewest_workers(rates, bound, tolerance, chosen.record.env.get("device"),
                          [r.flat for r in same], cores, str(longer(chosen.record)))
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
    if not trained:
        return [f"loader check: {loads}, but training with {workers(theirs)} was not "
                f"measured: {workers(mine)} is the fewest measured end to end within "
                f"{tolerance:.0%}; measure loader.num_workers={theirs} end to end to try fewer"]
    t = max(trained, key=lambda r: r.throughput)
    serial = " (with 0 workers the main process loads each batch between steps)" * (theirs == 0)
    return [f"loader check: {loads}, but training with {workers(theirs)} measured "
            f"{with_interval(t)} img/s, {t.throughput / best.throughput:.0%} of the fastest, "
            f"not within {tolerance:.0%} on its interval{serial}: the training measurement "
            f"decides, {workers(mine)}"]
