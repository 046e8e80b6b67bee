"""Sweep report: ranking, the recommended configuration, plots, a rerunnable experiment YAML.

    python -m gpubench.report outputs/multirun/2026-11-21/10-00-00      # a sweep dir
    python -m gpubench.report gpubench --parent <run id>                 # an MLflow experiment

Reads the results.json of every job (grid sweeps from Hydra's basic sweeper, gpubench sweeper
studies, max-batch probes) or the results.json artifacts of MLflow runs. Writes into
`<sweep dir>/report/`: ranking.csv and ranking.txt, summary.json, PNG plots, and
`experiment/recommended.yaml`, rerun with `python -m gpubench -cd <report dir> experiment=recommended`.

The recommendation follows reference article 003: among feasible configurations (status ok,
peak memory under memory.ceiling) within `tolerance` (5%) of the fastest, keep AMP on when AMP
measured faster, pin_memory on, then the smallest batch size and the fewest loader workers.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpubench.config import CONFIG_DIR
from gpubench.files import flatten, read_json
from gpubench.sweep import format_value, throughput_of

log = logging.getLogger("gpubench")

TOLERANCE = 0.05
REPORT_DIR = "report"
EXPERIMENT_NAME = "recommended"
# short names for the knobs the report reasons about, and where they live in the config
KNOBS = {
    "batch_size": "loader.batch_size",
    "num_workers": "loader.num_workers",
    "precision": "precision.name",
    "pin_memory": "loader.pin_memory",
    "prefetch_factor": "loader.prefetch_factor",
    "preload": "dataset.preload",
    "channels_last": "channels_last",
    "compile": "compile",
    "model": "model.name",
    "image_size": "dataset.image_size",
}
# sections of the config a recommendation consists of; bench (how to measure), tracking and
# fault injection are not part of a training setup
SETUP_KEYS = ("dataset", "model", "loader", "precision", "channels_last", "compile", "memory")
# not knobs: how long a run measured differs between screen and full measurements
NOT_KNOBS = ("bench.", "tracking.", "fault.")
AMP = ("amp_bf16", "amp_fp16")
# rungs measured too briefly to rank speed by: a screen (pruned trials) and a max-batch probe
SHORT_RUNGS = ("screen", "probe")


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One measured configuration."""

    label: str  # trial number, job folder or MLflow run id
    status: str
    throughput: float
    peak: float | None  # peak memory, fraction of the device
    ceiling: float
    flat: dict[str, Any]  # the config, dotted keys
    data: dict = field(default_factory=dict, repr=False)
    dir: str | None = None
    rung: str = "run"  # run, full, screen (pruned after a short measurement), probe

    @property
    def feasible(self) -> bool:
        return self.status == "ok" and self.throughput > 0 and (
            self.peak is None or self.peak <= self.ceiling
        )

    def knob(self, name: str) -> Any:
        key = KNOBS[name]
        v = self.flat.get(key)
        if v is None and name == "precision":  # a study's param is the group, not the key
            v = self.flat.get("precision")
        return v

    @property
    def full(self) -> bool:
        """A full-length measurement, not a short screen or max-batch probe."""
        return self.rung not in SHORT_RUNGS

    @property
    def amp(self) -> bool:
        return self.knob("precision") in AMP


def row_from_results(data: dict, label: str, dir: str | None = None, rung: str = "run") -> Row:
    status = data.get("status", "failed")
    tp = throughput_of(data) if status in ("ok", "over_ceiling") else 0.0
    cfg = data.get("config") or {}
    ceiling = data.get("memory_ceiling") or cfg.get("memory", {}).get("ceiling") or 1.0
    return Row(label, status, tp, data.get("peak_memory_fraction"), float(ceiling),
               flatten(cfg), data, dir, rung)


