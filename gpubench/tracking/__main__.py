"""`python -m gpubench.tracking sync DIR [--uri URI] [--experiment NAME] [--timeout S]`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from gpubench.config.flags import flag
from gpubench.core.exits import ExitCode
from gpubench.core.parsers import OneLineParser
from gpubench.core.secrets import mask_secrets
from gpubench.tracking.store import uri_problem
from gpubench.tracking.sync import sync


def main(argv: list[str] | None = None) -> ExitCode:
    ap = OneLineParser(prog="python -m gpubench.tracking",
                       description="MLflow tracking for gpubench runs.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)
    s = sub.add_parser("sync", help="upload runs under DIR that did not reach MLflow")
    s.add_argument("dir", help="an outputs dir, a sweep dir or one run dir")
    s.add_argument("--uri", help="tracking URI to upload to (default: the embedded store of "
                   "each run's outputs folder, <outputs>/mlflow.db; a store a run folder names is "
                   "shown, never connected to)")
    s.add_argument("--experiment", type=flag("tracking.experiment", "--experiment"),
                   help="experiment name (default: each run's own)")
    s.add_argument("--timeout", type=flag("tracking.timeout_s", "--timeout"), default=10.0,
                   help="seconds to wait for a server")
    a = ap.parse_args(argv)
    if not Path(a.dir).is_dir():
        ap.error(f"DIR: not a folder: {a.dir}")
    if problem := uri_problem(a.uri):
        ap.error(f"--uri {mask_secrets(a.uri)!r}: not a tracking URI: {problem}")
    counts = sync(a.dir, a.uri, a.experiment, a.timeout)
    return ExitCode.FAILED if counts["failed"] else ExitCode.OK


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
