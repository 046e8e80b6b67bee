"""`sweep=pipes` (docs/sweeps.md#sweeppipes): compute-only trials keep the fastest settings
and their bound; loader-only trials, cheapest first, find the cheapest data setting that clears
each bound; the pairings run end to end. Each stage is a gpubench.search.loop.Search on a study
of its own (`<study>-compute`, `<study>-data-<setting>`, `<study>-join`) with its points queued
in it, so resume, heartbeats, several workers and the failure budget work as in any sweep."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field, replace
from functools import cached_property, partial
from typing import Any

from gpubench.analysis.recommend import TOLERANCE, Row, recommend
from gpubench.analysis.select import training_rows
from gpubench.analysis.workers import (
    NEXT_KEYS,
    Feeds,
    clears,
    clears_by,
    feeds,
    least_cores,
    next_steps,
    undecided,
)
from gpubench.config.errors import ConfigError
from gpubench.config.knobs import CHEAP_FIRST, acts, knob_setting
from gpubench.core.pipe import serial_bound
from gpubench.core.record import Word
from gpubench.core.stats import Est, count
from gpubench.search import study as S
from gpubench.search.jobs import SweepFailed
from gpubench.search.loop import Search
from gpubench.search.manifest import PIPES_FILE
from gpubench.search.rows import trial_rows
from gpubench.search.space import Param, SearchSpace, grid, points

log = logging.getLogger("gpubench.sweep")


class Stage(Word):
    """A sweep=pipes stage: its study's and its trials' name, its key in pipes.json."""

    compute = "compute"
    data = "data"
    join = "join"


class Narrower(Word):
    """What bounds a pairing's e2e: the narrower pipe, or with 0 workers the serial bound."""

    compute = "compute"
    data = "data"
    serial = "serial"  # each batch loaded between two steps


