"""`python -m gpubench.report`: the report's command line (a sweep dir, an MLflow experiment,
or `--compare`)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gpubench.analysis.recommend import TOLERANCE
from gpubench.analysis.select import WhereError, parse_where
from gpubench.config.errors import ConfigError
from gpubench.config.flags import flag
from gpubench.core.exits import ExitCode
from gpubench.core.files import READ_ONLY, LinkError, refusal
from gpubench.core.parsers import OneLineParser
from gpubench.core.record import find_runs
from gpubench.core.secrets import error_text, mask_logging, mask_secrets
from gpubench.core.uris import sqlite_path
from gpubench.report import write
from gpubench.report.loader_answer import read_compute
from gpubench.report.write import NothingToReport


def looks_like_path(source: str) -> bool:  # a folder, not an MLflow experiment name
    return "/" in source or "\\" in source or source.startswith((".", "~"))


def _tolerance(text: str) -> float:
    """A share below the fastest in [0, 1) (nan would silently recommend nothing)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (0.0 <= v < 1.0):
        raise argparse.ArgumentTypeError(str(ConfigError(
            "--tolerance", v, f"a number in [0, 1) ({TOLERANCE} = within {TOLERANCE:.0%} of the "
            "fastest)", typed=text)))
    return v


def main(argv: list[str] | None = None) -> ExitCode:
    p = OneLineParser(prog="python -m gpubench.report", description=" ".join(__doc__.split()))
    p.add_argument("source", nargs="?",
                   help="a sweep dir (outputs/multirun/...) or an MLflow experiment")
    p.add_argument("--tolerance", type=_tolerance, default=TOLERANCE, help="how far below the "
                   f"fastest a recommended config may be (default {TOLERANCE})")
    p.add_argument("--out", help="report folder (default: <sweep dir>/report, or "
                   "outputs/reports/<experiment> for MLflow)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: gpubench's)")
    p.add_argument("--timeout", type=flag("tracking.timeout_s", "--timeout"), default=10.0,
                   help="MLflow: seconds to wait for each answer of the tracking server")
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
    mask_logging()  # MLflow's and urllib3's log lines name the URI too
    try:
        return _report(p, a, parse_where(a.where))
    except WhereError as e:  # its own one line; malformed: bad input (a key no run has: 1)
        print(mask_secrets(str(e)), file=sys.stderr)
        return ExitCode.BAD_INPUT if e.bad_input else ExitCode.FAILED
    except ConfigError as e:  # a flag's value (--parent, --prices ...)
        print(f"gpubench.report: {mask_secrets(str(e))}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except NothingToReport as e:  # its own one line
        print(mask_secrets(str(e)), file=sys.stderr)
    except LinkError as e:  # a link out of the folder, or where the report writes
        print(f"gpubench.report: {e}", file=sys.stderr)
    except OSError as e:  # a read-only folder, a full disk: the path, why, and where else
        hint = "; write the report elsewhere: --out DIR" if e.errno in READ_ONLY else ""
        print(f"gpubench.report: {refusal(e.filename or a.out or a.source, e)}{hint}",
              file=sys.stderr)
    return ExitCode.FAILED


def _report(p: OneLineParser, a: argparse.Namespace, conditions: dict) -> ExitCode:
    if a.tracking_uri is not None:
        from gpubench.tracking.store import uri_problem

        if problem := uri_problem(a.tracking_uri):
            p.error(f"--tracking-uri={mask_secrets(a.tracking_uri)!r} is not allowed: {problem}")
    if a.prices is not None and a.compare is None:
        p.error("--prices: only with --compare")
    if a.compare is not None:
        from gpubench.report import compare

        prices = compare.load_prices(a.prices)  # bad input before the store is asked
        return _from_mlflow(a.tracking_uri, a.timeout,
                            lambda uri: compare.main(a.compare or a.source, uri, prices))
    if a.source is None:
        p.error("a sweep dir or an MLflow experiment is required")
    src = Path(a.source).expanduser()
    if not src.is_dir() and looks_like_path(a.source):
        raise NothingToReport(f"gpubench.report: no such folder: {a.source}")
    # a bare name is a folder only when it holds runs (`gpubench` is the package and an experiment)
    if src.is_dir() and (looks_like_path(a.source) or (src / "sweep.json").is_file()
                         or find_runs(src)):
        mlflow_only = [f for f, v in (("--tracking-uri", a.tracking_uri), ("--parent", a.parent),
                                      ("--study", a.study)) if v is not None]
        if mlflow_only:  # never ignored silently
            p.error(f"{', '.join(mlflow_only)}: for an MLflow experiment, not a folder of runs "
                    f"({a.source})")
        write.sweep_report(src, a.tolerance, conditions=conditions, compute=a.compute, out=a.out)
        return ExitCode.OK
    write.check_filters(a.parent, a.study)  # bad input before the store is asked
    rows = _from_mlflow(a.tracking_uri, a.timeout, lambda uri: write.load_mlflow(
        a.source, uri, a.parent, a.study, conditions), source=a.source)
    if not rows:
        raise NothingToReport(f"gpubench.report: no runs with results.json"
                              f"{write.matching(conditions)} in experiment {a.source!r}")
    # a report of part of an experiment never overwrites the whole experiment's
    name = write.report_name(a.source + (f"-parent-{a.parent[:8]}" if a.parent else "") + (
        f"-study-{a.study}" if a.study else ""), conditions, a.tolerance)
    write.write_report(rows, Path(a.out or Path("outputs") / "reports" / name),
                       write.Source(a.source, mlflow=True, uri=a.tracking_uri), None, a.tolerance,
                       named=read_compute(a.compute))
    return ExitCode.OK


def _from_mlflow(uri: str | None, timeout_s: float, read, source: str | None = None):
    """`read(uri)`, every network wait bounded; an unreadable store: one line (NothingToReport);
    a missing sqlite store is not made. `source`: a name perhaps meant as a folder."""
    from gpubench.tracking import store

    uri = store.resolve_uri(uri)
    if (db := sqlite_path(uri)) is not None and not db.is_file():
        what = "" if source is None else (
            f"{source!r} holds no runs (no results.json under it) and is no experiment: "
            if Path(source).is_dir() else
            f"{source!r} is neither a folder nor an experiment: ")
        raise NothingToReport(f"gpubench.report: {what}no MLflow store at {db} (nothing tracked "
                              "there; --tracking-uri names another store, or give a sweep folder)")
    try:
        with store.connection(uri, timeout_s) as connect:
            return read(connect)
    except (WhereError, ConfigError):  # not the store's doing
        raise
    except SystemExit as e:  # the report's own one-line refusals
        if isinstance(e.code, str):
            raise NothingToReport(e.code) from None
        raise
    except Exception as e:
        raise NothingToReport(f"gpubench.report: MLflow at {uri}: {error_text(e)}") from e
