"""Which runs a report compares: full training measurements of one training setup.

An experiment collects runs of many kinds (loader-only runs, max-batch probes, a sweep's screens,
full training runs) and setups (models, datasets, image sizes). Their throughputs are no speeds
of one thing: the report ranks and recommends full training measurements of one setup, and says
in one line what it left out (gpubench.report); `--where KEY=VALUE` picks rows first.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import yaml

from gpubench.config.overrides import format_value
from gpubench.core.record import Rung, RunRecord


class Row(Protocol):
    """What selection reads of a report row (gpubench.analysis.recommend.Row): its record and config."""

    record: RunRecord
    flat: dict[str, Any]


# what makes two runs the same training setup: the report never ranks one against another
SETUP_OF = ("model.name", "dataset.name", "dataset.image_size")


def left_out(rec: RunRecord) -> str | None:
    """Why a row is no full training measurement (None when it is one): a max-batch probe or a
    screen measured too few steps, and a loader-only or compute-only run measured no training
    step (no e2e figure: its objective is another phase's). A run that crashed before its e2e
    phase stays: it is a failed training measurement, ranked as infeasible."""
    if rec.rung == Rung.probe:
        return "max-batch probes"
    if rec.rung == Rung.screen:
        return "screens"
    phases = rec.knob("bench.phases")
    if rec.images_per_sec is None and (
            rec.status.measured or (isinstance(phases, list) and "e2e" not in phases)):
        return "runs without an e2e phase (loader-only or compute-only)"
    return None


def parse_where(items: list[str] | None) -> dict[str, str]:
    """`--where KEY=VALUE` options as {dotted key: value}; one line on a malformed one."""
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][\w.]*", key.strip()):
            raise SystemExit(f"gpubench.report: --where {item!r} is not allowed: KEY=VALUE with "
                             "a dotted config key, e.g. --where model.name=resnet50")
        out[key.strip()] = value.strip()
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
    """The rows whose config has every KEY=VALUE of `conditions` (before anything else). A key
    that no row has is a typo: one line naming it and keys that exist."""
    for key in conditions:
        if rows and not any(key in r.flat for r in rows):
            import difflib

            close = difflib.get_close_matches(key, sorted({k for r in rows for k in r.flat}), 3)
            raise SystemExit(f"gpubench.report: --where {key}: no run has this config key"
                             + (f" (close: {', '.join(close)})" if close else ""))
    return [r for r in rows if all(_matches(r.flat.get(k), v) for k, v in conditions.items())]


def setup_of(r: Row) -> tuple:
    return tuple(r.flat.get(k) for k in SETUP_OF)


def training_rows(rows: list[Row]) -> tuple[list[Row], list[str]]:
    """The rows the report ranks and recommends from, and what it says about the others: full
    training measurements only, of one training setup (SETUP_OF): the newest run's. Throughputs
    of different models or image sizes are no speeds of one thing."""
    kept, out = [], {}
    for r in rows:
        why = left_out(r.record)
        if why is None:
            kept.append(r)
        else:
            out[why] = out.get(why, 0) + 1
    notes = []
    if out:
        notes.append(f"left out {sum(out.values())} run(s) that are no full training "
                     "measurement: " + ", ".join(f"{n} {why}" for why, n in out.items()))
    groups: dict[tuple, list[Row]] = {}
    for r in kept:
        groups.setdefault(setup_of(r), []).append(r)
    if len(groups) > 1:
        newest = max(kept, key=lambda r: r.record.started_at or "")
        mine = setup_of(newest)
        others = [f"{_setup_name(k)} ({len(g)} run(s))" for k, g in groups.items() if k != mine]
        other = next(k for k in groups if k != mine)
        i = next(i for i, (a, b) in enumerate(zip(mine, other, strict=True)) if a != b)
        notes.append(f"ranked only {_setup_name(mine)} (the newest run's setup); other setups: "
                     f"{'; '.join(others)}; pick one with --where, e.g. --where "
                     f"{SETUP_OF[i]}={format_value(other[i])}")
        kept = groups[mine]
    return kept, notes


def _setup_name(key: tuple) -> str:
    return " ".join(f"{k}={format_value(v) if v is not None else '?'}"
                    for k, v in zip(SETUP_OF, key, strict=True))
