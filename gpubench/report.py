"""Sweep report: ranking, the recommended configuration, plots, a rerunnable experiment YAML.

    python -m gpubench.report outputs/multirun/2026-11-21/10-00-00      # a sweep dir
    python -m gpubench.report gpubench --parent <run id>                 # an MLflow experiment

Reads the results.json of every job (grid sweeps from Hydra's basic sweeper, gpubench sweeper
studies, max-batch probes) or the results.json artifacts of MLflow runs. Writes into
`<sweep dir>/report/`: ranking.csv and ranking.txt, summary.json, PNG plots, and
`experiment/recommended.yaml`, rerun with `python -m gpubench -cd <report dir> experiment=recommended`.

It ranks full training measurements (an e2e phase measured: no loader-only or compute-only run,
max-batch probe or screen) of one training setup (model, dataset, image size: the newest run's
unless `--where KEY=VALUE` picks the rows), and says in one line what it left out.

The recommendation follows reference article 003: among feasible configurations (status ok,
peak memory under memory.ceiling) within `tolerance` (5%) of the fastest, keep AMP on when AMP
measured faster, pin_memory on, then the smallest batch size and the fewest loader workers.

Why one module of this size: loading rows, the recommendation rule and the files it writes share
the Row and Recommendation types; the plots (report_plots) and the cost comparison (compare)
live apart.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpubench.config import CONFIG_DIR, FaultConfig
from gpubench.files import flatten, read_json
from gpubench.record import SHORT_RUNGS, RunRecord, Status, find_runs, load, missing
from gpubench.report_select import left_out, parse_where, setup_of, training_rows, where
from gpubench.stats import holding, median, median_interval
from gpubench.sweep import format_value

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
# how long and how a run was measured and tracked (dotted prefixes): runs of one setup that
# differ only in these are repeats of one measurement (latest_per_setup pools them); any other
# difference (optimizer, grad_accum_steps, lr, cudnn_benchmark, phases...) is another run
HOW_MEASURED = ("bench.steps", "bench.repeats", "bench.warmup_", "bench.max_seconds",
                "bench.seed", "bench.monitor", "bench.profile", "tracking.")
# fault injection as configured by default (none): a run with any other value is a test of a
# failure path and never pooled with anything
NO_FAULT = {f"fault.{k}": v for k, v in asdict(FaultConfig()).items()}
AMP = ("amp_bf16", "amp_fp16")


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One measured configuration: a run record (gpubench/record.py decides what its status,
    throughput and feasibility mean) and its config as dotted keys."""

    label: str  # trial number, job folder or MLflow run id
    record: RunRecord
    flat: dict[str, Any] = field(default_factory=dict)
    # the sweep's confirm step: the same configuration measured again, interleaved with the
    # other top trials; when present, the figures below pool them with the record
    confirms: list[RunRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.flat:
            self.flat = flatten(self.record.config)

    @property
    def status(self) -> str:
        return self.record.status.value

    @property
    def throughput(self) -> float:
        """The record's throughput; the median over all measurements once confirmed."""
        if self.confirms and self.pooled:
            return median(self.pooled)
        return self.record.throughput

    @property
    def measurements(self) -> list[RunRecord]:
        """The trial's own record, then its confirm step's re-measurements (gpubench.search)."""
        return [self.record, *self.confirms]

    @property
    def pooled(self) -> list[float]:
        """Throughputs of every measurement that measured (a crashed confirm has none)."""
        return [m.throughput for m in self.measurements if m.status.measured]

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% interval of the throughput: over the confirm step's measurements when it ran
        (gpubench.stats.median_interval), else the run's own, over its windows; the figure
        itself when there is nothing to spread over."""
        if self.confirms:
            return holding(median_interval(self.pooled), self.throughput)
        return self.record.throughput_interval

    @property
    def peak(self) -> float | None:
        return self.record.peak_memory_fraction

    @property
    def ceiling(self) -> float:
        return self.record.memory_ceiling

    @property
    def data(self) -> dict:
        return self.record.to_dict()

    @property
    def dir(self) -> str | None:
        return str(self.record.dir) if self.record.dir is not None else None

    @property
    def rung(self) -> str:
        return self.record.rung

    @property
    def feasible(self) -> bool:
        return self.record.feasible

    @property
    def full(self) -> bool:
        return self.record.full

    @property
    def stable(self) -> bool:
        """False when the run itself found its measurement disturbed (noise_reasons); once
        confirmed, also when any re-measurement was disturbed or did not measure, or when the
        measurements disagree: their own intervals share no common figure."""
        ms = self.measurements
        if any(m.measurement_stable is False or not m.status.measured for m in ms):
            return False
        ivs = [m.throughput_interval for m in ms]
        return max(lo for lo, _ in ivs) <= min(hi for _, hi in ivs)

    @property
    def confirmed(self) -> bool:
        """Re-measured by the confirm step and found stable."""
        return bool(self.confirms) and self.stable

    def knob(self, name: str) -> Any:
        key = KNOBS[name]
        v = self.flat.get(key)
        if v is None and name == "precision":  # a study's param is the group, not the key
            v = self.flat.get("precision")
        return v

    @property
    def amp(self) -> bool:
        return self.knob("precision") in AMP


def row_of(rec: RunRecord, label: str) -> Row:
    return Row(label, rec)


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
    rows, confirms, full_rows = [], {}, {}
    for d in sorted(find_runs(sweep_dir), key=_job_order):
        job = jobs.get(str(d), {})
        rung = job.get("rung", "run")
        rec = load(d, rung)
        if rec is None or not rec.status.final:
            continue
        if rung == "screen" and job.get("trial") in measured_in_full:
            continue
        if rung == "confirm":  # pooled into its trial's row, not a row of its own
            confirms.setdefault(job.get("trial"), []).append(rec)
            continue
        rows.append(row_of(rec, d.name if d != sweep_dir else "run"))
        if rung == "full":
            full_rows[job.get("trial")] = rows[-1]
    for trial, recs in confirms.items():
        if trial in full_rows:
            full_rows[trial].confirms = recs
    return rows, None


def _job_order(d: Path):
    n = d.name
    return (0, int(n), "") if n.isdigit() else (1, 0, str(d))


def _load_study(name: str, storage: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=storage)
    return rows_of_study(study), study


def rows_of_study(study) -> list[Row]:
    """One row per measured trial of a gpubench-sweeper study, its confirm step's records
    attached (gpubench.study.confirm_dirs)."""
    from optuna.trial import TrialState

    from gpubench.study import confirm_dirs, measured_trials

    rows = []
    # all workers' trials; interrupted, duplicate and retried-stale ones are not measurements
    for t in measured_trials(study):
        a = t.user_attrs
        rung = "screen" if t.state == TrialState.PRUNED else a.get("rung", "full")
        rec = load(a["dir"], rung) if a.get("dir") else None
        if rec is not None:
            rows.append(row_of(rec, str(t.number)))
        else:  # its folder is gone: what the study kept
            status = a.get("status", "failed" if t.state == TrialState.FAIL else "ok")
            rec = RunRecord(status=Status(status) if status in Status.__members__ else
                            Status.failed, images_per_sec=a.get("throughput"),
                            peak_memory_fraction=a.get("peak_memory_fraction"),
                            memory_ceiling=float(a.get("memory_ceiling") or 1.0), rung=rung)
            rows.append(Row(str(t.number), rec, dict(t.params)))
        # a confirm folder gone missing is a measurement that cannot be shown: it counts as one
        # that did not measure, so the trial is not called confirmed on fewer figures
        rows[-1].confirms = [load(d, "confirm") or missing(d, "confirm record gone", "confirm")
                             for d in confirm_dirs(study, t.number)]
    return rows


def load_mlflow(experiment: str, uri: str | None = None, parent: str | None = None,
                study: str | None = None, conditions: dict[str, str] | None = None) -> list[Row]:
    """Rows from the results.json artifacts of an MLflow experiment's runs (children of `parent`
    only, or the jobs of every worker of one Optuna `study`, when given). Runs without that
    artifact (sweep parents) are skipped."""
    if parent and not re.fullmatch(r"[0-9a-f]{32}", parent):
        raise SystemExit(f"gpubench.report: --parent={parent!r} is not allowed: an MLflow run id "
                         "(32 hex digits)")
    if study and not re.fullmatch(r"[\w.\-]+", study):
        raise SystemExit(f"gpubench.report: --study={study!r} is not allowed: letters, digits, "
                         "'.', '_' or '-'")
    filt = " and ".join(([f"tags.mlflow.parentRunId = '{parent}'"] if parent else [])
                        + ([f"tags.study = '{study}'"] if study else []))
    from gpubench.compare import mlflow_records

    rows = [row_of(rec, rec.extra.pop("mlflow_run_id", "?")[:8])
            for rec in mlflow_records(experiment, uri, filt)]
    return latest_per_setup(where(rows, conditions or {}))


def latest_per_setup(rows: list[Row]) -> list[Row]:
    """One row per training setup: an experiment collects screens and full measurements of the
    same setup, and repeats across sweeps (a sweep's confirm step among them). The row is the
    newest of the longest measurements; the others of that length that repeat it exactly
    (`repeats`) are pooled as a sweep dir's confirm jobs are (Row.confirms): dropping them
    would throw measurements away and let one lucky run stand for the setup."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        cfg = r.record.config
        # a loader-only run or a probe is another kind of measurement of the setup: never
        # the row that stands for (and hides) its training measurement
        key = json.dumps({**{k: cfg.get(k) for k in SETUP_KEYS}, "kind": left_out(r.record)},
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    out = []
    for group in groups.values():
        def steps(r: Row) -> int:
            return int(r.record.config.get("bench", {}).get("steps") or 0)

        longest = max(steps(r) for r in group)
        same = sorted((r for r in group if steps(r) == longest),
                      key=lambda r: r.record.started_at or "", reverse=True)
        head = same[0]
        head.confirms = [r.record for r in same[1:]
                         if r.record.status.final and repeats(r.record, head.record)]
        out.append(head)
    return out


def _what_ran(rec: RunRecord) -> dict[str, Any]:
    return {k: v for k, v in flatten(rec.config or {}).items() if not k.startswith(HOW_MEASURED)}


def faulted(rec: RunRecord) -> bool:
    """The run had fault injection configured (any fault.* off its default)."""
    cfg = flatten(rec.config or {})
    return any(cfg.get(k, v) != v for k, v in NO_FAULT.items())


def repeats(rec: RunRecord, of: RunRecord) -> bool:
    """`rec` measured the same thing as `of` again: the whole config equal except how long and
    how it was measured and tracked (HOW_MEASURED), on the same device model, and neither had
    fault injection."""
    return (rec.env.get("device_name") == of.env.get("device_name")
            and not faulted(rec) and not faulted(of) and _what_ran(rec) == _what_ran(of))


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
    """Feasible first, full-length measurements before short screens, stable before disturbed,
    fastest first."""
    return sorted(rows, key=lambda r: (not r.feasible, not r.full, not r.stable, -r.throughput))


@dataclass
class Recommendation:
    best: Row
    chosen: Row
    tolerance: float
    reasons: list[str]


def _iv(r: Row) -> str:
    lo, hi = r.interval
    return f"{r.throughput:.1f}" if lo == hi else f"{r.throughput:.1f} [{lo:.1f}-{hi:.1f}]"


def near_best(r: Row, best: Row, tolerance: float) -> bool:
    """Within `tolerance` of the best, judged on intervals: even the low end of the row's
    interval reaches (1 - tolerance) of the best's median. A noisy row that only might be
    that fast does not qualify, so noise never picks a smaller, slower configuration."""
    return r is best or r.interval[0] >= (1.0 - tolerance) * best.throughput


def amp_effect(amp: Row, plain: Row) -> str:
    """'faster', 'slower' or 'same': AMP's best against the best without it, on intervals."""
    if amp.interval[0] > plain.interval[1]:
        return "faster"
    if amp.interval[1] < plain.interval[0]:
        return "slower"
    if amp.interval == (amp.throughput, amp.throughput) and plain.interval == (
            plain.throughput, plain.throughput):  # single windows: the figures decide
        return "faster" if amp.throughput > plain.throughput else "slower"
    return "same"


def recommend(rows: list[Row], tolerance: float = TOLERANCE) -> Recommendation | None:
    """Reference article 003's pick: among full-length, feasible, stable measurements within
    `tolerance` of the fastest (on intervals), AMP on when it measured faster beyond the
    intervals, pin_memory on, then the smallest batch and the fewest workers (large batches
    can hurt the model and take memory; extra workers cost host RAM). A screen or a probe is
    too short to compare speeds; a run that found its own measurement disturbed is never the
    recommendation, and the report says when the fastest figure came from one."""
    full = [r for r in rows if r.feasible and left_out(r.record) is None]
    ok = [r for r in full if r.stable]
    reasons = []
    if full and not ok:
        ok = full
        reasons.append("UNCONFIRMED: every measurement found itself disturbed (noise_reasons); "
                       "rerun the recommended config on a quiet machine before trusting it")
    if not ok:
        return None
    # once the confirm step ran, the reference is the fastest confirmed configuration: a trial
    # measured once may have been lucky
    best = max([r for r in ok if r.confirmed] or ok, key=lambda r: r.throughput)
    if any(r.confirms for r in rows) and not best.confirmed:
        reasons.append("UNCONFIRMED: no top trial measured alike when re-measured (confirm "
                       "step); rerun the recommended config on a quiet machine before trusting it")
    fastest = max(full, key=lambda r: r.throughput)
    if fastest is not best:
        reasons.append(f"the fastest figure, run {fastest.label} at {_iv(fastest)} img/s, "
                       f"{why_not_best(fastest)}: not recommended unconfirmed; rerun it on a "
                       "quiet machine")
    near = [r for r in ok if near_best(r, best, tolerance)]
    lead = 1 if reasons and reasons[0].startswith("UNCONFIRMED") else 0
    reasons.insert(lead, f"fastest {'stable ' if best.stable else ''}feasible: {_iv(best)} img/s; {len(near)} configuration(s)"
                      f" within {tolerance:.0%} of it on their intervals")
    amp, plain = [r for r in ok if r.amp], [r for r in ok if not r.amp]
    if amp and plain:
        a = max(amp, key=lambda r: r.throughput)
        p = max(plain, key=lambda r: r.throughput)
        effect = amp_effect(a, p)
        change = f"{a.throughput / p.throughput - 1:+.1%}"
        if effect == "same":
            reasons.append(f"AMP made no measurable difference: with AMP {_iv(a)} img/s, without "
                           f"{_iv(p)} ({change}, inside the intervals)")
        else:
            helps = effect == "faster"
            near = [r for r in near if r.amp == helps] or near
            reasons.append(f"AMP {'on' if helps else 'off'}: best with AMP {_iv(a)} img/s, "
                           f"without {_iv(p)} ({change})")
    # pinning only exists for copies to a GPU: on a CPU-only run it is not a knob at all
    on_gpu = any(r.record.env.get("device") == "cuda" for r in near)
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
    reasons.append(f"{' and '.join(picked) or 'no batch size or workers recorded: the fastest'}"
                   f" within {tolerance:.0%}: {_iv(chosen)} img/s, "
                   f"{chosen.throughput / best.throughput:.0%} of the fastest")
    reasons += _workers_check(rows, chosen)
    return Recommendation(best, chosen, tolerance, reasons)


def why_not_best(r: Row) -> str:
    """Why the fastest figure is not the reference, from the row itself: its own measurement
    found itself disturbed, its confirm step's re-measurements were disturbed or disagreed, or
    it was measured once while the confirm step re-measured other trials."""
    own = r.record
    if own.measurement_stable is False:
        why = ", ".join(own.noise_reasons) or "noise_reasons not recorded"
        return f"was measured unstable ({why})"
    if r.confirms and not r.stable:
        return (f"was not confirmed: its {len(r.confirms)} re-measurement(s) by the confirm step "
                "were disturbed, failed or disagreed with it")
    return ("is unconfirmed: its own measurement found no disturbance, but the confirm step "
            "re-measured other trials, not this one")


def recommendation(sweep_dir: Path, tolerance: float = TOLERANCE) -> Recommendation | None:
    """What the report of a sweep dir recommends (the rows it ranks, then `recommend`)."""
    rows, _ = load_dir(Path(sweep_dir).resolve())
    return recommend(training_rows(rows)[0], tolerance)


def _workers_check(rows: list[Row], chosen: Row) -> list[str]:
    """The loader phase's view (gpubench.verdict.fewest_workers): how many workers out-run
    compute at the chosen setup's batch size (the loader phase runs no model, so all
    precisions count)."""
    from gpubench.verdict import fewest_workers

    same = [
        {"num_workers": r.knob("num_workers"),
         "loader_images_per_sec": r.record.loader_images_per_sec}
        for r in rows
        if r.knob("batch_size") == chosen.knob("batch_size") and r.record.status.measured
    ]
    pick = fewest_workers(same, chosen.record.compute_images_per_sec)
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
    cfg = row.record.config
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
    util_key = "gpu_util_mean" if any(r.record.gpu_util_mean is not None for r in rows) \
        else "process_cpu_util_mean"
    head = ["#", "run", "status", "img/s", "95% interval", "mem %", "gpu util %"
            if util_key.startswith("gpu") else "cpu util %", "verdict", "stable", "rung", *keys]
    body = []
    for i, r in enumerate(ranked(rows), 1):
        lo, hi = r.interval
        body.append([
            str(i), r.label, r.status,
            f"{r.throughput:.1f}", "-" if lo == hi else f"{lo:.1f}-{hi:.1f}",
            "-" if r.peak is None else f"{100 * r.peak:.1f}",
            _fmt(getattr(r.record, util_key)), _fmt(r.record.bottleneck),
            "-" if r.record.measurement_stable is None and not r.confirms
            else ("yes" if r.stable else "NO"),
            # a confirmed row's figures pool its re-measurements: say how many
            r.rung + (f"+{len(r.confirms)} confirm" if r.confirms else ""),
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
    # rank and recommend full training measurements of one setup; when there are none (a
    # max-batch search's probes), the table still shows what was measured
    kept, notes = training_rows(rows)
    # the plots still show the same setup's screens and probes (hollow, never on a curve)
    shown = kept + [r for r in rows if r.rung in SHORT_RUNGS
                    and setup_of(r) in {setup_of(k) for k in kept}] if kept else rows
    rows = kept or rows
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
    lines = list(notes)
    if rec is None:
        lines.append("no feasible full-length measurement (all OOM, over the memory ceiling or "
                     "failed)" if kept else
                     "no recommendation: no full training measurement (only screens, max-batch "
                     "probes or runs without an e2e phase)")
    else:
        exp_dir = out_dir / "experiment"
        exp_dir.mkdir(exist_ok=True)
        yml = exp_dir / f"{EXPERIMENT_NAME}.yaml"
        yml.write_text(experiment_yaml(rec.chosen, source, rec))
        files.append(yml)
        cmd = rerun_command(out_dir)
        summary.update(
            best={"label": rec.best.label, "images_per_sec": rec.best.throughput,
                  "images_per_sec_ci": list(rec.best.interval),
                  "dir": rec.best.dir, "overrides": overrides_of(rec.best, keys)},
            recommended={"label": rec.chosen.label, "images_per_sec": rec.chosen.throughput,
                         "images_per_sec_ci": list(rec.chosen.interval),
                         "peak_memory_fraction": rec.chosen.peak, "dir": rec.chosen.dir,
                         "overrides": overrides_of(rec.chosen, keys), "yaml": str(yml)},
            reasons=rec.reasons, command=cmd,
        )
        lines += [
            f"fastest feasible: {_iv(rec.best)} img/s  (run {rec.best.label}: "
            f"{' '.join(overrides_of(rec.best, keys))})",
            f"recommended:      {_iv(rec.chosen)} img/s  (run {rec.chosen.label}: "
            f"{' '.join(overrides_of(rec.chosen, keys))})",
            *(f"  - {x}" for x in rec.reasons),
            f"recommended config: {yml}",
            f"rerun it: {cmd}",
        ]
    files += report_plots.plot_all(shown, out_dir, rec, study)
    summary["files"] = [str(f) for f in files]
    summary["lines"] = lines  # printed again when the report is up to date (cached)
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


class NothingToReport(FileNotFoundError):
    """No finished run to report on: main prints its one line and exits 1."""


def sweep_report(sweep_dir: str | Path, tolerance: float = TOLERANCE,
                 quiet: bool = False, conditions: dict[str, str] | None = None) -> list[Path]:
    """The report of a sweep dir (its rows matching `conditions`, --where), written to
    `<sweep_dir>/report/`; returns its files."""
    sweep_dir = Path(sweep_dir).resolve()
    rows, study = load_dir(sweep_dir)
    rows = where(rows, conditions or {})
    out = sweep_dir / REPORT_DIR
    stamp = _fingerprint(rows, sweep_dir) + [tolerance] + sorted((conditions or {}).items())
    old = read_json(out / "summary.json") or {}
    if old.get("fingerprint") == stamp and all(Path(f).is_file() for f in old.get("files", [])):
        if not quiet:  # up to date: say what it says, so an unchanged sweep never looks broken
            print((out / "ranking.txt").read_text().rstrip("\n"))
            print("\n".join(old.get("lines") or []))
            print(f"(report up to date: {out})")
        return [Path(f) for f in old["files"]] + [out / "summary.json"]
    if not rows:
        raise NothingToReport(f"gpubench.report: nothing to report: no finished run "
                              f"(results.json){_matching(conditions)} under {sweep_dir}")
    return write_report(rows, out, str(sweep_dir), study, tolerance, quiet, fingerprint=stamp)


def _matching(conditions: dict[str, str] | None) -> str:
    return "".join(f" with {k}={v}" for k, v in (conditions or {}).items())


def looks_like_path(source: str) -> bool:
    """A source written as a folder (a path separator, or starting with '.' or '~'), not an
    MLflow experiment name."""
    return "/" in source or "\\" in source or source.startswith((".", "~"))


def mlflow_out_dir(experiment: str, parent: str | None, study: str | None) -> Path:
    """outputs/reports/<experiment>, -parent-<first 8 of its id> or -study-<name>: a report
    of part of an experiment never overwrites the whole experiment's."""
    name = experiment + (f"-parent-{parent[:8]}" if parent else "") + (
        f"-study-{study}" if study else "")
    return Path("outputs") / "reports" / name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpubench.report", description=__doc__.split("\n")[0])
    p.add_argument("source", nargs="?",
                   help="a sweep dir (outputs/multirun/...) or an MLflow experiment")
    p.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help="how far below the fastest a recommended config may be (default 0.05)")
    p.add_argument("--out", help="report folder (default: <sweep dir>/report, or "
                   "outputs/reports/<experiment> for MLflow)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: gpubench's)")
    p.add_argument("--parent", help="MLflow: only the children of this (sweep) run")
    p.add_argument("--study", help="MLflow: the jobs of every worker of this Optuna study")
    p.add_argument("--compare", nargs="?", const="", default=None, metavar="EXPERIMENT",
                   help="compare devices over an MLflow experiment's runs: images/sec, images "
                   "per joule, images per dollar (see docs/report.md)")
    p.add_argument("--prices", help="--compare: a YAML of cost.usd_per_hour per device name")
    p.add_argument("--where", action="append", metavar="KEY=VALUE",
                   help="only runs whose config has KEY=VALUE (repeatable), e.g. "
                   "--where model.name=resnet50")
    a = p.parse_args(argv)
    conditions = parse_where(a.where)
    if a.compare is not None:
        from gpubench import compare

        return compare.main(a.compare or a.source, a.tracking_uri, a.prices)
    if a.source is None:
        p.error("a sweep dir or an MLflow experiment is required")
    src = Path(a.source).expanduser()
    if not src.is_dir() and looks_like_path(a.source):
        print(f"gpubench.report: no such folder: {a.source}", file=sys.stderr)
        return 1
    # a bare name is a folder only when it holds runs: `gpubench` in the project's root is the
    # package, and the default MLflow experiment
    if src.is_dir() and (looks_like_path(a.source) or (src / "sweep.json").is_file()
                         or find_runs(src)):
        try:
            if a.out:
                rows, study = load_dir(src.resolve())
                rows = where(rows, conditions)
                if not rows:
                    raise NothingToReport(f"gpubench.report: nothing to report: no finished run "
                                          f"(results.json){_matching(conditions)} under "
                                          f"{src.resolve()}")
                write_report(rows, Path(a.out), str(src.resolve()), study, a.tolerance)
            else:
                sweep_report(src, a.tolerance, conditions=conditions)
        except NothingToReport as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    rows = load_mlflow(a.source, a.tracking_uri, a.parent, a.study, conditions)
    if not rows:
        print(f"gpubench.report: no runs with results.json{_matching(conditions)} in experiment "
              f"{a.source!r}", file=sys.stderr)
        return 1
    out = Path(a.out) if a.out else mlflow_out_dir(a.source, a.parent, a.study)
    write_report(rows, out, f"mlflow experiment {a.source}", None, a.tolerance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
