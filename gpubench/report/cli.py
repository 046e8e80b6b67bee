"""`python -m gpubench.report`: the report's command line (a sweep dir, an MLflow experiment,
or `--compare`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gpubench.analysis.recommend import TOLERANCE
from gpubench.analysis.select import parse_where, where
from gpubench.core.exits import ExitCode
from gpubench.core.files import READ_ONLY, LinkError, refusal
from gpubench.core.parsers import OneLineParser
from gpubench.core.record import find_runs
from gpubench.report.loader_answer import read_compute, sweep_compute
from gpubench.report.write import (
    NothingToReport,
    load_mlflow,
    matching,
    sweep_report,
    write_report,
)
from gpubench.search.rows import load_dir


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


def _tolerance(text: str) -> float:
    """A share below the fastest: finite, in [0, 1) (nan and inf compare false with everything,
    so they would silently recommend nothing or anything)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (0.0 <= v < 1.0):
        raise argparse.ArgumentTypeError(
            f"--tolerance={text} is not allowed: a number in [0, 1) (0.05 = within 5% of the "
            "fastest)")
    return v


def main(argv: list[str] | None = None) -> ExitCode:
    p = OneLineParser(prog="python -m gpubench.report", description=__doc__.split("\n")[0])
    p.add_argument("source", nargs="?",
                   help="a sweep dir (outputs/multirun/...) or an MLflow experiment")
    p.add_argument("--tolerance", type=_tolerance, default=TOLERANCE,
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
    p.add_argument("--compute", action="append", metavar="RUN",
                   help="a run (folder or results.json) that measured the compute phase at the "
                   "setup of this sweep's loader-only runs: the bound of the workers answer "
                   "(repeatable; see docs/report.md)")
    a = p.parse_args(argv)
    conditions = parse_where(a.where)
    if a.compare is not None:
        from gpubench.report import compare

        return compare.main(a.compare or a.source, a.tracking_uri, a.prices)
    if a.source is None:
        p.error("a sweep dir or an MLflow experiment is required")
    src = Path(a.source).expanduser()
    if not src.is_dir() and looks_like_path(a.source):
        print(f"gpubench.report: no such folder: {a.source}", file=sys.stderr)
        return ExitCode.FAILED
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
                                          f"(results.json){matching(conditions)} under "
                                          f"{src.resolve()}")
                write_report(rows, Path(a.out), str(src.resolve()), study, a.tolerance,
                             found=sweep_compute(src.resolve(), rows),
                             named=read_compute(a.compute))
            else:
                sweep_report(src, a.tolerance, conditions=conditions, compute=a.compute)
        except NothingToReport as e:
            print(e, file=sys.stderr)
            return ExitCode.FAILED
        except LinkError as e:  # a link out of the folder, or where the report writes
            print(f"gpubench.report: {e}", file=sys.stderr)
            return ExitCode.FAILED
        except OSError as e:  # a read-only sweep folder, a full disk
            return _refused(e, src)
        return ExitCode.OK
    rows = load_mlflow(a.source, a.tracking_uri, a.parent, a.study, conditions)
    if not rows:
        print(f"gpubench.report: no runs with results.json{matching(conditions)} in experiment "
              f"{a.source!r}", file=sys.stderr)
        return ExitCode.FAILED
    out = Path(a.out) if a.out else mlflow_out_dir(a.source, a.parent, a.study)
    try:
        write_report(rows, out, f"mlflow experiment {a.source}", None, a.tolerance,
                     named=read_compute(a.compute))
    except LinkError as e:
        print(f"gpubench.report: {e}", file=sys.stderr)
        return ExitCode.FAILED
    except OSError as e:
        return _refused(e, out)
    return ExitCode.OK


def _refused(e: OSError, where: Path) -> ExitCode:
    """One line for a report that could not be written: the path, why, and where else."""
    hint = "; write the report elsewhere: --out DIR" if e.errno in READ_ONLY else ""
    print(f"gpubench.report: {refusal(e.filename or where, e)}{hint}", file=sys.stderr)
    return ExitCode.FAILED
