"""Upload runs that did not reach MLflow: `python -m gpubench.tracking sync <outputs dir>`.

A run's `run_uid` is its identity in MLflow, so syncing twice, or after an upload that broke
half-way (a run left RUNNING), never leaves duplicates. Sweep jobs go under their sweep's parent
run, which is created here when the sweep itself never reached MLflow.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from gpubench.tracking import (
    MARKER_FILE,
    PARENT_FILE,
    Store,
    _read_json,
    _sweep_of,
    close_sweep,
    default_uri,
    find_runs,
    open_store,
    open_sweep,
    read_overrides,
    upload,
    write_marker,
)

log = logging.getLogger("gpubench")


def _sweep_overrides(sweep_dir: Path) -> tuple[list[str], str | None, dict | None]:
    try:
        mr = yaml.safe_load((sweep_dir / "multirun.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        mr = {}
    h = mr.get("hydra") or {}
    sweeper = h.get("sweeper") or {}
    return (h.get("overrides") or {}).get("task") or [], sweeper.get("_target_"), sweeper.get("params")


def _run_default_uri(run_dir: Path) -> str:
    """The embedded store a run with tracking.uri=null was meant for: <its outputs/>/mlflow.db
    (the run dir sits under outputs/ of the directory it was started from)."""
    for d in run_dir.resolve().parents:
        if d.name == "outputs":
            return default_uri(d.parent)
    return default_uri()


def sync(root: str | Path, uri: str | None = None, experiment: str | None = None,
         timeout_s: float = 10.0, out=sys.stdout) -> dict[str, int]:
    """Upload every run under `root` that is not in MLflow yet; returns counts by outcome."""
    counts = {"uploaded": 0, "present": 0, "skipped": 0, "failed": 0}
    todo: dict[tuple[str, str], list[tuple[Path, dict]]] = {}
    found = find_runs(Path(root))
    for path in found:
        run_dir, data = path.parent, _read_json(path)
        if not data.get("run_uid") or data.get("status") in (None, "running"):
            print(f"skip {run_dir}: no final status (still running, or it crashed)", file=out)
            counts["skipped"] += 1
            continue
        marker, tcfg = _read_json(run_dir / MARKER_FILE), (data.get("config") or {}).get("tracking", {})
        target = (uri or marker.get("tracking_uri") or tcfg.get("uri") or _run_default_uri(run_dir),
                  experiment or marker.get("experiment") or tcfg.get("experiment") or "gpubench")
        if marker.get("synced") and (marker.get("tracking_uri"), marker.get("experiment")) == target:
            counts["present"] += 1
            continue
        todo.setdefault(target, []).append((run_dir, data))

    for (t_uri, t_exp), runs in todo.items():
        try:
            with open_store(t_uri, t_exp, timeout_s) as store:
                _sync_into(store, runs, counts, out)
        except Exception as e:  # report it, go on with the other targets
            log.debug("sync failed", exc_info=True)
            print(f"gpubench: warning: MLflow not reached at {t_uri} ({e}); "
                  f"{len(runs)} run(s) not synced", file=sys.stderr)
            counts["failed"] += len(runs)
    _close_open_sweeps(found, uri, timeout_s)
    print(", ".join(f"{v} {k}" for k, v in counts.items()), file=out)
    return counts


def _close_open_sweeps(found: list[Path], uri: str | None, timeout_s: float) -> None:
    """Parent runs left RUNNING (the sweep was interrupted before its end callback)."""
    for sweep in sorted({_sweep_of(p.parent) for p in found} - {None}):
        info = _read_json(sweep / PARENT_FILE)
        if not info.get("synced") or info.get("finished") or uri not in (None, info["tracking_uri"]):
            continue
        try:
            with open_store(info["tracking_uri"], info["experiment"], timeout_s) as store:
                close_sweep(store, sweep, info["run_id"])
        except Exception as e:  # the runs are in; only the sweep summary waits
            log.debug("closing sweep failed", exc_info=True)
            print(f"gpubench: warning: sweep {sweep} not closed in MLflow ({e})", file=sys.stderr)


def _sync_into(store: Store, runs: list[tuple[Path, dict]], counts: dict, out) -> None:
    from mlflow.entities import RunStatus

    parents: dict[Path, str] = {}
    for run_dir, data in runs:
        sweep = _sweep_of(run_dir)
        if sweep and sweep not in parents:
            info = _read_json(sweep / PARENT_FILE)
            if info.get("synced") and (info.get("tracking_uri"), info.get("experiment")) == (
                    store.uri, store.experiment):
                parents[sweep] = info["run_id"]
            else:
                ov, sweeper, sp = _sweep_overrides(sweep)
                parents[sweep] = open_sweep(store, sweep, ov, sweeper, sp)
        uid = data["run_uid"]
        rid = None
        for r in store.find("run_uid", uid):
            if RunStatus.is_terminated(RunStatus.from_string(r.info.status)):
                rid = r.info.run_id  # uploaded before; only the marker missed it
            else:
                store.client.delete_run(r.info.run_id)  # a half-done upload: replace it
        if rid:
            counts["present"] += 1
        else:
            rid = upload(store, data, run_dir, parents.get(sweep), overrides=read_overrides(run_dir))
            counts["uploaded"] += 1
            print(f"uploaded {run_dir} -> run {rid}", file=out)
        write_marker(run_dir, uid, store.uri, store.experiment, rid, store.experiment_id)
    for sweep, pid in parents.items():
        close_sweep(store, sweep, pid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpubench.tracking",
                                 description="MLflow tracking for gpubench runs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="upload runs under DIR that did not reach MLflow")
    s.add_argument("dir", help="an outputs dir, a sweep dir or one run dir")
    s.add_argument("--uri", help="tracking URI (default: the one each run was meant for)")
    s.add_argument("--experiment", help="experiment name (default: each run's own)")
    s.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a server")
    a = ap.parse_args(argv)
    if not Path(a.dir).is_dir():
        ap.error(f"not a folder: {a.dir}")
    counts = sync(a.dir, a.uri, a.experiment, a.timeout)
    return 1 if counts["failed"] else 0