@dataclass
class Pipes:
    # hydra.sweeper.pipes, a PipesConf (hydra_plugins.gpubench_sweeper.config: a layer above)
    plan: Any
    space: SearchSpace
    name: str  # the sweep's study name: each stage's study is named after it
    open_study: Callable[[str], S.Shared]
    # a Search on a shared study, a space and a budget (the sweeper's jobs, manifest, workers)
    search: Callable[..., Search]
    confirm: Any  # hydra.sweeper.confirm, a ConfirmConf
    write: Callable[[dict], None]  # where the path goes (pipes.json and sweep.json)
    result: dict = field(default_factory=dict)
    earlier: dict = field(default_factory=dict)  # each stage's seconds in earlier invocations

    def _spent(self, stage: str, since: float) -> float:
        """The stage's seconds over every invocation, written at once: a later kill keeps them."""
        now = time.monotonic()
        wall = self.result.setdefault("wall_s", {})
        wall[stage] = round(float(self.earlier.get(stage, 0.0)) + now - since, 1)
        self.write(self.result)
        return now

    @cached_property
    def spaces(self) -> tuple[SearchSpace, SearchSpace]:
        return check_space(self.space, self.plan.data_keys)

    def run(self) -> dict:
        t = time.monotonic()
        kept = self._compute()
        t = self._spent(Stage.compute, t)
        if kept:
            fed = [self._data(k) for k in kept]
            t = self._spent(Stage.data, t)
            self._join(kept, fed)
            self._spent(Stage.join, t)
            for line in lines(self.result):
                log.info("%s", line)
        else:
            log.warning("no compute setting ran under the memory ceiling: nothing to feed")
        pairings = (self.result.get("join") or {}).get("pairings") or []
        if pairings and all(p["e2e"] is None for p in pairings):
            # bounds alone are no recommendation (jobs.unmeasured's rule, for the join)
            trials = self.open_study(f"{self.name}-join").study.get_trials(deepcopy=False)
            last = next((e for t in reversed(trials) if (e := t.user_attrs.get("error"))), None)
            raise SweepFailed(f"no pairing of this sweep measured end to end "
                              f"({count(len(pairings), 'pairing')} tried); last error: {last}; "
                              f"the pipes' bounds are kept in the sweep folder's {PIPES_FILE}")
        return self.result

    def _compute(self) -> list[Kept]:
        space = fixed_space(self.spaces[0], {}, self.plan.compute_overrides)
        shared = self.open_study(f"{self.name}-compute")
        size = points(space.params)  # counted first: a grid of 10^6 points is never listed
        exhaustive = size is not None and size <= self.plan.compute_trials
        if exhaustive:
            # every setting, smallest batch first: a study's queue is kept across workers
            for p in sorted(grid(space.params),
                            key=lambda p: (p.get("loader.batch_size", 0), S.key(p))):
                shared.study.enqueue_trial(p, skip_if_exists=True)
        n = size if exhaustive else self.plan.compute_trials
        self.search(shared, space, n, Stage.compute).run()
        rows = _rows(shared)
        kept = keep_compute(rows, "loader.batch_size", TOLERANCE, self.plan.keep)
        self.result["compute"] = {"study": shared.study.study_name, "trials": len(rows),
                                  "space": size, "exhaustive": exhaustive,
                                  "kept": [k.summary() for k in kept]}
        for k in kept:
            log.info("compute pipe: %s: %s img/s, %s", S.describe(k.params), format(k.rate), k.why)
        return kept

    def _measure(self, shared: S.Shared, space: SearchSpace, todo: list[dict],
                 stop: Callable[[], bool] | None = None) -> None:
        """Measure `todo` (queued in this order) within the data budget, until `stop`."""
        done = len(_rows(shared))
        todo = todo[: max(self.plan.data_trials - done, 0)]
        for p in todo:
            shared.study.enqueue_trial(p, skip_if_exists=True)
        if todo:
            self.search(shared, space, done + len(todo), Stage.data, stop=stop).run()

    def _data(self, k: Kept, past: dict | None = None) -> Fed | None:
        """The data setting chosen for k; with `past` (chosen before), the next in cost order."""
        space = fixed_space(self.spaces[1], k.params, self.plan.data_overrides)
        digest = hashlib.sha1(S.key(k.params).encode()).hexdigest()[:8]
        shared = self.open_study(f"{self.name}-data-{digest}")
        params = space.params  # a grid: check_space refused a continuous data key
        points = sorted(effective(grid(params), space.fixed_values), key=lambda p: cost(p, params))
        after = None if past is None else cost(past, params)
        # what the walk measures next of these rows (nothing: answered)
        walk = partial(data_walk, points, params, bound=k.rate, margin=TOLERANCE)
        rows = _rows(shared)  # each read queries the studies and every trial's results.json
        if after is not None:  # the join's next try: the next setting past the chosen one
            measured = {S.key(p) for p, _ in rows}
            self._measure(shared, space, [p for p in points if cost(p, params) > after
                                          and S.key(p) not in measured][:1])
            rows = _rows(shared)
        else:
            while (todo := walk(rows)) and len(rows) < self.plan.data_trials:
                before = len(rows)
                self._measure(shared, space, todo, lambda: not walk(_rows(shared)))
                rows = _rows(shared)
                if len(rows) == before:  # nothing more could be measured (failures)
                    break
        f = choose_data(rows, params, k.rate, TOLERANCE, after)
        # the settings its trials ran: a next step that sets one of them is none
        tried = {S.key(t): t for _, r in rows
                 if (t := {n: r.flat.get(n) for n in NEXT_KEYS if n in r.flat})}
        ran = {"trials": len(rows), "tried": list(tried.values())}
        if after is not None:  # the join's next try ran in this study: its trials count too
            for d in self.result.get("data", []):
                if d["study"] == shared.study.study_name:
                    d.update(ran)
        elif f is not None:
            self.result.setdefault("data", []).append(
                {"for": k.params, "study": shared.study.study_name,
                 "device": next((r.record.env.get("device") for _, r in rows), None),
                 "cores": least_cores(r.record for _, r in rows), **ran, **f.summary()})
        self.write(self.result)
        if f is not None:  # the stage's pick, or the join's next try
            verb = "clears" if f.clears else "does not clear"
            log.info("data pipe for %s: %s: loader %s img/s %s compute %s", S.describe(k.params),
                     S.describe(f.params), format(f.rate), verb, format(k.rate))
        return f

    def _join(self, kept: list[Kept], fed: list[Fed | None]) -> None:
        shared = self.open_study(f"{self.name}-join")
        space = fixed_space(self.space, {}, self.plan.join_overrides)
        pairs = [(k, f) for k, f in zip(kept, fed, strict=True) if f is not None]
        joined: list[dict] = []
        rows: list[tuple[dict, Row]] = []
        tried = 0
        while pairs:
            for k, f in pairs:
                shared.study.enqueue_trial({**k.params, **f.params}, skip_if_exists=True)
            tried += len(pairs)
            self.search(shared, space, tried, Stage.join, confirm=replace(self.confirm, top=0)).run()
            # confirm rounds only where one measurement each leaves the answer open
            rows = _rows(shared)
            top = confirm_top([r for _, r in rows], TOLERANCE)
            # a resume after a kill mid-rounds: the rounds queued then, measured now
            if top or S.rounds_left(shared):
                self.search(shared, space, tried, Stage.join,
                            confirm=replace(self.confirm, top=max(top, 1))).run()
                rows = _rows(shared)  # pooled with the rounds
            by_key = {S.key(p): r for p, r in rows}
            nxt = []
            for k, f in pairs:
                row = by_key.get(S.key({**k.params, **f.params}))
                e2e = rate_of(row) if row is not None else None
                # the workers it ran with: the data study's params hold them only where swept
                workers = _workers(row) if row is not None else int(
                    f.params.get("loader.num_workers") or 0)
                name, narrower = join_bound(k.rate, f.rate, workers)
                short = e2e is not None and contends(e2e, narrower, TOLERANCE)
                joined.append({"compute": k.params, "data": f.params, "narrower": name,
                               "e2e": None if e2e is None else list(astuple(e2e)),
                               "bound": list(astuple(narrower)), "contends": short})
                if short and tried < self.plan.join_trials:
                    log.info("join: %s falls short of both pipes (%s img/s against %s): the "
                             "pipes contend; trying the next data setting",
                             S.describe({**k.params, **f.params}), format(e2e), format(narrower))
                    alt = self._data(k, past=f.params)
                    if alt is not None and alt.clears:
                        nxt.append((k, alt))
            pairs = nxt[: max(self.plan.join_trials - tried, 0)]
        # the rows and rule the join's Search writes sweep.json's `best` by (loop._summarize)
        rec = recommend(training_rows([r for _, r in rows])[0])
        self.result["join"] = {"study": shared.study.study_name, "pairings": joined}
        if rec is not None:  # the report's rule: the smallest batch, fewest workers near the best
            params = next(p for p, r in rows if r is rec.chosen)
            self.result["recommended"] = {
                "params": params, "e2e": [rec.chosen.throughput, *rec.chosen.interval],
                "confirmed": rec.chosen.confirmed, "dir": rec.chosen.dir}