def load_dir(sweep_dir: Path) -> tuple[list[Row], Any]:
    """Rows of a sweep dir and its Optuna study (None for grid sweeps and max-batch searches).
    A gpubench-sweeper study may span several invocations (resumes): all its trials count."""
    manifest = read_json(sweep_dir / "sweep.json") or {}
    if manifest.get("study_name") and manifest.get("storage"):
        try:
            return _load_study(manifest["study_name"], manifest["storage"])
        except Exception as e:  # a moved or deleted database: the files are still here
            log.warning("study %s not readable (%s): reading the files", manifest["study_name"], e)
    jobs = {j["dir"]: j for j in manifest.get("jobs", [])}
    # a trial measured in full also left its screen's folder: one row per trial
    measured_in_full = {j.get("trial") for j in jobs.values() if j.get("rung") == "full"}
    rows = []
    for p in sorted(sweep_dir.rglob("results.json"), key=_job_order):
        data = read_json(p)
        if data is None or data.get("status") == "running":
            continue
        job = jobs.get(str(p.parent), {})
        rung = job.get("rung", "run")
        if rung == "screen" and job.get("trial") in measured_in_full:
            continue
        label = p.parent.name if p.parent != sweep_dir else "run"
        rows.append(row_from_results(data, label, str(p.parent), rung))
    return rows, None


def _job_order(p: Path):
    n = p.parent.name
    return (0, int(n), "") if n.isdigit() else (1, 0, str(p))


def _load_study(name: str, storage: str):
    import optuna
    from optuna.trial import TrialState

    from gpubench.study import measured_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=storage)
    rows = []
    # all workers' trials; interrupted, duplicate and retried-stale ones are not measurements
    for t in measured_trials(study):
        a = t.user_attrs
        rung = "screen" if t.state == TrialState.PRUNED else a.get("rung", "full")
        data = read_json(Path(a["dir"]) / "results.json") if a.get("dir") else None
        if data is not None:
            rows.append(row_from_results(data, str(t.number), a["dir"], rung))
        else:  # its folder is gone: what the study kept
            status = a.get("status", "failed" if t.state == TrialState.FAIL else "ok")
            rows.append(Row(str(t.number), status, float(a.get("throughput") or 0.0),
                            a.get("peak_memory_fraction"), float(a.get("memory_ceiling") or 1.0),
                            dict(t.params), rung=rung))
    return rows, study


def load_mlflow(experiment: str, uri: str | None = None, parent: str | None = None) -> list[Row]:
    """Rows from the results.json artifacts of an MLflow experiment's runs (children of `parent`
    only, when given). Runs without that artifact (sweep parents) are skipped."""
    import tempfile

    from mlflow.tracking import MlflowClient

    if uri is None:
        from gpubench import tracking

        uri = tracking.resolve_uri(None)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None and experiment.isdigit():
        exp = client.get_experiment(experiment)
    if exp is None:
        raise SystemExit(f"gpubench.report: no MLflow experiment {experiment!r} at {uri}")
    filt = f"tags.mlflow.parentRunId = '{parent}'" if parent else ""
    rows, token = [], None
    with tempfile.TemporaryDirectory() as tmp:
        while True:
            page = client.search_runs([exp.experiment_id], filt, max_results=500, page_token=token)
            for run in page:
                rid = run.info.run_id
                try:
                    path = client.download_artifacts(rid, "results.json", f"{tmp}/{rid}")
                except Exception:
                    continue
                data = read_json(Path(path))
                if data is not None:
                    rows.append(row_from_results(data, rid[:8]))
            token = page.token
            if not token:
                break
    return latest_per_setup(rows)


def latest_per_setup(rows: list[Row]) -> list[Row]:
    """One row per training setup: an experiment collects screens and full measurements of the
    same setup, and repeats across sweeps; keep the longest measurement, then the newest."""
    keep: dict[str, Row] = {}
    for r in rows:
        cfg = r.data.get("config") or {}
        key = json.dumps({k: cfg.get(k) for k in SETUP_KEYS}, sort_keys=True, default=str)
        rank = (int(cfg.get("bench", {}).get("steps") or 0), r.data.get("started_at") or "")
        old = keep.get(key)
        if old is None or rank > old.data.get("_rank", (0, "")):
            r.data["_rank"] = rank
            keep[key] = r
    return list(keep.values())


# --------------------------------------------------------------------------- analysis


