"""Which runs a report compares (`--where`, then full training measurements of one setup: its
workload keys, so a custom model is its class), knobs by short name, and setups written out."""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict
from enum import Enum
from functools import partial
from typing import Any, Protocol

import yaml

from gpubench.config.keys import Role
from gpubench.config.knobs import KEYS, SETUP_SHORT, SHORT, knob_setting, role
from gpubench.config.overrides import format_value
from gpubench.config.schema import BY_NAME as DECLARED
from gpubench.config.schema import FaultConfig
from gpubench.config.settings import as_run
from gpubench.core.files import flatten
from gpubench.core.record import RunRecord
from gpubench.core.stats import count


class Row(Protocol):
    """What selection reads of a report row (analysis.recommend.Row)."""

    record: RunRecord
    flat: dict[str, Any]


def knob_key(get: Callable[[str], Any], name: str) -> str:
    """The key holding knob `name`: its first key set, else its last (or `name`)."""
    keys = SHORT.get(name, (name,))
    return next((k for k in keys if get(k) is not None), keys[-1])


def knob_of(get: Callable[[str], Any], name: str) -> Any:
    return get(knob_key(get, name))


# the knobs setup_text words itself; every other knob it writes as knob_setting where off its
# default (`optimizer=adamw`), so setups that differ in any knob never share a title or name
_WORDED = {k for n in ("model", "dataset", "image_size", "batch_size", "num_workers",
                       "worker_type", "precision", "channels_last", "compile") for k in SHORT[n]}
_OTHER = tuple(n for n, k in KEYS.items() if k.knob.role is Role.knob and n not in _WORDED)


def _others(rec: RunRecord, named: tuple[str, ...] = ()) -> list[str]:
    """`optimizer=adamw`: the other knobs off their default, and the keys `named` (what sets a
    run apart) at any value; never one inert with its workers (as_run)."""
    keys = [*_OTHER, *sorted(set(named) - set(_OTHER) - _WORDED)]
    values = as_run({k: rec.knob(k) for k in (*keys, *SHORT["num_workers"], *SHORT["worker_type"])})
    # a default that is a str Enum equals its value
    return [knob_setting(n, values[n]) for n in keys if n in values and (n in named or (
        values[n] is not None and values[n] != (KEYS[n].default if n in KEYS else None)))]


def setup_text(rec: RunRecord, compact: bool = False, named: tuple[str, ...] = (),
               workers: bool = True) -> str:
    """`resnet50 on imagenet 224px, batch 128, 8 workers, amp_bf16, channels_last` (a title),
    or `compact`, `resnet50-bs128-w8-amp_bf16-cl` (a run name), then _others."""
    k = partial(knob_of, rec.knob)
    model, count_, compiled = k("model"), k("num_workers") if workers else None, k("compile")
    compiled = None if compiled in (None, "off", False) else compiled
    thread = "thread " if count_ and k("worker_type") == "thread" else ""  # processes: unsaid
    others = _others(rec, named)
    if compact:
        parts = [str(model).rsplit(".", 1)[-1], f"bs{k('batch_size')}",
                 *([f"w{count_}{'t' if thread else ''}"] if workers else []), str(k("precision"))]
        parts += [p for p in (k("channels_last") and "cl", compiled and f"compile-{compiled}") if p]
        return "-".join(parts + others)
    # a record written before its config was complete leaves parts out rather than print None
    head = " ".join(p for p in (str(model or "?"), k("dataset") and f"on {k('dataset')}",
                                k("image_size") and f"{k('image_size')}px") if p)
    parts = [head, k("batch_size") is not None and f"batch {k('batch_size')}",
             count_ is not None and count(count_, thread + "worker"),
             k("precision") and str(k("precision")), k("channels_last") and "channels_last",
             compiled and f"compile={compiled}", *others]
    return ", ".join(p for p in parts if p)


def workload_text(rec: RunRecord) -> str:
    """`model resnet50, dataset imagenet, 224 px`."""
    model, dataset, size = (knob_of(rec.knob, n) for n in ("model", "dataset", "image_size"))
    return f"model {model or '?'}, dataset {dataset or '?'}, {size or '?'} px"


