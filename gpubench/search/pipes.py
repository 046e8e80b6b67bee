"""`sweep=pipes`: search each pipe on its own, then join them (docs/sweeps.md).

A training step is two pipes, and each can be measured without the other (reference article
003: measure the loader, then the model, then fix the narrower one):

1. compute pipe: compute-only trials (`bench.phases=[compute]`) over the compute knobs (every
   swept key that is not a data key), under memory.ceiling: every setting when the space is
   within `compute_trials`, else Optuna's sampler. Kept: the fastest setting, and the smallest
   batch within the tolerance of it (the knee), each with its compute interval: the bound.
2. data pipe: for each kept setting, loader-only trials over the data keys at that setting,
   cheapest first (fewest workers, then no preload, then CPU decode and augment, ...), until
   the cheapest setting whose loader interval clears the bound by the margin is found (low end
   above the bound's high end x (1 + margin), as the workers answer judges), or the budget ends
   (then the fastest loader: the data side stays the narrower pipe, and the path says so).
3. join: each pairing measured end to end, then again in interleaved rounds (the confirm
   step). A pairing whose e2e falls short of both pipes (its interval's high end below the
   narrower pipe's low end by more than the tolerance) shows the pipes contend (loader
   workers taking the host's cores, pinned memory): the next clearing data setting is tried,
   within `join_trials`.

Each stage is a gpubench.search.loop.Search on a study of its own in the sweep's storage
(`<study>-compute`, `<study>-data-<setting>`, `<study>-join`), so resume after a kill,
heartbeats, several workers and the failure budget work in each as in any sweep. A stage's
points are queued in the study (skip_if_exists), so a resumed or second worker finds them
queued or measured, in the same order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpubench.analysis.recommend import TOLERANCE, Row, recommend
from gpubench.analysis.workers import WORKERS_TOLERANCE, Rate, clears
from gpubench.search import study as S
from gpubench.search.loop import Confirm, Search
from gpubench.search.manifest import PIPES_FILE  # noqa: F401 (where the sweeper writes it)
from gpubench.search.space import Param, SearchSpace

log = logging.getLogger("gpubench.sweep")

# the data keys' cost order: a setting is cheaper than another when it is lower on the first of
# these keys where they differ (fewer workers, then no preload, then CPU decode, ...): each
# step down costs the host less RAM, fewer processes or less device work. Values by this rank;
# a key not listed ranks after these, by its choice's position.
CHEAP_FIRST: dict[str, Callable[[Any], Any]] = {
    "loader.num_workers": lambda v: v,
    "dataset.preload": lambda v: bool(v),
    "dataset.decode_on": lambda v: v != "cpu",
    "dataset.augment_on": lambda v: v != "cpu",
    "loader.prefetch_factor": lambda v: -1 if v is None else v,
    "loader.persistent_workers": lambda v: bool(v),
    "loader.pin_memory": lambda v: bool(v),
}


@dataclass
class Plan:
    """The pipes settings (hydra.sweeper.pipes.*), as the search reads them."""

    data_keys: tuple[str, ...]
    compute_trials: int
    keep: int
    data_trials: int
    join_trials: int
    compute_overrides: list[str]
    data_overrides: list[str]
    join_overrides: list[str] = field(default_factory=list)
    tolerance: float = TOLERANCE  # the knee: the smallest batch within this of the fastest
    margin: float = WORKERS_TOLERANCE  # a loader clears a bound by this


def split(space: SearchSpace, data_keys: tuple[str, ...]) -> tuple[SearchSpace, SearchSpace]:
    """(compute knobs, data knobs): the swept keys named in data_keys are the data pipe's."""
    data = [p for p in space.params if p.name in data_keys]
    compute = [p for p in space.params if p.name not in data_keys]
    return SearchSpace(compute, list(space.fixed)), SearchSpace(data, list(space.fixed))