def varying(rows: list[Row]) -> list[str]:
    """Config keys that differ between rows: the swept knobs, in a stable order."""
    keys: dict[str, set] = {}
    for r in rows:
        for k, v in r.flat.items():
            if not k.startswith(NOT_KNOBS):
                keys.setdefault(k, set()).add(json.dumps(v, default=str))
    return [k for k, vals in keys.items() if len(vals) > 1 or any(k not in r.flat for r in rows)]


def ranked(rows: list[Row]) -> list[Row]:
    """Feasible first, full-length measurements before short screens, fastest first."""
    return sorted(rows, key=lambda r: (not r.feasible, not r.full, -r.throughput))


@dataclass
class Recommendation:
    best: Row
    chosen: Row
    tolerance: float
    reasons: list[str]


def recommend(rows: list[Row], tolerance: float = TOLERANCE) -> Recommendation | None:
    """Reference article 003's pick: within `tolerance` of the fastest feasible throughput, AMP
    on when it measured faster, pin_memory on, then the smallest batch and the fewest workers
    (large batches can hurt the model and take memory; extra workers cost host RAM). Only
    full-length measurements compete: a screen or a probe is too short to compare speeds."""
    ok = [r for r in rows if r.feasible and r.full]
    if not ok:
        return None
    best = max(ok, key=lambda r: r.throughput)
    near = [r for r in ok if r.throughput >= (1.0 - tolerance) * best.throughput]
    reasons = [f"fastest feasible: {best.throughput:.1f} img/s; {len(near)} configuration(s) "
               f"within {tolerance:.0%} of it"]
    amp, plain = [r for r in ok if r.amp], [r for r in ok if not r.amp]
    if amp and plain:
        a, p = max(r.throughput for r in amp), max(r.throughput for r in plain)
        helps = a > p
        near = [r for r in near if r.amp == helps] or near
        reasons.append(f"AMP {'on' if helps else 'off'}: best with AMP {a:.1f} img/s, without "
                       f"{p:.1f} ({a / p - 1:+.1%})")
    # pinning only exists for copies to a GPU: on a CPU-only run it is not a knob at all
    on_gpu = any((r.data.get("env") or {}).get("device") == "cuda" for r in near)
    pinned = [r for r in near if r.knob("pin_memory") is True]
    if on_gpu and pinned and len(pinned) < len(near):
        near = pinned
        reasons.append("pin_memory on: page-locked buffers make host-to-device copies cheaper")

    def size(r: Row, name: str) -> float:
        v = r.knob(name)
        return math.inf if v is None else float(v)

    chosen = min(near, key=lambda r: (size(r, "batch_size"), size(r, "num_workers"),
                                      -r.throughput))
    picked = [f"{what} ({v})" for what, v in (("smallest batch size", chosen.knob("batch_size")),
                                              ("fewest workers", chosen.knob("num_workers")))
              if v is not None]
    reasons.append(f"{' and '.join(picked) or 'no batch size or workers recorded: the fastest'} within {tolerance:.0%}: "
                   f"{chosen.throughput:.1f} img/s, {chosen.throughput / best.throughput:.0%} "
                   "of the fastest")
    reasons += _workers_check(rows, chosen)
    return Recommendation(best, chosen, tolerance, reasons)


def _workers_check(rows: list[Row], chosen: Row) -> list[str]:
    """The loader phase's view (gpubench.verdict.fewest_workers): how many workers out-run
    compute at the chosen setup's batch size (the loader phase runs no model, so all
    precisions count)."""
    try:
        from gpubench.verdict import fewest_workers
    except ImportError:
        return []
    same = [
        {"num_workers": r.knob("num_workers"), "loader_images_per_sec":
         r.data.get("loader_images_per_sec")}
        for r in rows
        if r.knob("batch_size") == chosen.knob("batch_size") and r.status in ("ok", "over_ceiling")
    ]
    pick = fewest_workers(same, chosen.data.get("compute_images_per_sec"))
    return [f"loader check: {pick.reason}"] if pick.num_workers is not None else []