def _rows(shared: S.Shared) -> list[tuple[dict, Row]]:
    return [(dict(t.params), r) for t, r in trial_rows(shared.study, shared.storage)]


# ------------------------------------------------ the rules (scripts/bench_pipes.py replays them)


def check_space(space: SearchSpace, data_keys: Sequence[str]) -> tuple[SearchSpace, ...]:
    """The (compute, data) split; ConfigError: a pipe without a swept key, a continuous data key."""
    space.require_swept()
    compute, data = (SearchSpace([p for p in space.params if (p.name in data_keys) is side],
                                 list(space.fixed), space.resolved) for side in (False, True))
    names = [p.name for p in space.params]
    if not compute.params or not data.params:
        missing = "compute" if not compute.params else "data"
        raise ConfigError("hydra.sweeper.params", names,
                          f"swept keys of both pipes: none is a {missing} knob (data knobs: "
                          f"hydra.sweeper.pipes.data_keys = {list(data_keys)})")
    if points(data.params) is None:
        raise ConfigError("hydra.sweeper.params", names,
                          "data keys as choice(...) or range(...), not interval(...), with "
                          "sweep=pipes (its data pipe walks them in cost order)")
    return compute, data


def cost(params: dict[str, Any], space: list[Param]) -> tuple:
    """A data setting's cost rank: CHEAP_FIRST's keys first, others by their choice's position."""
    choices = {p.name: list(getattr(p.dist, "choices", ())) for p in space}
    return (*(_rank(CHEAP_FIRST[k], params[k]) for k in CHEAP_FIRST if k in params),
            *(choices[k].index(v) if v in choices[k] else 0 for k, v in sorted(params.items())
              if k not in CHEAP_FIRST and k in choices))