class LeftOut(Enum):
    """Why a row is no full training measurement: its words for one and several."""

    probe = ("max-batch probe", "max-batch probes")
    screen = ("screen", "screens")
    no_e2e = ("run without an e2e phase (loader-only or compute-only)",
              "runs without an e2e phase (loader-only or compute-only)")


def left_out(rec: RunRecord) -> LeftOut | None:
    """None for a full training measurement; one that crashed before its e2e phase stays (a
    failed training measurement, ranked as infeasible)."""
    if not rec.full:  # a short rung's
        return LeftOut[str(rec.rung)]
    phases = rec.knob("bench.phases")
    if rec.images_per_sec is None and (
            rec.status.measured or (isinstance(phases, list) and "e2e" not in phases)):
        return LeftOut.no_e2e
    return None


def longest(records: list[RunRecord]) -> list[RunRecord]:
    """The records measured longest: a short screen never stands for the others."""
    steps = [int(r.knob("bench.steps") or 0) for r in records]
    return [r for r, n in zip(records, steps, strict=True) if n == max(steps)]


# no fault injection: a run with any other value tests a failure path, never pooled nor a bound
NO_FAULT = {f"fault.{k}": v for k, v in asdict(FaultConfig()).items()}
# the keys that inject a fault when set (faulted); the others only shape one (seconds, rank)
FAULT_TRIGGERS = ("fault.oom_above_batch", "fault.fail_message", "fault.stall_every")


def faulted(rec: RunRecord) -> bool:
    """A fault acted, as the runner injects them: an OOM below this run's batch, a failure
    message, a stall of some seconds, on a rank the run has."""
    cfg = flatten(rec.config or {})
    rank, oom, batch = map(cfg.get, ("fault.rank", "fault.oom_above_batch", "loader.batch_size"))
    if isinstance(rank, int) and rank >= (rec.world_size or 1):  # parts.distributed.fault_hits
        return False
    stall_s = cfg.get("fault.stall_s", NO_FAULT["fault.stall_s"])
    return (oom is not None and not (isinstance(batch, int) and isinstance(oom, int)
                                     and batch <= oom)
            or bool(cfg.get("fault.fail_message"))
            or cfg.get("fault.stall_every") is not None
            and not (isinstance(stall_s, (int, float)) and stall_s <= 0))