def overrides_of(row: Row, keys: list[str]) -> list[str]:
    """The row's swept knobs as command-line overrides (`precision=amp_bf16` for a group)."""
    out = []
    for k in keys:
        if k not in row.flat:
            continue
        v = row.flat[k]
        group, _, leaf = k.partition(".")
        if leaf == "name" and (CONFIG_DIR / group / f"{v}.yaml").is_file():
            k = group
        out.append(f"{k}={format_value(v)}")
    return out


# --------------------------------------------------------------------------- outputs


def experiment_yaml(row: Row, source: str, rec: Recommendation | None = None) -> str:
    """The row's setup as a `# @package _global_` overlay that composes back into it."""
    cfg = row.data.get("config") or {}
    setup = {k: cfg[k] for k in SETUP_KEYS if k in cfg}
    groups = []
    for group, value in (("dataset", setup.get("dataset", {}).get("name")),
                         ("model", setup.get("model", {}).get("name")),
                         ("precision", setup.get("precision", {}).get("name"))):
        if value is not None and (CONFIG_DIR / group / f"{value}.yaml").is_file():
            groups.append({f"override /{group}": value})
    head = ["# @package _global_", f"# Recommended by gpubench.report from {source}"]
    if rec is not None:
        head += [f"#   {line}" for line in rec.reasons]
    body = yaml.safe_dump({"defaults": groups, **setup} if groups else setup, sort_keys=False)
    return "\n".join(head) + "\n" + body


def rerun_command(report_dir: Path) -> str:
    return f"python -m gpubench -cd {report_dir.resolve()} experiment={EXPERIMENT_NAME}"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def table_rows(rows: list[Row], keys: list[str]) -> tuple[list[str], list[list[str]]]:
    util_key = "gpu_util_mean" if any(r.data.get("gpu_util_mean") is not None for r in rows) \
        else "process_cpu_util_mean"
    head = ["#", "run", "status", "img/s", "mem %", "gpu util %" if util_key.startswith("gpu")
            else "cpu util %", "verdict", "rung", *keys]
    body = []
    for i, r in enumerate(ranked(rows), 1):
        body.append([
            str(i), r.label, r.status,
            f"{r.throughput:.1f}", "-" if r.peak is None else f"{100 * r.peak:.1f}",
            _fmt(r.data.get(util_key)), _fmt(r.data.get("bottleneck")), r.rung,
            *(_fmt(r.flat.get(k)) for k in keys),
        ])
    return head, body


def print_table(head, body, title: str, out=None, limit: int = 25) -> str:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for h in head:
        t.add_column(h, justify="right" if h in ("#", "img/s", "mem %") else "left")
    for b in body[:limit]:
        t.add_row(*b)
    console = Console(file=out or sys.stdout, width=200, record=True)
    console.print(t)
    if len(body) > limit:
        console.print(f"... {len(body) - limit} more in ranking.csv")
    return console.export_text()


