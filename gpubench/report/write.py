"""Sweep report (ranking, recommended config, plots, a rerunnable experiment YAML) into
`<sweep dir>/report/`, from a sweep dir's or an MLflow experiment's runs."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich import box
from rich.console import Console
from rich.text import Text

from gpubench.analysis import recommend
from gpubench.analysis.recommend import TOLERANCE, Recommendation, Row, Steadiness, with_interval
from gpubench.analysis.select import setup_of, training_rows, where
from gpubench.config.errors import ConfigError
from gpubench.config.keys import Role, lookup
from gpubench.config.knobs import knob_name, role
from gpubench.config.overrides import format_value
from gpubench.config.schema import walk
from gpubench.core.exits import Refusal
from gpubench.core.files import check_no_links, inside, read_json, write_text
from gpubench.core.pipe import QUEUE_WINDOWS
from gpubench.core.record import (
    RunRecord,
    Status,
    longer,
    phase_plan,
    window_plan,
    window_text,
    windows_of,
)
from gpubench.core.secrets import mask_secrets
from gpubench.core.stats import count
from gpubench.report.compare import mlflow_records
from gpubench.report.console import fit, say
from gpubench.report.loader_answer import loader_answer, read_compute, sweep_compute
from gpubench.report.plot_rules import as_override, group_of
from gpubench.search.manifest import PIPES_FILE
from gpubench.search.rows import setups

REPORT_DIR = "report"
EXPERIMENT_NAME = "recommended"
# said under the printed table: why a slower row can rank above a faster one
RANK_ORDER = ("ranked: feasible first (status), full length before screens, stable or confirmed "
              "before flagged (its flaws named) or disagreed, then img/s")
# the printed ranking's columns that give way in a narrow terminal: these, the knobs (moved below
# the table), then the last; the rank, the run and its img/s always stay
GIVES_WAY_FIRST = ("gpu %", "cpu %", "mem %", "rung", "verdict")
GIVES_WAY_LAST = ("status", "interval")
STAYS = ("#", "run", "img/s")
FILE_WIDTH = 120  # the width of ranking.txt: a log's


def check_filters(parent: str | None, study: str | None) -> None:
    """--parent and --study go into MLflow's filter string: a ConfigError unless plain."""
    for name, v, form, what in (
            ("parent", parent, r"[0-9a-f]{32}", "an MLflow run id (32 hex digits)"),
            ("study", study, r"[\w.\-]+", "letters, digits, '.', '_' or '-'")):
        if v and not re.fullmatch(form, v):
            raise ConfigError(f"--{name}", v, what)


def load_mlflow(experiment: str, uri: str, parent: str | None = None,
                study: str | None = None, conditions: dict[str, str] | None = None) -> list[Row]:
    """Rows from an MLflow experiment's results.json (only `parent`'s children, or one study's)."""
    check_filters(parent, study)
    filt = " and ".join(f for f in (parent and f"tags.mlflow.parentRunId = '{parent}'",
                                    study and f"tags.study = '{study}'") if f)
    rows = [recommend.Row(rec.extra.get("mlflow_run_id", "?")[:8], rec)
            for rec in mlflow_records(experiment, uri, filt)]
    return recommend.latest_per_setup(where(rows, conditions or {}))


def overrides_of(row: Row, keys: list[str]) -> list[str]:
    """The row's swept knobs that act in it, as overrides (`precision=amp_bf16` for a group)."""
    return [as_override(k, row.flat[k]) for k in keys if k in row.flat and recommend.acting(row, k)]


def measurement_text(cfg: dict, cut_short: bool = False) -> str:
    """`6 windows of 4 steps on each of loader, compute, e2e`, the loader's longer, the cap."""
    b, ld = cfg.get("bench") or {}, cfg.get("loader") or {}
    phases = ", ".join(b.get("phases") or ()) or "?"
    try:
        windows, per_window = window_plan(b["steps"], b["repeats"])
        loader = phase_plan("loader", b["steps"], b["repeats"], ld)[1]
    except (KeyError, TypeError, ValueError):  # not a record's config
        return (f"bench.steps={b.get('steps', '?')} bench.repeats={b.get('repeats', '?')} on "
                f"{phases}")
    names, mws = list(b.get("phases") or ()), b.get("min_window_s")
    longer_loader = loader > per_window and "loader" in names
    if longer_loader:  # said apart: "each of loader, e2e" then "the loader's" read as one window
        names.remove("loader")
    each = "each of " if len(names) > 1 else ""
    text = f"{windows_of(windows, per_window, mws)} on {each}{', '.join(names) or phases}"
    if longer_loader:
        queue = f"on loader ({QUEUE_WINDOWS}x the batches its workers hold in flight)"
        text = (f"{text}, and of {window_text(loader, mws)} {queue}" if names
                else f"{windows_of(windows, loader, mws)} {queue}")
    if cut_short:
        text += f", cut short by bench.max_seconds={b.get('max_seconds', '?')}"
    return text