def _rank(fn: Callable[[Any], Any], v: Any) -> tuple:
    try:
        return (0, fn(v))
    except TypeError:  # a value of another type than the key's (a string for a number)
        return (1, str(v))


def fixed_space(space: SearchSpace, values: dict[str, Any], extra: list[str]) -> SearchSpace:
    """`space` with `values` (another pipe's setting) and `extra` fixed on every job."""
    named = {p.name: p for p in space.params}
    pinned = [named[k].override(v) if k in named else f"{k}={v}" for k, v in values.items()]
    return SearchSpace([p for p in space.params if p.name not in values],
                       [*space.fixed, *pinned, *extra], space.resolved)


def rate_of(row: Row) -> Est | None:
    """A row's throughput with its interval (pooled over its confirm step once re-measured)."""
    measured = row.feasible and row.record.status.measured
    return Est.of(row.throughput, list(row.interval)) if measured else None


@dataclass
class Kept:  # a compute setting kept for the data pipe, with its bound and why it was kept
    params: dict[str, Any]
    rate: Est
    why: str
    peak: float | None = None

    def summary(self) -> dict:
        return {"params": self.params, "rate": list(astuple(self.rate)), "why": self.why,
                "peak_memory_fraction": self.peak}


def keep_compute(rows: list[tuple[dict, Row]], batch_key: str, tolerance: float,
                 keep: int) -> list[Kept]:
    """The fastest feasible compute setting, the smallest batch within `tolerance` of it (the
    knee: as fast, with less memory), then the next fastest, up to `keep`."""
    rated = sorted(((p, r, x) for p, r in rows if (x := rate_of(r)) is not None),
                   key=lambda t: -t[2].value)  # stable: of equal figures, the first measured
    if not rated:
        return []
    best_p, best_r, best = rated[0]
    out = [Kept(best_p, best, "the fastest compute setting", best_r.peak)]
    # within `tolerance` as the recommendation judges it (recommend.recommend): even at the low
    # end of its interval, so pipes.json's "within 5%" is the report's
    near = [(p, r, x) for p, r, x in rated if x is best or x.lo >= best.value * (1 - tolerance)]
    if batch_key in best_p:
        knee_p, knee_r, knee = min(near, key=lambda t: (t[0].get(batch_key, 0), -t[2].value))
        if knee_p != best_p and keep > 1:
            out.append(Kept(knee_p, knee, f"the smallest batch within {tolerance:.0%} of the "
                                          "fastest", knee_r.peak))
    for p, r, x in rated[1:]:  # more, when asked for more
        if len(out) < keep and all(p != k.params for k in out):
            out.append(Kept(p, x, "the next fastest", r.peak))
    return out


