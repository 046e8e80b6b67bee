"""`python -m gpubench.report --compare`: per workload, each device's fastest feasible full
measurement in an MLflow experiment, its images per second, joule and dollar, and each device
against the cheapest: reference article 003's "7x the price for 3x the throughput" as a table."""

from __future__ import annotations

import io
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from gpubench.analysis.select import left_out, longest, workload_of, workload_text
from gpubench.config.errors import ConfigError
from gpubench.config.knobs import PLACE, knob_setting
from gpubench.core.exits import ExitCode
from gpubench.core.files import flatten, read_json
from gpubench.core.record import RESULTS_FILE, Rung, RunRecord, Word
from gpubench.core.stats import positive
from gpubench.report.console import dash
from gpubench.report.plot_rules import differing, group_by

DEFAULT_EXPERIMENT = "gpubench"
# Examples only, so the table is never empty: Google Cloud's on-demand prices of the GPU alone
# (no VM), us-central1, around July 2023, the period of reference article 003 (whose V100 is
# "7X more expensive" than the T4: 2.48 / 0.35 = 7.1); any other device needs the user's price.
EXAMPLE_PRICES_DATE = "2023-07"
EXAMPLE_PRICES = {"T4": 0.35, "V100": 2.48}


class PriceSource(Word):
    """Where a device's price came from; its value the table's column."""

    yours = "yours"
    example = f"example ({EXAMPLE_PRICES_DATE})"  # list prices, not the team's
    none = "-"


@dataclass
class DeviceRow:  # one device's best feasible run on one workload, and what it costs
    device: str
    runs: int
    record: RunRecord
    usd_per_hour: float | None
    price_source: PriceSource

    @property
    def images_per_sec(self) -> float:
        return self.record.throughput

    @property
    def images_per_joule(self) -> float | None:
        e = self.record.energy_per_image_j
        return 1.0 / e if positive(e) else None

    @property
    def images_per_dollar(self) -> float | None:
        return self.images_per_sec * 3600.0 / self.usd_per_hour if self.usd_per_hour else None


def load_prices(path: str | Path | None) -> dict[str, float]:
    """`cost.usd_per_hour` from the --prices YAML file; a ConfigError naming what is wrong."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        why = " ".join(str(e).split())  # YAML errors span lines: the message stays one
        raise ConfigError("--prices", str(path), f"a readable YAML file ({why})") from None
    table = (data.get("cost") or {}).get("usd_per_hour") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise ConfigError("--prices", str(path), "a YAML file holding cost.usd_per_hour, a mapping "
                          "of device name to US dollars per hour")
    return _prices(table)


def _prices(table: dict[Any, Any]) -> dict[str, float]:
    for k, v in table.items():
        if not positive(v):
            raise ConfigError(f"cost.usd_per_hour.{k}", v,
                              "a price in US dollars per hour, a number > 0")
    return {str(k): float(v) for k, v in table.items()}


def price_for(device: str, table: dict[str, float]) -> float | None:
    """The exact name, else the longest key in it (any case): "V100" prices "Tesla V100-SXM2"."""
    hits = [k for k in table if k.lower() in device.lower()]
    return table[max(hits, key=lambda k: (len(k), k == device))] if hits else None


def mlflow_records(experiment: str, uri: str, filter_string: str = "") -> list[RunRecord]:
    """Its runs' results.json matching `filter_string` (checked values only), run id in extra."""
    from mlflow.tracking import MlflowClient
    from mlflow.utils import get_results_from_paginated_fn

    # the store module turns MLflow's telemetry off before a client exists (report <- sweeps)
    import gpubench.tracking.store  # noqa: F401
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None and experiment.isdigit():
        exp = client.get_experiment(experiment)
    if exp is None:
        raise SystemExit(f"gpubench.report: no MLflow experiment {experiment!r} at {uri}")
    out = []
    runs = get_results_from_paginated_fn(lambda n, token: client.search_runs(
        [exp.experiment_id], filter_string, max_results=n, page_token=token), 500)
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            rid, tags = run.info.run_id, run.data.tags
            try:
                path = client.download_artifacts(rid, RESULTS_FILE, f"{tmp}/{rid}")
            except Exception:  # a sweep's parent run has no results.json
                continue
            if isinstance(d := read_json(Path(path)), dict):
                rec = RunRecord.from_dict(d)
                # device (when results.json lacks it) and rung (a probe's, a screen's) from tags
                rec.env["device_name"] = rec.env.get("device_name") or tags.get("device_name")
                rec.rung = Rung.of(tags.get("rung") or rec.rung)
                rec.extra["mlflow_run_id"] = rid
                out.append(rec)
    return out