def grid(params: list[Param]) -> list[dict[str, Any]] | None:
    """Every point of a space of choices and integer ranges, in the order written; None when a
    key is continuous."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    axes = []
    for p in params:
        d = p.dist
        if isinstance(d, CategoricalDistribution):
            axes.append(list(d.choices))
        elif isinstance(d, IntDistribution) and not d.log:
            axes.append(list(range(d.low, d.high + 1, d.step)))
        else:
            return None
    return [dict(zip([p.name for p in params], pt, strict=True)) for pt in itertools.product(*axes)]


def cost(params: dict[str, Any], space: list[Param]) -> tuple:
    """A data setting's cost rank (CHEAP_FIRST; other keys by their choice's position)."""
    order = {p.name: p for p in space}
    head = tuple(_rank(CHEAP_FIRST[k], params[k]) for k in CHEAP_FIRST if k in params)
    rest = tuple(_position(order[k], v) for k, v in sorted(params.items())
                 if k not in CHEAP_FIRST and k in order)
    return head + rest


def _rank(fn: Callable[[Any], Any], v: Any) -> tuple:
    try:
        return (0, fn(v))
    except TypeError:  # a value of another type than the key's (a string for a number)
        return (1, str(v))


def _position(p: Param, v: Any) -> int:
    choices = getattr(p.dist, "choices", None)
    return list(choices).index(v) if choices is not None and v in choices else 0


def fixed_space(space: SearchSpace, values: dict[str, Any], extra: list[str]) -> SearchSpace:
    """`space` with `values` (another pipe's setting) and `extra` fixed on every job."""
    named = {p.name: p for p in space.params}
    pinned = [named[k].override(v) if k in named else f"{k}={v}" for k, v in values.items()]
    return SearchSpace([p for p in space.params if p.name not in values],
                       [*space.fixed, *pinned, *extra])


def short_hash(values: dict[str, Any]) -> str:
    return hashlib.sha1(S.key(values).encode()).hexdigest()[:8]


# ---------------------------------------------------------------------- judgements


def rate_of(row: Row) -> Rate | None:
    """A row's throughput with its interval (pooled over its confirm step once re-measured)."""
    if not (row.feasible and row.record.status.measured):
        return None
    return Rate.of(row.throughput, list(row.interval))


@dataclass
class Kept:
    """A compute setting kept for the data pipe: its params, its bound and why it was kept."""

    params: dict[str, Any]
    rate: Rate
    why: str
    peak: float | None = None

    def summary(self) -> dict:
        return {"params": self.params, "rate": [self.rate.value, self.rate.lo, self.rate.hi],
                "why": self.why, "peak_memory_fraction": self.peak}


def keep_compute(rows: list[tuple[dict, Row]], batch_key: str, tolerance: float,
                 keep: int) -> list[Kept]:
    """The fastest feasible compute setting, and the smallest batch whose figure is within
    `tolerance` of it (the knee: as fast, with less memory and a smaller step), up to `keep`."""
    rated = [(p, r, rate_of(r)) for p, r in rows]
    rated = [(p, r, x) for p, r, x in rated if x is not None]
    if not rated:
        return []
    best_p, best_r, best = max(rated, key=lambda t: t[2].value)
    out = [Kept(best_p, best, "the fastest compute setting", best_r.peak)]
    near = [(p, r, x) for p, r, x in rated if x.value >= best.value * (1 - tolerance)]
    if batch_key in best_p:
        knee_p, knee_r, knee = min(near, key=lambda t: (t[0].get(batch_key, 0), -t[2].value))
        if knee_p != best_p and keep > 1:
            out.append(Kept(knee_p, knee, f"the smallest batch within {tolerance:.0%} of the "
                                          "fastest", knee_r.peak))
    for p, r, x in sorted(rated, key=lambda t: -t[2].value):  # more, when asked for more
        if len(out) >= keep:
            break
        if all(p != k.params for k in out):
            out.append(Kept(p, x, "the next fastest", r.peak))
    return out[:max(keep, 1)]


@dataclass
class Fed:
    """A data setting chosen to feed one kept compute setting."""

    params: dict[str, Any]
    rate: Rate
    clears: bool
    bound: Rate
    margin: float

    def summary(self) -> dict:
        c, r = self.bound, self.rate
        return {"params": self.params, "rate": [r.value, r.lo, r.hi], "clears": self.clears,
                "margin": [r.value / c.value - 1, r.lo / c.hi - 1, r.hi / c.lo - 1]}


def choose_data(rows: list[tuple[dict, Row]], space: list[Param], bound: Rate,
                margin: float, after: tuple | None = None) -> Fed | None:
    """The cheapest measured data setting whose loader interval clears `bound` by `margin`
    (above `after` in cost, when given); else the fastest loader (clears False)."""
    rated = [(cost(p, space), p, rate_of(r)) for p, r in rows]
    rated = sorted([t for t in rated if t[2] is not None], key=lambda t: t[0])
    for c, p, x in rated:
        if (after is None or c > after) and clears(x, bound, margin):
            return Fed(p, x, True, bound, margin)
    if after is not None or not rated:
        return None
    _, p, x = max(rated, key=lambda t: t[2].value)
    return Fed(p, x, False, bound, margin)


def data_walk(points: list[dict], space: list[Param], rows: list[tuple[dict, Row]],
              bound: Rate, margin: float) -> list[dict]:
    """The data points to measure next, in order, given the measured `rows` (empty: done).

    1. The workers walk: each worker count with every other data key at its cheapest value,
       fewest workers first, one at a time, up to the first whose interval clears `bound`.
    2. Then the turns: settings with one other key turned (preload, prefetch, pinning, ...),
       cheapest first, at the next fewer worker count when one cleared (a worker fewer may
       clear with a cheaper key turned), at the most workers when none did (a turned key may
       be what clears). The walk is done when a turn clears or every turn is measured.
    The data keys' cost order (CHEAP_FIRST) makes this the cheapest clearing setting along
    these lines, in a few trials where the whole data space has many."""
    done = {S.key(p): r for p, r in rows}
    workers = sorted({p.get("loader.num_workers", 0) for p in points})

    def base(w: int) -> dict:
        return min((p for p in points if p.get("loader.num_workers", 0) == w),
                   key=lambda p: cost(p, space))

    def ok(p: dict) -> bool:
        r = done.get(S.key(p))
        x = rate_of(r) if r is not None else None
        return x is not None and clears(x, bound, margin)

    cleared_at = None
    for w in workers:
        b = base(w)
        if S.key(b) not in done:
            return [b]
        if ok(b):
            cleared_at = w
            break
    if cleared_at is None:
        at = workers[-1]
    elif cleared_at == workers[0]:
        return []  # the fewest workers at the cheapest setting: nothing is cheaper
    else:
        at = workers[workers.index(cleared_at) - 1]
    b = base(at)
    turns = sorted((p for p in points if p.get("loader.num_workers", 0) == at
                    and sum(p[key] != b[key] for key in b) == 1), key=lambda p: cost(p, space))
    if any(ok(p) for p in turns):
        return []
    return [p for p in turns if S.key(p) not in done]


def contends(e2e: Rate, narrower: Rate, tolerance: float) -> bool:
    """The joined run falls short of both pipes: even its interval's high end is below the
    narrower pipe's low end by more than `tolerance` (the hand-over alone costs a little)."""
    return e2e.hi < narrower.lo * (1 - tolerance)


# ---------------------------------------------------------------------- the search


@dataclass
class Pipes:
    plan: Plan
    space: SearchSpace
    name: str  # the sweep's study name: each stage's study is named after it
    open_study: Callable[[str], S.Shared]
    # a Search on a shared study, a space and a budget (the sweeper's jobs, manifest, workers)
    search: Callable[..., Search]
    confirm: Confirm
    write: Callable[[dict], None]  # where the path goes (pipes.json and sweep.json)
    result: dict = field(default_factory=dict)
    # seconds each stage took in earlier invocations of this sweep (a resume adds to them)
    earlier: dict = field(default_factory=dict)

    def _spent(self, stage: str, since: float) -> None:
        wall = self.result.setdefault("wall_s", {})
        wall[stage] = round(float(self.earlier.get(stage, 0.0)) + time.monotonic() - since, 1)

    def run(self) -> dict:
        self.space.require_swept()
        compute, data = split(self.space, self.plan.data_keys)
        if not compute.params or not data.params:
            from gpubench.config.errors import ConfigError

            missing = "compute" if not compute.params else "data"
            raise ConfigError("hydra.sweeper.params", [p.name for p in self.space.params],
                              f"swept keys of both pipes: none is a {missing} knob (data knobs: "
                              f"hydra.sweeper.pipes.data_keys = {list(self.plan.data_keys)})")
        t0 = time.monotonic()
        kept = self._compute(compute)
        self._spent("compute", t0)
        if not kept:
            log.warning("no compute setting ran under the memory ceiling: nothing to feed")
            self.write(self.result)
            return self.result
        t1 = time.monotonic()
        fed = [self._data(data, k) for k in kept]
        self._spent("data", t1)
        t2 = time.monotonic()
        self._join(data, kept, fed)
        self._spent("join", t2)
        self.write(self.result)
        for line in lines(self.result):
            log.info("%s", line)
        return self.result

    # ---------------------------------------------------------------- 1. compute pipe

    def _compute(self, compute: SearchSpace) -> list[Kept]:
        space = fixed_space(compute, {}, self.plan.compute_overrides)
        shared = self.open_study(f"{self.name}-compute")
        points = grid(space.params)
        exhaustive = points is not None and len(points) <= self.plan.compute_trials
        if exhaustive:
            # every setting, smallest batch first: a study's queue is kept across workers
            for p in sorted(points, key=lambda p: _batch_first(p)):
                _enqueue(shared, p)
        n = len(points) if exhaustive else self.plan.compute_trials
        self.search(shared, space, n, "compute").run()
        rows = _rows(shared)
        kept = keep_compute(rows, "loader.batch_size", self.plan.tolerance, self.plan.keep)
        self.result["compute"] = {
            "study": shared.study.study_name, "trials": len(rows), "space": len(points or []) or
            None, "exhaustive": exhaustive, "kept": [k.summary() for k in kept]}
        self.write(self.result)
        for k in kept:
            log.info("compute pipe: %s: %s img/s, %s", S.describe(k.params), k.rate.text(), k.why)
        return kept

    # ---------------------------------------------------------------- 2. data pipe

    def _data_study(self, k: Kept) -> tuple[S.Shared, SearchSpace, list[dict]]:
        """The data pipe's study for kept setting k, its space, and its points cheapest first."""
        _, data = split(self.space, self.plan.data_keys)
        space = fixed_space(data, k.params, self.plan.data_overrides)
        shared = self.open_study(f"{self.name}-data-{short_hash(k.params)}")
        points = grid(space.params)
        if points is None:
            from gpubench.config.errors import ConfigError

            raise ConfigError("hydra.sweeper.params", [p.name for p in space.params],
                              "data keys as choice(...) or integer range(...) with sweep=pipes "
                              "(its data pipe walks them in cost order)")
        points = sorted(_effective(points), key=lambda p: cost(p, space.params))
        return shared, space, points

    def _measure(self, shared: S.Shared, space: SearchSpace, todo: list[dict],
                 stop: Callable[[], bool]) -> None:
        """Measure `todo` (queued in this order) within the data budget, until `stop`."""
        done = len(_rows(shared))
        todo = todo[: max(self.plan.data_trials - done, 0)]
        if not todo:
            return
        for p in todo:
            _enqueue(shared, p)
        self.search(shared, space, done + len(todo), "data", stop=stop).run()

    def _data(self, _data: SearchSpace, k: Kept, after: tuple | None = None) -> Fed | None:
        shared, space, points = self._data_study(k)
        params = space.params

        def fed() -> Fed | None:
            return choose_data(_rows(shared), params, k.rate, self.plan.margin, after)

        def walked() -> bool:  # stop: the walk has found what it looks for
            return not data_walk(points, params, _rows(shared), k.rate, self.plan.margin)

        if after is not None:  # the join's next try: the next setting past the chosen one
            measured = {S.key(p) for p, _ in _rows(shared)}
            nxt = [p for p in points if cost(p, params) > after and S.key(p) not in measured]
            self._measure(shared, space, nxt[:1], lambda: False)
            return fed()
        while True:
            rows = _rows(shared)
            todo = data_walk(points, params, rows, k.rate, self.plan.margin)
            if not todo or len(rows) >= self.plan.data_trials:
                break
            before = len(rows)
            self._measure(shared, space, todo, walked)
            if len(_rows(shared)) == before:  # nothing more could be measured (failures)
                break
        rows = _rows(shared)
        f = fed()
        if f is not None:
            self.result.setdefault("data", []).append(
                {"for": k.params, "study": shared.study.study_name, "trials": len(rows),
                 **f.summary()})
            self.write(self.result)
            verb = "clears" if f.clears else "does not clear"
            log.info("data pipe for %s: %s: loader %s img/s %s compute %s", S.describe(k.params),
                     S.describe(f.params), f.rate.text(), verb, k.rate.text())
        return f

    # ---------------------------------------------------------------- 3. join

    def _join(self, data: SearchSpace, kept: list[Kept], fed: list[Fed | None]) -> None:
        shared = self.open_study(f"{self.name}-join")
        space = fixed_space(self.space, {}, self.plan.join_overrides)
        pairs = [(k, f) for k, f in zip(kept, fed, strict=True) if f is not None]
        joined: list[dict] = []
        tried = 0
        while pairs:
            for k, f in pairs:
                _enqueue(shared, {**k.params, **f.params})
            tried += len(pairs)
            self.search(shared, space, tried, "join",
                        confirm=replace(self.confirm, top=tried)).run()
            by_key = {S.key(p): r for p, r in _rows(shared)}
            nxt = []
            for k, f in pairs:
                row = by_key.get(S.key({**k.params, **f.params}))
                e2e = rate_of(row) if row is not None else None
                narrower = min((k.rate, f.rate), key=lambda r: r.value)
                short = e2e is not None and contends(e2e, narrower, self.plan.tolerance)
                joined.append({"compute": k.params, "data": f.params,
                               "e2e": None if e2e is None else [e2e.value, e2e.lo, e2e.hi],
                               "narrower": "compute" if narrower is k.rate else "data",
                               "bound": [narrower.value, narrower.lo, narrower.hi],
                               "contends": short})
                if short and tried < self.plan.join_trials:
                    log.info("join: %s falls short of both pipes (%s img/s against %s): the "
                             "pipes contend; trying the next data setting",
                             S.describe({**k.params, **f.params}), e2e.text(), narrower.text())
                    alt = self._data(data, k, after=cost(f.params, self._data_study(k)[1].params))
                    if alt is not None and alt.clears:
                        nxt.append((k, alt))
            pairs = nxt[: max(self.plan.join_trials - tried, 0)]
        best = recommend([r for _, r in _rows(shared)])
        self.result["join"] = {"study": shared.study.study_name, "pairings": joined}
        if best is not None:
            self.result["best"] = {"params": best.best.flat and {
                k: best.best.flat.get(k) for k in (p.name for p in self.space.params)},
                "e2e": [best.best.throughput, *best.best.interval],
                "confirmed": best.best.confirmed, "dir": best.best.dir}


def _enqueue(shared: S.Shared, params: dict) -> None:
    """Queue a point unless the study holds it already (queued, running or measured: a resumed
    or second worker queues nothing twice)."""
    held = {S.key(t.params or t.system_attrs.get("fixed_params") or {})
            for t in shared.study.get_trials(deepcopy=False)}  # a queued trial's are fixed_params
    if S.key(params) not in held:
        shared.study.enqueue_trial(params)


def _effective(points: list[dict]) -> list[dict]:
    """The data points that differ as runs: with 0 workers the worker-only keys are inert
    (gpubench.config.settings.WORKER_ONLY), so one 0-worker point per other setting."""
    from gpubench.config.settings import WORKER_ONLY

    inert = {f"loader.{k}" for k in WORKER_ONLY}
    out, seen = [], set()
    for p in points:
        as_run = {k: (None if k in inert and p.get("loader.num_workers") == 0 else v)
                  for k, v in p.items()}
        if S.key(as_run) not in seen:
            seen.add(S.key(as_run))
            out.append(p)
    return out


def _batch_first(p: dict) -> tuple:
    return (p.get("loader.batch_size", 0), json.dumps(p, sort_keys=True, default=str))


def _rows(shared: S.Shared) -> list[tuple[dict, Row]]:
    """(params, row) of every measured trial of a stage's study."""
    from gpubench.search.rows import rows_of_study

    measured = {str(t.number): dict(t.params) for t in S.measured_trials(shared.study)}
    return [(measured[r.label], r) for r in rows_of_study(shared.study) if r.label in measured]


def _setting(params: dict[str, Any]) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in params.items()) or "as composed"