@dataclass
class Fed:  # a data setting chosen to feed one kept compute setting
    params: dict[str, Any]
    rate: Est
    feeds: Feeds  # its interval against the bound's (workers.feeds, the workers answer's rule)
    bound: Est
    # not clearing, with the most workers tried and loading fastest: more may load faster still
    more_from: int | None = None

    @property
    def clears(self) -> bool:
        return self.feeds is Feeds.clears

    def summary(self) -> dict:
        return {"params": self.params, "rate": list(astuple(self.rate)), "clears": self.clears,
                "feeds": self.feeds.value, "more_from": self.more_from,
                "margin": [x - 1 for x in astuple(self.rate.over(self.bound))]}


def choose_data(rows: list[tuple[dict, Row]], space: list[Param], bound: Est,
                margin: float, after: tuple | None = None) -> Fed | None:
    """The cheapest measured data setting whose loader interval clears `bound` by `margin`
    (above `after` in cost, when given); else the fastest loader (clears False)."""
    rated = sorted(((cost(p, space), p, x, r) for p, r in rows
                    if (x := rate_of(r)) is not None), key=lambda t: t[0])
    for c, p, x, _ in rated:
        if (after is None or c > after) and clears(x, bound, margin):
            return Fed(p, x, Feeds.clears, bound)
    if after is not None or not rated:
        return None
    _, p, x, r = max(rated, key=lambda t: t[2].value)
    # the workers answer's rule (WorkersPick._next), within this data setting alone:
    # where the fastest loader has the most workers its other keys were measured with
    n = _workers(r)
    alike = [_workers(q) for _, o, _, q in rated if _others(o) == _others(p)]
    return Fed(p, x, feeds(x, bound, margin), bound, n if n >= max(alike) else None)


def _workers(r: Row) -> int:
    return int(r.flat.get("loader.num_workers") or 0)


def _others(params: dict) -> dict:
    return {k: v for k, v in params.items() if k != "loader.num_workers"}


def data_walk(points: list[dict], space: list[Param], rows: list[tuple[dict, Row]],
              bound: Est, margin: float) -> list[dict]:
    """The data points to measure next (none: done), to find the cheapest clearing setting in a
    few trials: 1. each worker count, other keys at their cheapest, fewest first, up to the first
    that clears `bound`; 2. one other key turned, cheapest first, at a worker fewer than that (at
    the most when none cleared), until a turn clears or all are measured."""
    done = {S.key(p): r for p, r in rows}
    workers = sorted({p.get("loader.num_workers", 0) for p in points})

    def base(w: int) -> dict:
        return min((p for p in points if p.get("loader.num_workers", 0) == w),
                   key=lambda p: cost(p, space))

    def ok(p: dict) -> bool:
        x = rate_of(r) if (r := done.get(S.key(p))) is not None else None
        return x is not None and clears(x, bound, margin)

    for i, w in enumerate(workers):
        b = base(w)
        if S.key(b) not in done:
            return [b]
        if ok(b):
            if i == 0:
                return []  # the fewest workers at the cheapest setting: nothing is cheaper
            at = workers[i - 1]
            break
    else:
        at = workers[-1]
    b = base(at)
    turns = sorted((p for p in points if p.get("loader.num_workers", 0) == at
                    and sum(p[key] != b[key] for key in b) == 1), key=lambda p: cost(p, space))
    if any(ok(p) for p in turns):
        return []
    return [p for p in turns if S.key(p) not in done]


def join_bound(compute: Est, loader: Est, workers: int) -> tuple[Narrower, Est]:
    """What a pairing's e2e can reach, named (Narrower): the narrower pipe (workers overlap
    them), or with 0 workers the serial bound (each batch loaded between two steps)."""
    if workers:
        return min(((Narrower.compute, compute), (Narrower.data, loader)),
                   key=lambda t: t[1].value)
    return Narrower.serial, serial_bound(compute, Est(1.0, 1.0, 1.0).over(loader))  # s/image


def contends(e2e: Est, bound: Est, tolerance: float) -> bool:
    """Even the e2e's high end is below the bound's low end by more than `tolerance` (hand-over)."""
    return e2e.hi < bound.lo * (1 - tolerance)


