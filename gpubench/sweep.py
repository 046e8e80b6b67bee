"""Sweep building blocks, free of Hydra's launcher: search spaces, trial outcomes, max-batch search.

The search space is written in Hydra's own override syntax, so a command that works with the
basic sweeper keeps working with the gpubench sweeper:

    choice(a,b,...)   a categorical (also `a,b,c` and config groups: `precision=choice(fp32,amp_bf16)`)
    range(a,b[,s])    integers (or floats) from a up to b, b excluded, as in Python and Hydra
    interval(a,b)     a continuous float in [a, b]
    tag(log, ...)     sample on a log scale (interval, or range with step 1)

Everything here is a plain function or dataclass; the sweeper plugin wires them to Hydra and
Optuna, and the tests call them directly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

# a constraint value for a trial that ran out of memory: worse than any over-ceiling trial
# (peak fraction - ceiling < 1), so samplers rank it as the most infeasible
OOM_CONSTRAINT = 1.0


class SearchSpaceError(ValueError):
    pass


# --------------------------------------------------------------------------- search space


@dataclass
class Param:
    """One swept key: its Optuna distribution and how a sampled value becomes an override."""

    name: str  # key or config group, used as the Optuna parameter name
    key: str  # as written on the command line, with a +/++ prefix if any
    dist: BaseDistribution
    # categorical choices that are not plain scalars (lists, quoted strings) sample a label;
    # this maps each sampled choice back to the text Hydra parses
    text: dict[Any, str] = field(default_factory=dict)

    def override(self, value: Any) -> str:
        if value in self.text:
            return f"{self.key}={self.text[value]}"
        return f"{self.key}={format_value(value)}"


@dataclass
class SearchSpace:
    params: list[Param]
    fixed: list[str]  # non-swept overrides, passed to every job unchanged

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {p.name: p.dist for p in self.params}

    def overrides(self, values: dict[str, Any], extra: Iterable[str] = ()) -> list[str]:
        """The job's override list; `extra` (e.g. a short screen) wins over a fixed override."""
        out = {_key_of(o): o for o in self.fixed}
        for p in self.params:
            out[p.name] = p.override(values[p.name])
        for o in extra:
            out[_key_of(o)] = o
        return list(out.values())

    def size(self) -> int | None:
        """Number of distinct points, or None when a parameter is continuous."""
        n = 1
        for p in self.params:
            d = p.dist
            if isinstance(d, CategoricalDistribution):
                n *= len(d.choices)
            elif isinstance(d, IntDistribution):
                n *= (d.high - d.low) // d.step + 1
            elif isinstance(d, FloatDistribution) and d.step is not None:
                n *= int(round((d.high - d.low) / d.step)) + 1
            else:
                return None
        return n

    def study_name(self) -> str:
        """A stable name for this exact search: re-running the same command finds its study."""
        spec = {
            "params": {p.name: _dist_spec(p.dist) for p in self.params},
            "fixed": sorted(self.fixed),
        }
        digest = hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()
        return f"gpubench-{digest[:10]}"


def _dist_spec(d: BaseDistribution) -> dict:
    from optuna.distributions import distribution_to_json

    return json.loads(distribution_to_json(d))


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def format_value(v: Any) -> str:
    """A sampled Python value as Hydra override text."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _is_scalar(v: Any) -> bool:
    # exact types: Hydra's QuotedString and containers are sampled by their text instead
    return v is None or type(v) in (bool, int, float, str)


def _range_distribution(sweep, log: bool) -> BaseDistribution:
    start, stop, step = sweep.start, sweep.stop, sweep.step
    if step == 0:
        raise SearchSpaceError("range(): step must not be 0")
    n = math.ceil((stop - start) / step)
    if n <= 0:
        raise SearchSpaceError(f"range({start},{stop},{step}) is empty")
    # the stop value is excluded, as in Python: the last point is start + (n-1)*step
    last = start + (n - 1) * step
    low, high = (start, last) if step > 0 else (last, start)
    step = abs(step)
    if all(isinstance(x, int) for x in (start, stop, step)):
        if log and step != 1:
            raise SearchSpaceError("tag(log, range(...)) needs step 1 (or use choice(...))")
        if log and low < 1:
            raise SearchSpaceError(f"tag(log, range({start},{stop})) needs a start >= 1")
        return IntDistribution(int(low), int(high), log=log, step=1 if log else int(step))
    if log:
        raise SearchSpaceError("tag(log, ...) on a float range: use tag(log, interval(a,b))")
    return FloatDistribution(float(low), float(high), step=float(step))


def to_param(override) -> Param:
    """A Hydra sweep override (choice/range/interval, optionally tagged log) as an Optuna param."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    value = override.value()
    name, key = override.key_or_group, override.get_key_element()
    log = "log" in (getattr(value, "tags", None) or set())
    if isinstance(value, ChoiceSweep):
        if log:
            raise SearchSpaceError(f"{name}: tag(log, ...) applies to range/interval, not choice")
        labels = list(override.sweep_string_iterator())
        choices, text = [], {}
        for v, label in zip(value.list, labels, strict=True):
            if _is_scalar(v):
                choices.append(v)
                if isinstance(v, str):
                    text[v] = label  # keeps quoting of odd strings
            else:  # a list, dict or quoted string: sample its text
                choices.append(label)
                text[label] = label
        # equality, not text: Optuna stores a choice by its index and finds false at 0, true at 1
        if len(set(choices)) != len(choices):
            raise SearchSpaceError(f"{name}: choice() lists a value twice (0 and false, 1 and "
                                   "true, 1 and 1.0 count as the same)")
        return Param(name, key, CategoricalDistribution(choices), text)
    if isinstance(value, RangeSweep):
        return Param(name, key, _range_distribution(value, log))
    if isinstance(value, IntervalSweep):
        lo, hi = float(value.start), float(value.end)
        if not lo < hi:
            raise SearchSpaceError(f"{name}: interval({lo},{hi}) needs a < b")
        if log and lo <= 0:
            raise SearchSpaceError(f"{name}: tag(log, interval(a,b)) needs a > 0")
        return Param(name, key, FloatDistribution(lo, hi, log=log))
    raise SearchSpaceError(f"{name}: unsupported sweep {override.input_line!r}")