def as_faulted(rec: RunRecord, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with the fault keys at their defaults where no fault acted: runs apart only in
    a key that shaped none (fault.stall_s=0.05,1) are one setup."""
    return values if faulted(rec) else {k: NO_FAULT.get(k, v) for k, v in values.items()}


def loader_only(rec: RunRecord) -> bool:
    """A full run of the loader phase alone (the report's workers answer)."""
    phases = rec.knob("bench.phases")
    return isinstance(phases, list) and set(phases) == {"loader"} and rec.full


class WhereError(ValueError):
    """A `--where` that picks nothing it could; `bad_input` where the command line itself is
    wrong (malformed, a key gpubench never declares), not the runs read."""

    def __init__(self, line: str, bad_input: bool = True):
        super().__init__(line)
        self.bad_input = bad_input


def parse_where(items: list[str] | None) -> dict[str, str]:
    """`--where KEY=VALUE` options as {dotted key: value}; WhereError on a malformed one."""
    out = {}
    for item in items or []:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            raise WhereError(f"gpubench.report: --where {item!r} is not allowed: it must be "
                             "KEY=VALUE with a dotted config key, e.g. --where model.name=resnet50")
        if key in out and out[key] != value:  # one run has one value
            raise WhereError(f"gpubench.report: --where {item!r} is not allowed: {key} is given "
                             f"twice ({out[key]} and {value}); a run has one value of each key")
        out[key] = value
    return out


def _matches(v: Any, want: str) -> bool:
    if v is None:
        return want.lower() in ("null", "none")
    try:  # as the command line would write it: 64, 0.5, true, [loader]
        parsed = yaml.safe_load(want)
    except yaml.YAMLError:
        parsed = want
    return v == parsed or str(v) == want or format_value(v) == want


def where(rows: list[Row], conditions: dict[str, str]) -> list[Row]:
    """The rows whose config has every KEY=VALUE; a key no row has is a typo: WhereError."""
    for key in conditions:
        if rows and not any(key in r.flat for r in rows):
            close = difflib.get_close_matches(key, sorted({k for r in rows for k in r.flat}), 3)
            hint = f" (close: {', '.join(close)})" if close else ""
            # a declared key these runs lack (recorded before it existed) is the runs' doing
            if key in DECLARED:
                raise WhereError(f"gpubench.report: --where {key}: no run has this config key"
                                 f"{hint}", bad_input=False)
            raise WhereError(f"gpubench.report: --where {key}={conditions[key]} is not allowed: "
                             f"it must be a config key these runs hold{hint}")
    return [r for r in rows if all(_matches(r.flat.get(k), v) for k, v in conditions.items())]


def setup_of(r: Row) -> tuple[tuple[str, str], ...]:
    """The row's workload keys: rows that differ train other things."""
    return workload_of(r.flat)


def workload_of(flat: dict[str, Any], but: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """A flat config's workload keys and values, comparable (`but`: keys left out)."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str))
                        for k, v in flat.items() if role(k) is Role.workload and k not in but))


def training_rows(rows: list[Row]) -> tuple[list[Row], list[str]]:
    """The rows the report ranks (of the newest run's workload), and notes on the others."""
    kept = [r for r in rows if left_out(r.record) is None]
    out = Counter(why for r in rows if (why := left_out(r.record)) is not None)
    n, kinds = sum(out.values()), ", ".join(count(k, *why.value) for why, k in out.items())
    # none kept: the table lists these instead (write_report), so nothing is left out of it
    notes = [] if not n else [f"left out {count(n, 'run')} that {'is' if n == 1 else 'are'} no "
                              f"full training measurement: {kinds}"] if kept else [
        f"no full training measurement to rank: the table lists the {kinds} as measured"]
    groups: dict[tuple, list[Row]] = {}
    for r in kept:
        groups.setdefault(setup_of(r), []).append(r)
    if len(groups) > 1:
        # the newest that measured: a failed job's setup ranked alone read "no feasible measurement"
        measured = [r for r in kept if r.record.status.measured]
        newest = max(measured or kept, key=lambda r: r.record.started_at or "")
        mine = setup_of(newest)
        others = [f"{_setup_name(g[0], newest)} ({count(len(g), 'run')})"
                  for k, g in groups.items() if k != mine]
        other = next(g[0] for k, g in groups.items() if k != mine)
        key = _differing(newest, other)[0]
        which = "newest measured run's" if measured else "newest run's"
        notes.append(f"ranked only {_setup_name(newest, other)} (the {which} setup); other "
                     f"setups: {'; '.join(others)}; pick one with --where, e.g. --where "
                     f"{key}={format_value(other.flat.get(key))}")
        kept = groups[mine]
    return kept, notes


def _differing(r: Row, other: Row) -> list[str]:
    """The workload keys whose values differ between two rows, the shown ones first."""
    a, b = dict(setup_of(r)), dict(setup_of(other))
    shown = [knob_key(r.flat.get, n) for n in SETUP_SHORT]
    return sorted((k for k in a.keys() | b.keys() if a.get(k) != b.get(k)),
                  key=lambda k: (k not in shown, k))


def _setup_name(r: Row, other: Row) -> str:
    """`model.name=tiny dataset.name=synthetic ...` (--where's), and keys unlike `other`'s."""
    keys = list(dict.fromkeys([knob_key(r.flat.get, n) for n in ("model", "dataset", "image_size")]
                              + _differing(r, other)))
    return " ".join(f"{k}={format_value(r.flat.get(k)) if r.flat.get(k) is not None else '?'}"
                    for k in keys)