def run_text(row: Row, keys: list[str]) -> str:
    over = " ".join(overrides_of(row, keys))
    return f"run {row.label}" + (f": {over}" if over else "")


def experiment_yaml(row: Row, source: str, rec: Recommendation | None = None,
                    made: str = "sweep") -> str:
    """The row's setup and measurement as an overlay composing back into its config."""
    cfg = row.record.config
    setup = _interpolations_kept({k: cfg[k] for k in recommend.RERUN_KEYS if k in cfg},
                                 row.record.dir)
    # each section named after one of its group's configs: that config, then its values
    groups = [{f"override /{g}": v} for g, section in setup.items() if isinstance(section, dict)
              and (v := section.get("name")) is not None and group_of(f"{g}.name", v) == g]
    head = ["# @package _global_", f"# Recommended by gpubench.report from {source}"]
    head += [f"#   {line}" for line in rec.reasons] if rec is not None else []
    if "bench" in setup:
        how = measurement_text(cfg, row.record.cut_short)
        head += [f"# bench: the {made}'s own measurement ({how}), so a "
                 "rerun's figure compares with the interval above;",
                 f"#   to measure longer, add {longer(row.record)} to the rerun command "
                 f"(narrower intervals, no longer the {made}'s measurement)"]
    body = yaml.safe_dump({"defaults": groups, **setup} if groups else setup, sort_keys=False)
    return "\n".join(head) + "\n" + body


def _interpolations_kept(setup: dict, run_dir: Path | None) -> dict:
    """`setup` (resolved) with the run's own interpolations back where they resolve to the same
    value here (a pinned num_classes 10 would stay 10 in a rerun given another dataset); one
    resolving elsewhere (a team's root key, an env var) stays the recorded value."""
    try:
        composed = yaml.safe_load((Path(run_dir) / ".hydra" / "config.yaml").read_text())
    except (OSError, TypeError, yaml.YAMLError):  # no run folder (an MLflow source), no file
        return setup
    kept = OmegaConf.create(setup)
    for key, _ in walk(kept):
        raw = lookup(composed, key)  # as the run composed it, unresolved
        if isinstance(raw, str) and "${" in raw:
            trial = kept.copy()
            OmegaConf.update(trial, key, raw)
            try:
                same = OmegaConf.select(trial, key, throw_on_missing=True) == OmegaConf.select(
                    kept, key)
            except OmegaConfBaseException:
                same = False
            if same:
                OmegaConf.update(kept, key, raw)
    return OmegaConf.to_container(kept)


def _fmt(v: Any) -> str:
    """A cell: a knob's value as its override and legend write it (`true`, not `True`)."""
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else format_value(v)


def table_rows(rows: list[Row], keys: list[str], screen: bool = False
               ) -> tuple[list[str], list[list[str]]]:
    """ranking.csv's columns; `screen`: the printed ones (a feasible row's steadiness as its
    status, the rung only when rows differ in it, knobs by short name)."""
    gpu = any(r.record.gpu_util_mean is not None for r in rows)
    util = "gpu_util_mean" if gpu else "process_cpu_util_mean"
    label = recommend.interval_label(rows)
    # a probe or a screen says so where it is listed (alone, it had no mark of what it was)
    with_rung = not screen or len({r.rung for r in rows}) > 1 or any(
        not r.record.full for r in rows)
    # printed: two header lines (`>=95%` over `interval`), as narrow as the figures below
    shown = label.replace("at least ", "\u2265").replace(" ", "\n")
    head = ["#", "run", "status", "img/s", shown if screen else label,
            "mem %", ("gpu" if gpu else "cpu") + (" %" if screen else " util %"), "verdict",
            *([] if screen else ["measured"]), *(["rung"] if with_rung else []),
            *(knob_header(k) if screen else k for k in keys)]
    body = []
    for i, r in enumerate(recommend.ranked(rows), 1):
        lo, hi = r.interval
        fmt = ".0f" if screen and hi >= 100 else ".1f"
        steady = r.record.status is Status.ok and r.steadiness is not Steadiness.unchecked
        body.append([
            str(i), r.label,
            r.status if not screen else r.standing if steady else str(r.record.status),
            f"{r.throughput:.1f}", "-" if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}",
            "-" if r.peak is None else f"{100 * r.peak:.1f}",
            _fmt(getattr(r.record, util)), _fmt(r.record.bottleneck),
            *([] if screen else [r.standing]),
            # a confirmed row's figures pool its re-measurements: say how many
            *([f"{r.rung}" + (f"+{len(r.confirms)} confirm" if r.confirms and not screen
                              else "")] if with_rung else []),
            # a knob that does not act in the row reads as one its run did not have
            *(_fmt(r.flat.get(k)) if recommend.acting(r, k) else "-" for k in keys)])
    return head, body