def write_report(rows: list[Row], out_dir: Path, source: str, study=None,
                 tolerance: float = TOLERANCE, quiet: bool = False,
                 fingerprint: list | None = None) -> list[Path]:
    """Everything the report makes; returns the files written. `fingerprint` (what the report
    was made from) is kept in summary.json so an unchanged sweep is not reported twice."""
    from gpubench import report_plots

    out_dir.mkdir(parents=True, exist_ok=True)
    keys = varying(rows)
    files: list[Path] = []
    head, body = table_rows(rows, keys)
    with open(out_dir / "ranking.csv", "w", newline="") as f:
        csv.writer(f).writerows([head, *body])
    files.append(out_dir / "ranking.csv")
    text = print_table(head, body, f"gpubench sweep: {source}", out=None if not quiet else _Null())
    (out_dir / "ranking.txt").write_text(text)
    files.append(out_dir / "ranking.txt")

    rec = recommend(rows, tolerance)
    summary: dict[str, Any] = {"source": source, "rows": len(rows), "tolerance": tolerance,
                               "feasible": sum(r.feasible for r in rows)}
    lines = []
    if rec is None:
        lines.append("no feasible full-length measurement (all OOM, over the memory ceiling or "
                     "failed)" if any(r.full for r in rows) else
                     "no recommendation: only short screens or max-batch probes were measured")
    else:
        exp_dir = out_dir / "experiment"
        exp_dir.mkdir(exist_ok=True)
        yml = exp_dir / f"{EXPERIMENT_NAME}.yaml"
        yml.write_text(experiment_yaml(rec.chosen, source, rec))
        files.append(yml)
        cmd = rerun_command(out_dir)
        summary.update(
            best={"label": rec.best.label, "images_per_sec": rec.best.throughput,
                  "dir": rec.best.dir, "overrides": overrides_of(rec.best, keys)},
            recommended={"label": rec.chosen.label, "images_per_sec": rec.chosen.throughput,
                         "peak_memory_fraction": rec.chosen.peak, "dir": rec.chosen.dir,
                         "overrides": overrides_of(rec.chosen, keys), "yaml": str(yml)},
            reasons=rec.reasons, command=cmd,
        )
        lines += [
            f"fastest feasible: {rec.best.throughput:.1f} img/s  (run {rec.best.label}: "
            f"{' '.join(overrides_of(rec.best, keys))})",
            f"recommended:      {rec.chosen.throughput:.1f} img/s  (run {rec.chosen.label}: "
            f"{' '.join(overrides_of(rec.chosen, keys))})",
            *(f"  - {x}" for x in rec.reasons),
            f"recommended config: {yml}",
            f"rerun it: {cmd}",
        ]
    files += report_plots.plot_all(rows, out_dir, rec, study)
    summary["files"] = [str(f) for f in files]
    if fingerprint is not None:
        summary["fingerprint"] = fingerprint
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    files.append(out_dir / "summary.json")
    if not quiet:
        print("\n".join(lines))
    return files


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


def _fingerprint(rows: list[Row], sweep_dir: Path) -> list:
    """What the report was made from: a second call (the MLflow callback after the sweeper)
    reuses the files when nothing changed."""
    parts = []
    for r in rows:
        p = Path(r.dir or "") / "results.json"
        parts.append([r.label, r.status, p.stat().st_mtime_ns if r.dir and p.is_file() else 0])
    m = sweep_dir / "sweep.json"
    parts.append(["sweep.json", m.stat().st_mtime_ns if m.is_file() else 0])
    return parts


def sweep_report(sweep_dir: str | Path, tolerance: float = TOLERANCE,
                 quiet: bool = False) -> list[Path]:
    """The report of a sweep dir, written to `<sweep_dir>/report/`; returns its files."""
    sweep_dir = Path(sweep_dir).resolve()
    rows, study = load_dir(sweep_dir)
    out = sweep_dir / REPORT_DIR
    stamp = _fingerprint(rows, sweep_dir) + [tolerance]
    old = read_json(out / "summary.json") or {}
    if old.get("fingerprint") == stamp and all(Path(f).is_file() for f in old.get("files", [])):
        return [Path(f) for f in old["files"]] + [out / "summary.json"]
    if not rows:
        raise FileNotFoundError(f"no results.json under {sweep_dir}")
    return write_report(rows, out, str(sweep_dir), study, tolerance, quiet, fingerprint=stamp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpubench.report", description=__doc__.split("\n")[0])
    p.add_argument("source", help="a sweep dir (outputs/multirun/...) or an MLflow experiment")
    p.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help="how far below the fastest a recommended config may be (default 0.05)")
    p.add_argument("--out", help="report folder (default: <sweep dir>/report, or "
                   "outputs/reports/<experiment> for MLflow)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: gpubench's)")
    p.add_argument("--parent", help="MLflow: only the children of this (sweep) run")
    a = p.parse_args(argv)
    src = Path(a.source)
    if src.is_dir():
        if a.out:
            rows, study = load_dir(src.resolve())
            write_report(rows, Path(a.out), str(src.resolve()), study, a.tolerance)
        else:
            sweep_report(src, a.tolerance)
        return 0
    rows = load_mlflow(a.source, a.tracking_uri, a.parent)
    if not rows:
        print(f"gpubench.report: no runs with results.json in experiment {a.source!r}",
              file=sys.stderr)
        return 1
    out = Path(a.out or Path("outputs") / "reports" / a.source)
    write_report(rows, out, f"mlflow experiment {a.source}", None, a.tolerance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