def compare_rows(records: list[RunRecord], prices: dict[str, float]) -> dict[str, list[DeviceRow]]:
    """{workload: a DeviceRow per device, fastest first}: the fastest of its longest feasible
    measurements, so a short screen never stands for a device."""
    # a loader-only run's or a probe's figure is no device's training throughput
    kept = [r for r in records if r.feasible and left_out(r) is None]
    # what it trains: every workload key but where it ran (knobs.PLACE), so runs of two models'
    # kwargs or class counts are never one workload's figures
    by_work = group_by(kept, lambda r: workload_of(flatten(r.config or {}), PLACE))
    groups = {w: group_by(rs, lambda r: str(r.env.get("device_name") or r.env.get("device")
                                            or "unknown device")) for w, rs in by_work.items()}
    out: dict[str, list[DeviceRow]] = {}
    for work, devices in sorted(_named(groups).items()):
        rows = []
        for dev, recs in devices.items():
            best = max(longest(recs), key=lambda r: r.throughput)
            usd, src = next(((u, src) for table, src in (
                (prices, PriceSource.yours), (_own_prices(recs), PriceSource.yours),
                (EXAMPLE_PRICES, PriceSource.example))
                if (u := price_for(dev, table)) is not None), (None, PriceSource.none))
            rows.append(DeviceRow(dev, len(recs), best, usd, src))
        out[work] = sorted(rows, key=lambda d: -d.images_per_sec)
    return out


def _named(groups: dict[tuple, dict]) -> dict[str, dict]:
    """Each workload by its words, with what sets it apart from another of the same words."""
    first = {w: next(iter(next(iter(d.values())))) for w, d in groups.items()}
    out = {}
    for w, devices in groups.items():
        text = workload_text(first[w])
        alike = [dict(o) for o in groups if o != w and workload_text(first[o]) == text]
        own = dict(w)
        apart = [k for k in differing([own, *alike], absent=True) if k in own]
        out[text + "".join(f"; {knob_setting(k, json.loads(own[k]))}" for k in apart)] = devices
    return out


def _own_prices(recs: list[RunRecord]) -> dict[str, float]:
    # each run's table checked whole: a later run's price hides no bad one. A bad one is the
    # runs' doing, not the command line's: exit 1
    try:
        return {k: v for r in recs if isinstance(t := r.knob("cost.usd_per_hour"), dict)
                for k, v in _prices(t).items()}
    except ConfigError as e:
        raise SystemExit(f"gpubench.report: a run's recorded {e}") from None


def versus(rows: list[DeviceRow]) -> list[dict]:
    """Each device's ratios to the cheapest (else the slowest): "7x the price for 3x ..."."""
    priced = [d for d in rows if d.usd_per_hour]
    base = (min(priced, key=lambda d: d.usd_per_hour) if priced
            else min(rows, key=lambda d: d.images_per_sec))
    out = []
    for d in rows:
        price = d.usd_per_hour / base.usd_per_hour if d.usd_per_hour and base.usd_per_hour else None
        value = (d.images_per_dollar / base.images_per_dollar
                 if d.images_per_dollar and base.images_per_dollar else None)
        out.append({"device": d.device, "baseline": base.device,
                    "basis": "the cheapest" if priced else "the slowest; no prices",
                    "price_x": price, "throughput_x": d.images_per_sec / base.images_per_sec,
                    "images_per_dollar_x": value})
    return out


def tables(groups: dict[str, list[DeviceRow]]) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    for work, rows in groups.items():
        vs = versus(rows)
        t = Table(title=f"devices on {work}",
                  caption=f"x: each device against {vs[0]['baseline']} ({vs[0]['basis']})")
        for h in ("device", "feasible runs", "img/s", "batch", "precision", "img/J", "$/hour",
                  "price", "img/$", "price x", "img/s x", "img/$ x"):
            t.add_column(h, justify="left" if h in ("device", "precision", "price") else "right")
        for d, v in zip(rows, vs, strict=True):
            t.add_row(d.device, str(d.runs), f"{d.images_per_sec:.1f}",
                      str(d.record.knob("loader.batch_size") or "-"),
                      str(d.record.knob("precision.name") or "-"),
                      dash(d.images_per_joule, ".2f"), dash(d.usd_per_hour, ".2f"), d.price_source,
                      dash(d.images_per_dollar, ",.0f"), dash(v["price_x"], ".1f"),
                      f"{v['throughput_x']:.1f}", dash(v["images_per_dollar_x"], ".2f"))
        console.print(t)
        for d, v in zip(rows, vs, strict=True):
            if d.device != v["baseline"] and v["price_x"] is not None:
                console.print(f"{d.device}: {v['price_x']:.1f}x the price of {v['baseline']} "
                              f"for {v['throughput_x']:.1f}x the throughput "
                              f"({v['images_per_dollar_x']:.2f}x the images per dollar)")
        if any(d.price_source is PriceSource.example for d in rows):
            console.print(f"prices marked example are list prices from {EXAMPLE_PRICES_DATE}, "
                          "not yours: pass --prices with cost.usd_per_hour per device")
    return console.export_text()


def main(experiment: str | None, uri: str, prices: dict[str, float]) -> ExitCode:
    """`prices`: load_prices' table, read before the store is asked."""
    groups = compare_rows(mlflow_records(experiment or DEFAULT_EXPERIMENT, uri), prices)
    if not groups:
        print(f"gpubench.report: nothing to compare: no feasible run with results.json in "
              f"experiment {experiment or DEFAULT_EXPERIMENT!r}", file=sys.stderr)
        return ExitCode.FAILED
    print(tables(groups), end="")
    return ExitCode.OK