def knob_header(key: str) -> str:
    """A short name a word a line; else broken after each dot only (`_name` must undo it)."""
    name = knob_name(key)
    return name.replace(".", ".\n") if "." in name else name.replace("_", "\n")


def _name(header: str) -> str:
    """A column's name on one line: a knob's as knob_header had it, the others' words apart."""
    if "%" in header or "interval" in header:
        return header.replace("\n", " ")
    return header.replace(".\n", ".").replace("\n", "_")


def print_table(head: list[str], body: list[list[str]], title: str, console=None,
                limit: int = 25) -> None:
    """The ranking fitted to `console`'s width (stdout's by default): no value split or cut."""
    con = console or Console(highlight=False)
    shown_rows = body[:limit]
    kinds = ["interval" if "interval" in h else h for h in head]
    knobs = [c for c, k in enumerate(kinds) if k not in (*STAYS, *GIVES_WAY_FIRST, *GIVES_WAY_LAST)]
    order = ([c for k in GIVES_WAY_FIRST for c in range(len(head)) if kinds[c] == k] + knobs[::-1]
             + [c for k in GIVES_WAY_LAST for c in range(len(head)) if kinds[c] == k])
    # as text: a value such as [loader,e2e] is no markup; no vertical rules: width for figures
    table, out = fit(head, [[Text(v) for v in b] for b in shown_rows], order, con.width,
                     lambda c: head[c] in ("#", "img/s", "mem %"), box=box.SIMPLE_HEAD,
                     show_edge=False, pad_edge=False, collapse_padding=True)
    con.print(Text(title), soft_wrap=True)  # a path is a value too: never folded
    con.print(table)
    moved = [c for c in knobs if c in out]
    below = [f"  {b[0]}. run {b[1]}: " + " ".join(f"{_name(head[c])}={b[c]}" for c in moved)
             for b in shown_rows] if moved else []
    if left := [_name(head[c]) for c in out if c not in knobs]:
        below.append(f"(left out at {con.width} columns: {', '.join(left)}; ranking.csv has "
                     "every column)")
    below.append(RANK_ORDER)
    if len(body) > limit:
        below.append(f"... {len(body) - limit} more in ranking.csv")
    for line in below:  # to a pipe or a file: lines whole, the reader's viewer wraps them
        con.print(Text(line), soft_wrap=not con.is_terminal)


def print_lines(lines: list[str], console=None) -> None:
    """Folded between words in a terminal (its own breaks a figure); a command stays whole."""
    con = console or Console(highlight=False)
    for line in lines:
        say(con, Text(line), whole="python -m " in line)


@dataclass(frozen=True)
class Source:
    """What a report is made from: `arg` (a sweep folder, an MLflow experiment's name)."""

    arg: str
    mlflow: bool = False
    uri: str | None = None  # the MLflow store named on the command line (--tracking-uri)

    def __str__(self) -> str:
        return f"mlflow experiment {self.arg}" if self.mlflow else self.arg

    @property
    def args(self) -> str:
        """Its part of a `python -m gpubench.report` command line, quoted (a password masked)."""
        uri = f" --tracking-uri {shlex.quote(mask_secrets(self.uri))}" if self.uri else ""
        return shlex.quote(self.arg) + uri