def parse_search_space(
    arguments: Iterable[str], params: dict[str, str] | None = None, config_loader=None
) -> SearchSpace:
    """Preset params (`hydra.sweeper.params`) first, command-line overrides on top of them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    merged: dict[str, str] = {}
    for k, v in (params or {}).items():
        merged[str(k)] = f"{k}={v}"
    for a in arguments:
        merged[_key_of(a)] = a
    parser = OverridesParser.create(config_loader=config_loader)
    swept, fixed = [], []
    for o in parser.parse_overrides(list(merged.values())):
        if o.is_sweep_override():
            swept.append(to_param(o))
        else:
            fixed.append(o.input_line)
    return SearchSpace(swept, fixed)


# --------------------------------------------------------------------------- trial outcomes


@dataclass
class Outcome:
    """What one job measured, read back from its results.json."""

    status: str  # ok, oom, over_ceiling, failed, killed, missing
    throughput: float  # images/sec measured (0.0 when nothing was)
    peak_fraction: float | None
    ceiling: float
    error: str | None
    dir: Path
    data: dict = field(default_factory=dict, repr=False)

    @property
    def constraint(self) -> float:
        """peak memory fraction - ceiling: <= 0 is feasible. An OOM or a run that measured
        nothing is infeasible by definition."""
        if self.status == "oom":
            return OOM_CONSTRAINT
        if self.peak_fraction is None:
            return 0.0 if self.status == "ok" else OOM_CONSTRAINT
        return self.peak_fraction - self.ceiling

    @property
    def feasible(self) -> bool:
        return self.status == "ok" and self.constraint <= 0

    @property
    def crashed(self) -> bool:
        """No usable measurement: the trial is a failure, not a data point."""
        return self.status in ("failed", "killed", "missing")


def throughput_of(data: dict) -> float:
    """The training throughput a run measured, also when its status made the objective 0.0
    (an over-ceiling run still measured its speed)."""
    for key in ("images_per_sec", "compute_images_per_sec"):
        v = data.get(key)
        if v is not None and math.isfinite(v):
            return float(v)
    if data.get("status") == "ok":
        v = data.get("objective")
        if v is not None and math.isfinite(v):
            return float(v)
    return 0.0


def read_outcome(out_dir: str | Path, job_error: BaseException | None = None) -> Outcome:
    out_dir = Path(out_dir)
    path = out_dir / "results.json"
    if not path.is_file():
        err = f"{type(job_error).__name__}: {job_error}" if job_error else "no results.json"
        return Outcome("missing", 0.0, None, 1.0, err, out_dir)
    data = json.loads(path.read_text())
    status = data.get("status", "failed")
    if job_error is not None and status in ("ok", "running"):
        status = "failed"
    if status == "running":  # the job died between phases
        status = "failed"
    tp = throughput_of(data) if status in ("ok", "over_ceiling") else 0.0
    error = data.get("error") or (f"{type(job_error).__name__}: {job_error}" if job_error else None)
    if status == "ok" and tp <= 0:
        status, error = "failed", "measured no throughput"
    return Outcome(
        status, tp, data.get("peak_memory_fraction"), float(data.get("memory_ceiling") or 1.0),
        error, out_dir, data,
    )


# --------------------------------------------------------------------------- max batch


@dataclass
class Probe:
    batch_size: int
    fits: bool


def find_max_batch(
    fits: Callable[[int], bool], start: int, limit: int
) -> tuple[int | None, list[Probe]]:
    """Largest batch size in [1, limit] for which `fits(b)`, assuming memory grows with batch
    size: double from `start` until the first batch that does not fit (or halve down if `start`
    already does not), then bisect between the last fit and the first miss. Returns the size
    (None if even 1 does not fit) and the probes in the order they ran."""
    if start < 1 or limit < 1:
        raise ValueError("start and limit must be >= 1")
    probes: list[Probe] = []

    def probe(b: int) -> bool:
        ok = bool(fits(b))
        probes.append(Probe(b, ok))
        return ok

    b = min(start, limit)
    lo, hi = (b, None) if probe(b) else (None, b)
    while lo is not None and hi is None:  # grow
        if lo >= limit:
            return lo, probes
        b = min(lo * 2, limit)
        lo, hi = (b, None) if probe(b) else (lo, b)
    while lo is None:  # shrink
        if hi <= 1:
            return None, probes
        b = hi // 2
        lo, hi = (b, hi) if probe(b) else (None, b)
    while hi - lo > 1:  # bisect: lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    return lo, probes


def fits_under(outcome: Outcome, reserve: float) -> bool:
    """A max-batch probe fits when it ran (no OOM, no error) and its peak memory stays under
    ceiling x (1 - reserve); the reserve absorbs what a longer run allocates later."""
    if outcome.status not in ("ok", "over_ceiling"):
        return False
    if outcome.peak_fraction is None:
        return outcome.status == "ok"
    return outcome.peak_fraction <= outcome.ceiling * (1.0 - reserve)
