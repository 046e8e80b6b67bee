"""Search spaces in Hydra's own override syntax, as Optuna distributions: a command that works
with the basic sweeper keeps working with the gpubench sweeper.

    choice(a,b,...)   a categorical (also `a,b,c` and config groups: `precision=choice(fp32,amp_bf16)`)
    range(a,b[,s])    integers (or floats) from a up to b, b excluded, as in Python and Hydra
    interval(a,b)     a continuous float in [a, b]
    tag(log, ...)     sample on a log scale (interval, or range with step 1)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
)

from gpubench.config.errors import ConfigError
from gpubench.config.keys import Role
from gpubench.config.knobs import SEARCHABLE, acts, role
from gpubench.config.overrides import format_value
from gpubench.core.ranges import NOT_EMPTY, range_last


@dataclass
class Param:
    """One swept key: its Optuna distribution and how a sampled value becomes an override."""

    name: str  # key or config group, used as the Optuna parameter name
    key: str  # as written on the command line, with a +/++ prefix if any
    dist: BaseDistribution
    # a sampled choice's text for Hydra (lists and quoted strings are sampled by their label)
    text: dict[Any, str] = field(default_factory=dict)
    written: str = ""  # the sweep as written (`choice(16,64)`): what an error line shows

    def override(self, value: Any) -> str:
        return f"{self.key}={self.text[value] if value in self.text else format_value(value)}"


@dataclass
class SearchSpace:
    params: list[Param]
    fixed: list[str]  # non-swept overrides, passed to every job unchanged
    # what the jobs will resolve that no override says (bench.device=auto as they run it): the
    # sweeper's, where its launcher runs them on this host
    resolved: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def fixed_values(self) -> dict[str, Any]:
        """The fixed overrides' values by key (`loader.num_workers=0`: 0), as Hydra parses them,
        under what the jobs resolve."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        return {**{o.key_or_group: o.value() for o in
                   OverridesParser.create().parse_overrides(list(self.fixed))
                   if not o.is_sweep_override() and not o.is_delete()}, **self.resolved}

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {p.name: p.dist for p in self.params}

    def overrides(self, values: dict[str, Any], extra: Iterable[str] = ()) -> list[str]:
        """The job's override list; `extra` (e.g. a short screen) wins over a fixed override."""
        out = {_key_of(o): o for o in self.fixed}
        out |= {p.name: p.override(values[p.name]) for p in self.params}
        return list((out | {_key_of(o): o for o in extra}).values())

    def require_swept(self) -> None:
        if not self.params:
            raise ConfigError("hydra.sweeper.params", {}, "swept overrides (nothing to search), "
                              "such as 'loader.batch_size=choice(32,64)' or a preset "
                              "(sweep=throughput)")

    def require_knobs(self) -> None:
        """ConfigError for the first swept workload key (Role.workload: what is trained, or a key
        gpubench does not declare): a search would rank other setups as one, the fastest best."""
        for p in self.params:
            if role(p.name) is Role.workload:
                raise ConfigError(p.key.lstrip("+"), p.written, (
                    f"a knob to search ({', '.join(SEARCHABLE)}): {p.name} is a workload key, "
                    "what is trained, and runs that differ in it are never ranked together; "
                    f"run one search per {p.name}, or a grid multirun over them (-m without "
                    "hydra/sweeper=gpubench): its report ranks each apart"),
                    typed=p.written or None)

    def size(self) -> int | None:
        """Number of distinct runs (points that differ only in a key inert there are one: `key`),
        or None when a parameter is continuous."""
        n = points(self.params)
        if n is None or n > 100_000:  # too many to list: as many as points
            return n
        return len({key(p, self.fixed_values) for p in grid(self.params)})

    def study_name(self) -> str:
        """A stable name for this exact search: re-running the same command finds its study."""
        spec = {"params": {p.name: json.loads(distribution_to_json(p.dist))
                           for p in self.params}, "fixed": sorted(self.fixed)}
        digest = hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()
        return f"gpubench-{digest[:10]}"


def key(params: dict, fixed: dict | None = None) -> str:
    """A configuration's identity: its params as they act (knobs.acts, a key not swept read
    from `fixed`, the search's fixed values): two that differ only in a key inert there (thread
    workers' persistent_workers) are one run, measured once."""
    get = {**(fixed or {}), **params}.get
    return json.dumps({k: v for k, v in params.items() if acts(k, get)}, sort_keys=True,
                      default=str)


class _Stepped(Sequence):
    """Floats low + k * step for k < n, as Optuna makes a stepped float, never held as a list
    (`range(1,1000,0.00001)` is 10^8 of them)."""

    def __init__(self, low: float, step: float, n: int) -> None:
        self.low, self.step, self.ks = low, step, range(n)

    def __len__(self) -> int:
        return len(self.ks)

    def __getitem__(self, k: int) -> float:
        return self.low + self.ks[k] * self.step  # range's: IndexError, negative k