def write_report(rows: list[Row], out_dir: Path, source: str | Source, study=None,
                 tolerance: float = TOLERANCE, quiet: bool = False,
                 fingerprint: list | None = None, found: list[RunRecord] = (),
                 named: list[RunRecord] = (), pipes: dict | None = None,
                 refused: list[Refusal] = ()) -> list[Path]:
    """Writes everything; returns the files. `fingerprint`: what it was made from; `found`,
    `named`: compute runs for the workers answer; `refused`: jobs refused as bad input."""
    from gpubench.report import plots as report_plots
    from gpubench.search.pipes import lines as pipes_lines

    check_no_links(out_dir)  # nothing written here leads out of it, nor replaces what is not ours
    new = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    # rank full training measurements of one setup; without any the table shows what measured
    all_rows = rows
    kept, notes = training_rows(rows)
    arg = (source if isinstance(source, Source) else Source(source)).args
    source = str(source)
    answer = loader_answer(rows, list(found), list(named), arg, tolerance)
    if answer is not None and not kept:
        # a loader-only sweep: its table and plots are its loader runs, its answer the workers'
        notes = [f"no training ranking: no run measured a training step (e2e); the table lists "
                 f"the {count(len(answer.rows), 'loader-only run')} by loader img/s"]
        rows = answer.rows
    # the plots still show the same setup's screens and probes (hollow, never on a curve)
    shown = kept + [r for r in rows if not r.record.full
                    and setup_of(r) in {setup_of(k) for k in kept}] if kept else rows
    rows = kept or rows
    keys = recommend.varying(rows)
    table, text = io.StringIO(newline=""), io.StringIO()
    head, body = table_rows(rows, keys)
    csv.writer(table).writerows([head, *body])
    head, body = table_rows(rows, keys, screen=True)
    made = "sweep" if len(all_rows) > 1 else "run"  # a report of one run says so
    title = f"gpubench {made}: {source}"
    print_table(head, body, title, Console(file=text, width=FILE_WIDTH, color_system=None,
                                           highlight=False))
    files = [write_text(out_dir / "ranking.csv", table.getvalue()),
             write_text(out_dir / "ranking.txt", text.getvalue())]
    # a recommendation changes knobs only: the workload (model, data...) is the user's
    knobs = [k for k in keys if role(k) is Role.knob]
    rec = recommend.recommend(rows, tolerance)
    summary: dict[str, Any] = {"source": source, "rows": len(rows), "tolerance": tolerance,
                               "feasible": sum(r.feasible for r in rows)}
    # a job refused as bad input wrote no results.json: no row of the ranking says it was run
    lines = [*(mask_secrets(f"refused: {' '.join(r.overrides)}: {r.line}") for r in refused),
             *notes]
    if refused:
        summary["refused"] = [{"overrides": [mask_secrets(o) for o in r.overrides],
                               "error": mask_secrets(r.line)} for r in refused]
    if pipes:
        lines = ["search path (sweep=pipes, each pipe on its own, then joined):",
                 *(f"  {x}" for x in pipes_lines(pipes)), *lines]
        summary["pipes"] = pipes
    if rec is not None:
        (out_dir / "experiment").mkdir(exist_ok=True)
        yml = write_text(out_dir / "experiment" / f"{EXPERIMENT_NAME}.yaml",
                         experiment_yaml(rec.chosen, source, rec, made))
        files.append(yml)
        cmd = f"python -m gpubench -cd {out_dir.resolve()} experiment={EXPERIMENT_NAME}"

        def entry(r: Row, **more) -> dict:
            return {"label": r.label, "images_per_sec": r.throughput,
                    "images_per_sec_ci": list(r.interval), **more, "dir": r.dir,
                    "overrides": overrides_of(r, knobs)}

        summary.update(best=entry(rec.best),
                       recommended={**entry(rec.chosen, peak_memory_fraction=rec.chosen.peak),
                                    "yaml": str(yml)},
                       reasons=rec.reasons, command=cmd)
        fastest, c = recommend.fastest_of(rec.best), rec.chosen.record
        lines += [
            *(f"{what + ':':<{len(fastest) + 1}} {with_interval(r)} img/s"
              f"{recommend.coverage_of(r)}  ({run_text(r, keys)})"
              for what, r in ((fastest, rec.best), ("recommended", rec.chosen))),
            *(f"  - {x}" for x in rec.reasons), f"recommended config: {yml.resolve()}",
            f"rerun it: {cmd}",
            f"  (it measures as the {made} did: {measurement_text(c.config, c.cut_short)}; "
            f"add {longer(rec.chosen.record)} to measure longer)"]
    elif kept or answer is None:  # (a loader-only sweep's answer, below, is the workers')
        lines.append("no feasible full-length measurement (all OOM, over the memory ceiling or "
                     "failed)" if kept else
                     "no recommendation: no full training measurement (only screens, max-batch "
                     "probes or runs without an e2e phase)")
    if answer is not None:
        lines += answer.lines
        summary["workers"] = answer.summary()
    files += report_plots.plot_all(shown, out_dir, rec, study,
                                   band=answer.band if answer is not None else None)
    if pipes:
        # the margin the search judged its path with (pipes.json's clears), not --tolerance
        files += report_plots.plot_pipes(all_rows, pipes, out_dir, TOLERANCE)
    # printed again when the report is up to date, at the reader's width; a password masked
    lines = mask_secrets("\n".join(lines)).splitlines()
    summary.update(files=[str(f) for f in files], lines=lines,
                   table={"title": title, "head": head, "body": body})
    if fingerprint is not None:
        summary["fingerprint"] = fingerprint
    files.append(write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str)))
    if not quiet:  # after every file is written: a reader that stops early (`| head`) costs none
        print_table(head, body, title)
        print_lines([*lines, f"report: {out_dir.resolve()}" + (" (a new folder)" if new else "")])
    return files


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns if path.is_file() else 0


