"""The rules of sweep=pipes (gpubench.search.pipes) as pure functions of search spaces and rows
(scripts/bench_pipes.py replays them over tables)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpubench.analysis.recommend import Row
from gpubench.analysis.workers import clears, clears_by
from gpubench.config.knobs import CHEAP_FIRST
from gpubench.core.pipe import serial_rate
from gpubench.core.stats import Est
from gpubench.search import study as S
from gpubench.search.space import Param, SearchSpace


def split(space: SearchSpace, data_keys: tuple[str, ...]) -> tuple[SearchSpace, SearchSpace]:
    """(compute knobs, data knobs)."""
    data = [p for p in space.params if p.name in data_keys]
    compute = [p for p in space.params if p.name not in data_keys]
    return SearchSpace(compute, list(space.fixed)), SearchSpace(data, list(space.fixed))


def check_space(space: SearchSpace, data_keys: tuple[str, ...]) -> tuple[SearchSpace,
                                                                         SearchSpace]:
    """The (compute, data) split; ConfigError when a pipe has no swept key, or a data key is
    continuous (the data pipe walks a grid)."""
    from gpubench.config.errors import ConfigError

    space.require_swept()
    compute, data = split(space, data_keys)
    names = [p.name for p in space.params]
    if not compute.params or not data.params:
        missing = "compute" if not compute.params else "data"
        raise ConfigError("hydra.sweeper.params", names,
                          f"swept keys of both pipes: none is a {missing} knob (data knobs: "
                          f"hydra.sweeper.pipes.data_keys = {list(data_keys)})")
    if grid(data.params) is None:
        raise ConfigError("hydra.sweeper.params", names,
                          "data keys as choice(...) or integer range(...) with sweep=pipes "
                          "(its data pipe walks them in cost order)")
    return compute, data


def grid(params: list[Param]) -> list[dict[str, Any]] | None:
    """Every point of a space of choices and integer ranges; None when a key is continuous."""
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
    """A data setting's cost rank: CHEAP_FIRST's keys first (fewer workers, then no preload,
    ...), other keys by their choice's position."""
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


def rate_of(row: Row) -> Est | None:
    """A row's throughput with its interval (pooled over its confirm step once re-measured)."""
    if not (row.feasible and row.record.status.measured):
        return None
    return Est.of(row.throughput, list(row.interval))


@dataclass
class Kept:
    """A compute setting kept for the data pipe, with its bound and why it was kept."""

    params: dict[str, Any]
    rate: Est
    why: str
    peak: float | None = None

    def summary(self) -> dict:
        return {"params": self.params, "rate": [self.rate.value, self.rate.lo, self.rate.hi],
                "why": self.why, "peak_memory_fraction": self.peak}


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
    near = [(p, r, x) for p, r, x in rated if x.value >= best.value * (1 - tolerance)]
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
class Fed:
    """A data setting chosen to feed one kept compute setting."""

    params: dict[str, Any]
    rate: Est
    clears: bool
    bound: Est
    margin: float

    def summary(self) -> dict:
        r, share = self.rate, self.rate.over(self.bound)
        return {"params": self.params, "rate": [r.value, r.lo, r.hi], "clears": self.clears,
                "margin": [share.value - 1, share.lo - 1, share.hi - 1]}


def choose_data(rows: list[tuple[dict, Row]], space: list[Param], bound: Est,
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
              bound: Est, margin: float) -> list[dict]:
    """The data points to measure next, given the measured `rows` (empty: done). 1. Each
    worker count with the other keys at their cheapest, fewest first, up to the first that
    clears `bound`. 2. The turns: one other key turned, cheapest first, at a worker fewer than
    the first that cleared (a cheaper key may make up for it), at the most workers when none
    did; done when a turn clears or all are measured. The cheapest clearing setting along
    these lines, in a few trials where the data space has many."""
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


def join_bound(compute: Est, loader: Est, workers: int) -> tuple[str, Est]:
    """What a pairing's e2e can reach, and its name: with loader workers the pipes overlap (the
    narrower one); with 0 workers each batch is loaded between two steps (the serial bound)."""
    if workers:
        return min((("compute", compute), ("data", loader)), key=lambda t: t[1].value)
    serial = Est(*(serial_rate(c, 1.0 / x) for c, x in ((compute.value, loader.value),
                                                         (compute.lo, loader.lo),
                                                         (compute.hi, loader.hi))))
    return "serial", serial


def contends(e2e: Est, bound: Est, tolerance: float) -> bool:
    """The joined run falls short of its join_bound: even its high end is below the bound's
    low end by more than `tolerance` (the hand-over alone costs a little)."""
    return e2e.hi < bound.lo * (1 - tolerance)


def confirm_top(rows: list[Row], tolerance: float) -> int:
    """How many of the join's pairings, fastest first, its confirm rounds re-measure: the
    leader down to the last pairing left open, whose interval reaches the leader's while its
    median is more than `tolerance` below (within it, either is an answer); an unstable leader
    is re-measured too."""
    ranked = sorted((r for r in rows if rate_of(r) is not None),
                    key=lambda r: r.throughput, reverse=True)
    if not ranked:
        return 0
    lead = ranked[0]
    last = 0 if lead.stable else 1
    for i, r in enumerate(ranked[1:], start=1):
        if r.interval[1] >= lead.interval[0] and r.throughput < (1 - tolerance) * lead.throughput:
            last = i + 1
    return last


def _effective(points: list[dict]) -> list[dict]:
    """The data points that differ as runs (settings.as_run: one 0-worker point per setting)."""
    from gpubench.config.settings import as_run

    first: dict[str, dict] = {}
    for p in points:
        first.setdefault(S.key(as_run(p)), p)
    return list(first.values())


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
            out.append(f"  kept {_setting(k['params'])}: {Est(*k['rate'])} img/s{mem} "
                       f"({k['why']})")
    for d in result.get("data", []):
        r = Est(*d["rate"])
        if d["clears"]:
            verdict = f"clears compute {clears_by(Est(*d['margin']))}, the cheapest setting that does"
        else:
            verdict = ("clears no kept bound: the data side stays the narrower pipe (next: "
                       "dataset.preload=true, dataset.augment_on=device, more CPU cores)")
        out.append(f"data pipe for {_setting(d['for'])}: {d['trials']} loader-only trial(s); "
                   f"{_setting(d['params'])}: {r} img/s {verdict}")
    j = result.get("join")
    if j:
        for p in j["pairings"]:
            if p["e2e"] is None:
                out.append(f"join {_setting({**p['compute'], **p['data']})}: not measured")
                continue
            e, b = Est(*p["e2e"]), Est(*p["bound"])
            share = e.value / b.value
            tail = (": the pipes contend (both fall short together)" if p["contends"] else "")
            what = ("the serial bound (0 workers: load, then step)" if p["narrower"] == "serial"
                    else "the narrower pipe")
            out.append(f"join {_setting({**p['compute'], **p['data']})}: e2e {e} img/s, "
                       f"{share:.0%} of {what} ({p['narrower']} {b}){tail}")
    w = result.get("wall_s")
    if w:
        out.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in w.items()))
    return out
