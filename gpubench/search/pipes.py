"""`sweep=pipes`: search each pipe on its own, then join them (docs/sweeps.md#sweeppipes).

1. compute pipe: compute-only trials over the compute knobs (every swept key that is not a
   data key): every setting when the space is within `compute_trials`, else Optuna's sampler.
   Kept: the fastest setting and the smallest batch within the tolerance of it, each with its
   compute interval: the bound.
2. data pipe: for each kept setting, loader-only trials over the data keys, cheapest first,
   until the cheapest setting whose loader interval clears the bound by the margin is found, or
   the budget ends (then the fastest loader: the data side stays the narrower pipe).
3. join: each pairing measured end to end, then again in interleaved rounds where those
   measurements leave the answer open; a pairing whose e2e falls short of both pipes shows the
   pipes contend: the next clearing data setting is tried, within `join_trials`.

Each stage is a gpubench.search.loop.Search on a study of its own in the sweep's storage
(`<study>-compute`, `<study>-data-<setting>`, `<study>-join`), so resume, heartbeats, several
workers and the failure budget work as in any sweep; a stage's points are queued in its study
(`enqueue_trial(skip_if_exists=True)`), so a resumed or second worker finds them in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpubench.analysis.recommend import TOLERANCE, Row, recommend
from gpubench.search import pipe_rules as R
from gpubench.search import study as S
from gpubench.search.loop import Confirm, Search
from gpubench.search.space import SearchSpace

log = logging.getLogger("gpubench.sweep")


@dataclass
class Plan:
    """The pipes settings (hydra.sweeper.pipes.*)."""

    data_keys: tuple[str, ...]
    compute_trials: int
    keep: int
    data_trials: int
    join_trials: int
    compute_overrides: list[str]
    data_overrides: list[str]
    join_overrides: list[str] = field(default_factory=list)
    tolerance: float = TOLERANCE  # the knee: the smallest batch within this of the fastest
    margin: float = TOLERANCE  # a loader clears a bound by this


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
        compute, _ = R.check_space(self.space, self.plan.data_keys)
        t0 = time.monotonic()
        kept = self._compute(compute)
        self._spent("compute", t0)
        if not kept:
            log.warning("no compute setting ran under the memory ceiling: nothing to feed")
            self.write(self.result)
            return self.result
        t1 = time.monotonic()
        fed = [self._data(k) for k in kept]
        self._spent("data", t1)
        t2 = time.monotonic()
        self._join(kept, fed)
        self._spent("join", t2)
        self.write(self.result)
        for line in R.lines(self.result):
            log.info("%s", line)
        return self.result

    def _compute(self, compute: SearchSpace) -> list[R.Kept]:
        space = R.fixed_space(compute, {}, self.plan.compute_overrides)
        shared = self.open_study(f"{self.name}-compute")
        points = R.grid(space.params)
        exhaustive = points is not None and len(points) <= self.plan.compute_trials
        if exhaustive:
            # every setting, smallest batch first: a study's queue is kept across workers
            for p in sorted(points, key=lambda p: (p.get("loader.batch_size", 0), S.key(p))):
                shared.study.enqueue_trial(p, skip_if_exists=True)
        n = len(points) if exhaustive else self.plan.compute_trials
        self.search(shared, space, n, "compute").run()
        rows = _rows(shared)
        kept = R.keep_compute(rows, "loader.batch_size", self.plan.tolerance, self.plan.keep)
        self.result["compute"] = {
            "study": shared.study.study_name, "trials": len(rows), "space": len(points or []) or
            None, "exhaustive": exhaustive, "kept": [k.summary() for k in kept]}
        self.write(self.result)
        for k in kept:
            log.info("compute pipe: %s: %s img/s, %s", S.describe(k.params), format(k.rate), k.why)
        return kept

    def _measure(self, shared: S.Shared, space: SearchSpace, todo: list[dict],
                 stop: Callable[[], bool]) -> None:
        """Measure `todo` (queued in this order) within the data budget, until `stop`."""
        done = len(_rows(shared))
        todo = todo[: max(self.plan.data_trials - done, 0)]
        for p in todo:
            shared.study.enqueue_trial(p, skip_if_exists=True)
        if todo:
            self.search(shared, space, done + len(todo), "data", stop=stop).run()

    def _data(self, k: R.Kept, past: dict | None = None) -> R.Fed | None:
        """The data setting chosen for k; with `past` (a setting chosen before), the next
        setting in cost order after it, measured now."""
        _, data = R.split(self.space, self.plan.data_keys)
        space = R.fixed_space(data, k.params, self.plan.data_overrides)
        shared = self.open_study(f"{self.name}-data-{R.short_hash(k.params)}")
        params = space.params
        # a grid: check_space refused a continuous data key
        points = sorted(R._effective(R.grid(params)), key=lambda p: R.cost(p, params))
        after = None if past is None else R.cost(past, params)

        def walk() -> list[dict]:  # what the walk measures next (nothing: it found its answer)
            return R.data_walk(points, params, _rows(shared), k.rate, self.plan.margin)

        if after is not None:  # the join's next try: the next setting past the chosen one
            measured = {S.key(p) for p, _ in _rows(shared)}
            nxt = [p for p in points if R.cost(p, params) > after and S.key(p) not in measured]
            self._measure(shared, space, nxt[:1], lambda: False)
        else:
            while (todo := walk()) and (before := len(_rows(shared))) < self.plan.data_trials:
                self._measure(shared, space, todo, lambda: not walk())
                if len(_rows(shared)) == before:  # nothing more could be measured (failures)
                    break
        rows = _rows(shared)
        f = R.choose_data(rows, params, k.rate, self.plan.margin, after)
        if f is not None and after is None:
            self.result.setdefault("data", []).append(
                {"for": k.params, "study": shared.study.study_name, "trials": len(rows),
                 **f.summary()})
            self.write(self.result)
            verb = "clears" if f.clears else "does not clear"
            log.info("data pipe for %s: %s: loader %s img/s %s compute %s", S.describe(k.params),
                     S.describe(f.params), format(f.rate), verb, format(k.rate))
        return f

    def _join(self, kept: list[R.Kept], fed: list[R.Fed | None]) -> None:
        shared = self.open_study(f"{self.name}-join")
        space = R.fixed_space(self.space, {}, self.plan.join_overrides)
        pairs = [(k, f) for k, f in zip(kept, fed, strict=True) if f is not None]
        joined: list[dict] = []
        rows: list[tuple[dict, Row]] = []
        tried = 0
        while pairs:
            for k, f in pairs:
                shared.study.enqueue_trial({**k.params, **f.params}, skip_if_exists=True)
            tried += len(pairs)
            self.search(shared, space, tried, "join", confirm=replace(self.confirm, top=0)).run()
            # confirm rounds only where one measurement each leaves the answer open (the same
            # rows on a resume: the same decision)
            rows = _rows(shared)
            if top := R.confirm_top([r for _, r in rows], self.plan.tolerance):
                self.search(shared, space, tried, "join",
                            confirm=replace(self.confirm, top=top)).run()
                rows = _rows(shared)  # pooled with the rounds
            by_key = {S.key(p): r for p, r in rows}
            nxt = []
            for k, f in pairs:
                row = by_key.get(S.key({**k.params, **f.params}))
                e2e = R.rate_of(row) if row is not None else None
                name, narrower = R.join_bound(k.rate, f.rate,
                                              f.params.get("loader.num_workers", 1))
                short = e2e is not None and R.contends(e2e, narrower, self.plan.tolerance)
                joined.append({"compute": k.params, "data": f.params,
                               "e2e": None if e2e is None else [e2e.value, e2e.lo, e2e.hi],
                               "narrower": name,
                               "bound": [narrower.value, narrower.lo, narrower.hi],
                               "contends": short})
                if short and tried < self.plan.join_trials:
                    log.info("join: %s falls short of both pipes (%s img/s against %s): the "
                             "pipes contend; trying the next data setting",
                             S.describe({**k.params, **f.params}), format(e2e), format(narrower))
                    alt = self._data(k, past=f.params)
                    if alt is not None and alt.clears:
                        nxt.append((k, alt))
            pairs = nxt[: max(self.plan.join_trials - tried, 0)]
        rec = recommend([r for _, r in rows])
        self.result["join"] = {"study": shared.study.study_name, "pairings": joined}
        if rec is not None:  # the report's rule: the smallest batch, fewest workers near the best
            params = next(p for p, r in rows if r is rec.chosen)
            self.result["recommended"] = {
                "params": params, "e2e": [rec.chosen.throughput, *rec.chosen.interval],
                "confirmed": rec.chosen.confirmed, "dir": rec.chosen.dir}


def _rows(shared: S.Shared) -> list[tuple[dict, Row]]:
    """(params, row) of every measured trial of a stage's study."""
    from gpubench.search.rows import trial_rows

    return [(dict(t.params), r) for t, r in trial_rows(shared.study, shared.storage)]