def confirm_top(rows: list[Row], tolerance: float) -> int:
    """How many pairings, fastest first, the join's confirm rounds re-measure: down to the last
    whose interval reaches the leader's while its median is more than `tolerance` below (within
    it, either is an answer); an unstable leader is re-measured too."""
    ranked = sorted((r for r in rows if rate_of(r) is not None),
                    key=lambda r: r.throughput, reverse=True)
    if not ranked:
        return 0
    lead = ranked[0]
    open_ = [i + 1 for i, r in enumerate(ranked) if r.interval[1] >= lead.interval[0]
             and r.throughput < (1 - tolerance) * lead.throughput]
    return max([0 if lead.stable else 1, *open_])


def effective(points: list[dict], fixed: dict | None = None) -> list[dict]:
    """The data points that differ as runs (search.space.key, with the search's `fixed` values:
    one 0-worker point per setting, one pin_memory setting on a CPU)."""
    first: dict[str, dict] = {}
    for p in points:
        first.setdefault(S.key(p, fixed), p)
    return list(first.values())


def _setting(params: dict[str, Any]) -> str:
    """`num_workers=0 pin_memory=true`: the keys that act in it (knobs.acts), as shown."""
    return " ".join(knob_setting(k, v) for k, v in params.items()
                    if acts(k, params.get)) or "as composed"


def lines(result: dict) -> list[str]:
    """The path the search took, in a few lines (the sweeper's log, the report)."""
    out = []
    if c := result.get("compute"):
        how = "every setting" if c.get("exhaustive") else "sampled"
        out.append(f"compute pipe: {count(c['trials'], 'compute-only trial')}, {how}")
        for k in c["kept"]:
            peak = k.get("peak_memory_fraction")
            mem = f", peak memory {peak:.0%}" if isinstance(peak, (int, float)) else ""
            out.append(f"  kept {_setting(k['params'])}: {Est(*k['rate'])} img/s{mem} "
                       f"({k['why']})")
    for d in result.get("data", []):
        r, margin = Est(*d["rate"]), Est(*d["margin"])
        share = Est(*(x + 1 for x in astuple(margin)))  # of compute
        # a pipes.json written before it kept `feeds`: its clears flag and margin (loader /
        # compute - 1, of the extremes: < 0 at its high end, each loader figure is below compute's)
        how = Feeds.read(d.get("feeds")) or (Feeds.clears if d["clears"] else Feeds.short
                                             if margin.hi < 0 else Feeds.open)
        if how is Feeds.clears:
            verdict = f"clears compute {clears_by(margin)}, the cheapest setting that does"
        elif how is Feeds.short:
            verdict = (f"= {share:.0%} of compute: the data side stays the narrower pipe (next: "
                       f"{next_steps(d.get('device'), d.get('more_from'), d.get('tried', ()), d.get('cores'))})")
        else:
            verdict = f"= {share:.0%} of compute: {undecided()}"
        out.append(f"data pipe for {_setting(d['for'])}: "
                   f"{count(d['trials'], 'loader-only trial')}; "
                   f"{_setting(d['params'])}: {r} img/s {verdict}")
    for p in (result.get("join") or {}).get("pairings", []):
        pairing = f"join {_setting({**p['compute'], **p['data']})}"
        if p["e2e"] is None:
            out.append(f"{pairing}: not measured")
            continue
        e, b = Est(*p["e2e"]), Est(*p["bound"])
        tail = ": the pipes contend (both fall short together)" if p["contends"] else ""
        what = ("the serial bound (0 workers: load, then step)"
                if p["narrower"] == Narrower.serial else "the narrower pipe")
        out.append(f"{pairing}: e2e {e} img/s, {e.over(b).value:.0%} of {what} "
                   f"({p['narrower']} {b}){tail}")
    if w := result.get("wall_s"):
        out.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in w.items()))
    return out