class NothingToReport(FileNotFoundError):
    """No finished run to report on: main prints its one line and exits 1."""


def report_name(base: str, conditions: dict[str, str] | None, tolerance: float) -> str:
    """A report of part (--where) or at another --tolerance never overwrites the whole one's."""
    parts = [f"{k}={v}" for k, v in sorted((conditions or {}).items())]
    parts += [f"tolerance={tolerance:g}"] if tolerance != TOLERANCE else []
    return base + "".join("-" + re.sub(r"[^\w.=+]+", "_", x) for x in parts)


def sweep_report(sweep_dir: str | Path, tolerance: float = TOLERANCE,
                 quiet: bool = False, conditions: dict[str, str] | None = None,
                 compute: list[str] | None = None, out: str | Path | None = None,
                 refused: list[Refusal] = ()) -> list[Path]:
    """The report of a sweep dir's rows matching `conditions` (default out: `<sweep_dir>/report/`);
    `refused`: the multirun's jobs refused as bad input (they left no record)."""
    sweep_dir = Path(sweep_dir).resolve()
    rows, study = setups(sweep_dir, conditions)
    # a search's trial refused as bad input: named under the ranking as a grid's is, no row
    swept = recommend.varying(rows)
    refused = [*refused, *(Refusal(tuple(overrides_of(r, swept)), r.record.error or "")
                           for r in rows if r.record.status is Status.refused)]
    rows = [r for r in rows if r.record.status is not Status.refused]
    for r in rows:  # named as the user finds it: its folder seen from this one (`10-00-00/3`)
        if (folder := on_disk(r, sweep_dir)) is not None and folder != r.label:
            r.trial, r.label = r.trial or r.label, folder
    named = read_compute(compute)
    found = sweep_compute(sweep_dir, rows)
    # before anything is read there; a folder the user named (--out) is theirs
    out = check_no_links(sweep_dir / report_name(REPORT_DIR, conditions, tolerance),
                         sweep_dir) if out is None else Path(out)
    # what the report was made from: a second call reuses the files when nothing changed
    stamp = ([[r.label, r.status, _mtime(Path(r.dir) / "results.json") if r.dir else 0]
              for r in rows] + [["sweep.json", _mtime(sweep_dir / "sweep.json")], tolerance]
             + [list(kv) for kv in sorted((conditions or {}).items())]  # as JSON reads it back
             + [[str(r.path), r.path.stat().st_mtime_ns] for r in [*found, *named]])
    old = read_json(out / "summary.json") or {}
    if old.get("fingerprint") == stamp and all(Path(f).is_file() and inside(f, out)
                                               for f in old.get("files", [])):
        if not quiet:  # up to date: say what it says, so an unchanged sweep never looks broken
            t = old.get("table") or {}
            print_table(t.get("head") or [], t.get("body") or [], t.get("title") or "")
            print_lines([*(old.get("lines") or []), f"(report up to date: {out})"])
        return [Path(f) for f in old["files"]] + [out / "summary.json"]
    if not rows:
        raise NothingToReport(f"gpubench.report: nothing to report: no finished run "
                              f"(results.json){matching(conditions)} under {sweep_dir}")
    return write_report(rows, out, str(sweep_dir), study, tolerance, quiet, fingerprint=stamp,
                        found=found, named=named, pipes=read_json(sweep_dir / PIPES_FILE),
                        refused=refused)


def on_disk(row: Row, root: Path) -> str | None:
    """Its folder relative to `root`: `3`, not the trial number; `../b/0` another worker's."""
    if row.record.dir is None:
        return None
    rel = Path(os.path.relpath(Path(row.record.dir).resolve(), root)).as_posix()
    return None if rel == "." else rel


def matching(conditions: dict[str, str] | None) -> str:
    return "".join(f" with {k}={v}" for k, v in (conditions or {}).items())