def axes(params: list[Param]) -> list[Sequence] | None:
    """Each parameter's values; None when one is continuous."""
    out: list[Sequence] = []
    for d in (p.dist for p in params):
        if isinstance(d, CategoricalDistribution):
            out.append(list(d.choices))
        elif isinstance(d, IntDistribution):  # tag(log, range(...)) too: its step is 1
            out.append(range(d.low, d.high + 1, d.step))
        elif isinstance(d, FloatDistribution) and d.step is not None:
            out.append(_Stepped(d.low, d.step, round((d.high - d.low) / d.step) + 1))
        else:
            return None
    return out


def points(params: list[Param]) -> int | None:
    """How many points `axes` holds, none listed; None when a key is continuous."""
    values = axes(params)
    return None if values is None else math.prod(map(len, values))


def grid(params: list[Param]) -> list[dict[str, Any]] | None:
    """Every point of a space of choices and stepped ranges; None when a key is continuous."""
    values = axes(params)
    return None if values is None else [dict(zip([p.name for p in params], pt, strict=True))
                                        for pt in itertools.product(*values)]


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _range_distribution(name: str, sweep, log: bool) -> BaseDistribution:
    start, stop, step = sweep.start, sweep.stop, sweep.step
    text = f"range({start},{stop},{step})"
    if step == 0:
        raise ConfigError(name, text, "range(a,b[,step]) with step != 0")
    last = range_last(start, stop, step)
    if last is None:
        raise ConfigError(name, text, NOT_EMPTY)
    low, high = (start, last) if step > 0 else (last, start)
    step = abs(step)
    if all(isinstance(x, int) for x in (start, stop, step)):
        if log and step != 1:
            raise ConfigError(name, f"tag(log,{text})", "a log range with step 1 (or choice(...))")
        if log and low < 1:
            raise ConfigError(name, f"tag(log,{text})", "a log range with a start >= 1")
        return IntDistribution(int(low), int(high), log=log, step=1 if log else int(step))
    if log:
        raise ConfigError(name, f"tag(log,{text})", "tag(log,interval(a,b)) for floats")
    return FloatDistribution(float(low), float(high), step=float(step))


def to_param(override) -> Param:
    """A Hydra sweep override (choice/range/interval, optionally tagged log) as an Optuna param."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    value = override.value()
    name, key = override.key_or_group, override.get_key_element()
    tags = set(getattr(value, "tags", None) or ())
    log = "log" in tags
    written = override.get_value_string()  # as typed, after the first `=`
    if tags - {"log"}:  # a misspelt `log` would sample on a linear scale without a word
        raise ConfigError(name, written, "tag(log, ...), the one tag a search reads")
    if isinstance(value, ChoiceSweep):
        if log:
            raise ConfigError(name, written,
                              "tag(log, ...) around range(...) or interval(...) only")
        labels = list(override.sweep_string_iterator())
        # exact types: Hydra's QuotedString and containers are sampled by their text instead
        choices = [v if v is None or type(v) in (bool, int, float, str) else label
                   for v, label in zip(value.list, labels, strict=True)]
        # a string's label keeps the quoting of odd strings
        text = {c: label for c, label in zip(choices, labels, strict=True) if isinstance(c, str)}
        # equality, not text: Optuna stores a choice by its index and finds false at 0, true at 1
        if len(set(choices)) != len(choices):
            raise ConfigError(name, f"choice({','.join(labels)})", "distinct values (0 and "
                              "false, 1 and true, 1 and 1.0 count as the same)")
        return Param(name, key, CategoricalDistribution(choices), text, written)
    if isinstance(value, RangeSweep):
        return Param(name, key, _range_distribution(name, value, log), written=written)
    if isinstance(value, IntervalSweep):
        lo, hi = float(value.start), float(value.end)
        if not lo < hi:
            raise ConfigError(name, f"interval({lo},{hi})", "interval(a,b) with a < b")
        if log and lo <= 0:
            raise ConfigError(name, f"tag(log,interval({lo},{hi}))", "a log interval with a > 0")
        return Param(name, key, FloatDistribution(lo, hi, log=log), written=written)
    raise ConfigError(name, written, "choice(...), range(...), interval(...), optionally in "
                      "tag(log, ...)")


def parse_search_space(arguments: Iterable[str], params: dict[str, str] | None = None,
                       config_loader=None) -> SearchSpace:
    """Preset params (`hydra.sweeper.params`) first, command-line overrides on top of them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    merged = {str(k): f"{k}={v}" for k, v in (params or {}).items()}
    merged |= {_key_of(a): a for a in arguments}
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(
        list(merged.values()))
    return SearchSpace([to_param(o) for o in parsed if o.is_sweep_override()],
                       [o.input_line for o in parsed if not o.is_sweep_override()])