def lines(result: dict) -> list[str]:
    """The path the search took, in a few lines (the sweeper's log, the report)."""
    out = []
    c = result.get("compute")
    if c:
        how = "every setting" if c.get("exhaustive") else "sampled"
        out.append(f"compute pipe: {c['trials']} compute-only trial(s), {how}")
        for k in c["kept"]:
            peak = k.get("peak_memory_fraction")
            mem = f", peak memory {peak:.0%}" if isinstance(peak, (int, float)) else ""
            out.append(f"  kept {_setting(k['params'])}: {Rate(*k['rate']).text()} img/s{mem} "
                       f"({k['why']})")
    for d in result.get("data", []):
        r, m = Rate(*d["rate"]), d["margin"]
        if d["clears"]:
            verdict = (f"clears compute by {m[0]:.0%} [{m[1]:.0%}-{m[2]:.0%}], the cheapest "
                       "setting that does")
        else:
            verdict = ("clears no kept bound: the data side stays the narrower pipe (next: "
                       "dataset.preload=true, dataset.augment_on=device, more CPU cores)")
        out.append(f"data pipe for {_setting(d['for'])}: {d['trials']} loader-only trial(s); "
                   f"{_setting(d['params'])}: {r.text()} img/s {verdict}")
    j = result.get("join")
    if j:
        for p in j["pairings"]:
            if p["e2e"] is None:
                out.append(f"join {_setting({**p['compute'], **p['data']})}: not measured")
                continue
            e, b = Rate(*p["e2e"]), Rate(*p["bound"])
            share = e.value / b.value
            tail = (": the pipes contend (both fall short together)" if p["contends"] else "")
            out.append(f"join {_setting({**p['compute'], **p['data']})}: e2e {e.text()} img/s, "
                       f"{share:.0%} of the narrower pipe ({p['narrower']} {b.text()}){tail}")
    w = result.get("wall_s")
    if w:
        out.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in w.items()))
    return out
