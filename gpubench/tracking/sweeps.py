"""A sweep in MLflow: one parent run, one child run per job. The parent is opened before the first
job (by the Hydra callback, or by `sync`) and closed with the best job: FINISHED when the sweep
completed (a resumed one included), KILLED when it was interrupted."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from pathlib import Path

import yaml

from gpubench.analysis.select import left_out
from gpubench.analysis.workers import COMPUTE_DIR
from gpubench.core import record
from gpubench.core.files import write_json
from gpubench.core.record import RunRecord, Status, process_alive
from gpubench.core.secrets import mask_secrets
from gpubench.search import manifest
from gpubench.tracking import runs
from gpubench.tracking import translate as T
from gpubench.tracking.store import Store, open_store

log = logging.getLogger("gpubench")


def open_sweep(store: Store, sweep_dir: Path, hydra: dict, name: str | None = None) -> str:
    """The sweep's parent run's id, written to the parent file: found by its sweep_uid (a resumed
    sweep) or created with the overrides and the sweeper's search space (`hydra`: the config's
    hydra section, as written: the running one, or its multirun.yaml's) as params."""
    from mlflow.entities import Param

    sweep_dir.mkdir(parents=True, exist_ok=True)
    info = runs.read(sweep_dir / runs.PARENT_FILE)
    uid = info.get("sweep_uid") or uuid.uuid4().hex
    if found := store.find("sweep_uid", uid):
        rid = found[0].info.run_id
    else:
        overrides = (hydra.get("overrides") or {}).get("task") or []
        sweeper = hydra.get("sweeper") or {}
        tags = {"sweep_uid": uid, "sweep_dir": str(sweep_dir), "overrides": " ".join(overrides),
                "sweeper": sweeper.get("_target_"), "mlflow.user": runs.user()} | T.SOURCE
        rid = store.client.create_run(
            store.experiment_id, tags=T.tag_values(tags),
            run_name=mask_secrets(name or f"sweep {sweep_dir.parent.name}/{sweep_dir.name}"),
        ).info.run_id
        space = [(k.lstrip("+~"), v) for k, _, v in (o.partition("=") for o in overrides)]
        space += (sweeper.get("params") or {}).items()
        params = {T.key(str(k)): mask_secrets(str(v))[:T.MAX_PARAM_VALUE] for k, v in space}
        store.client.log_batch(rid, params=[Param(k, v) for k, v in params.items()])
    # open again (a resume): not finished until this attempt's end closes it
    write_json(sweep_dir / runs.PARENT_FILE, info | {
        "sweep_uid": uid, "tracking_uri": store.uri, "experiment": store.experiment,
        "experiment_id": store.experiment_id, "run_id": rid, "synced": True, "finished": False})
    return rid


def mark_ended(sweep_dir: Path, ended: bool) -> None:
    """Whether the sweep ran to its end, MLflow reached or not: `sync` closes KILLED only the
    parent of a sweep that did not end and whose process (pid, host) is gone."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    owner = {} if ended else {"pid": os.getpid(), "host": socket.gethostname()}
    path = sweep_dir / runs.PARENT_FILE
    write_json(path, runs.read(path) | {"ended": ended, **owner})


def live(sweep_dir: Path) -> bool:
    """The sweep's process (parent file's, sweep.json's) runs on this host: it closes its parent."""
    info = runs.read(sweep_dir / runs.PARENT_FILE)
    if info.get("ended"):
        return False
    host, _, pid = str(manifest.read(sweep_dir).get("worker") or "").rpartition(":")
    owners = [(info.get("host"), info.get("pid")), (host, int(pid) if pid.isdigit() else None)]
    return any(isinstance(p, int) and process_alive(h, p) for h, p in owners)


def jobs(sweep_dir: Path) -> list[RunRecord]:
    """Every job's record, with its rung from the manifest (screen, probe, full)."""
    rungs = {str(Path(j["dir"]).resolve()): j.get("rung")
             for j in manifest.read(sweep_dir).get("jobs") or [] if j.get("dir")}
    # not a loader-only sweep's compute bound (run.compute_bound): measured beside the jobs
    recs = (record.load(d, rung=rungs.get(str(Path(d).resolve())))
            for d in record.find_runs(sweep_dir) if Path(d).parent != Path(sweep_dir) / COMPUTE_DIR)
    return [r for r in recs if r is not None]


def best_job(sweep_dir: Path, records: list[RunRecord] | None = None) -> RunRecord | None:
    """The sweep report's recommendation (the parent never names a run its report rejects),
    with the figure the report ranks it by (Row.as_ranked: pooled over its repeats), else the
    manifest's best, else the feasible full training measurement with the highest objective."""
    from gpubench.search.rows import recommendation

    try:
        rec = recommendation(sweep_dir)
    except Exception as e:  # an unreadable study: the manifest still names a best
        log.warning("sweep %s: no report recommendation (%s)", sweep_dir, e)
        rec = None
    if rec is not None and rec.chosen.record.dir is not None:
        return rec.chosen.as_ranked
    chosen = (manifest.read(sweep_dir).get("best") or {}).get("dir")
    if chosen and (rec := record.load(chosen)) is not None:
        return rec
    # a full training measurement (select.left_out): never a loader-only or compute-only run
    ranked = [r for r in (records if records is not None else jobs(sweep_dir))
              if left_out(r) is None and r.feasible]
    return max(ranked, key=lambda r: r.objective, default=None)


def close_sweep(store: Store, sweep_dir: Path, parent_id: str, interrupted: bool | None = None,
                status: str | None = None) -> None:
    """Log the best child's id, config and throughput to the parent run and end it FINISHED,
    KILLED when interrupted, or `status`. `interrupted` None: mark_ended's record says, else (an
    untracked sweep) a job left killed or running."""
    from mlflow.entities import Metric, RunTag

    c = store.client
    recs = jobs(sweep_dir)
    if interrupted is None:
        ended = runs.read(sweep_dir / runs.PARENT_FILE).get("ended")
        interrupted = not ended if ended is not None else \
            any(r.status in (Status.killed, Status.running) for r in recs)
    figures = {"jobs": len(recs), "jobs_ok": sum(r.status is Status.ok for r in recs)}
    tags: dict = {}
    best = best_job(sweep_dir, recs)
    if best is not None and best.dir is not None:
        # as the best run's own metrics show them: rounded to what their intervals support
        figures["best_objective"] = T.shown_objective(best)
        if best.images_per_sec is not None:
            # also as images_per_sec and verdict: the gpubench view's columns, for the parent's row
            figures["best_images_per_sec"] = figures["images_per_sec"] = \
                T.shown_images_per_sec(best)
            tags["verdict"] = T.run_tags(best).get("verdict")
        run_id = runs.read(best.dir / runs.MARKER_FILE).get("run_id")
        # the child's own name, as the UI lists it: `best` may carry its row's pooled figure,
        # which no run's name has
        name = T.run_name(record.load(best.dir) or best)
        if run_id:  # its marker may name a run of another store (synced elsewhere) or deleted
            from mlflow.exceptions import MlflowException

            try:
                name = c.get_run(run_id).info.run_name
            except Exception as e:  # the parent must still end: the name from the record
                gone = isinstance(e, MlflowException) and e.error_code == "RESOURCE_DOES_NOT_EXIST"
                log.warning("sweep %s: best run %s %s (%s)", sweep_dir, run_id,
                            "not in this store" if gone else "not read", e)
                run_id = None if gone else run_id  # no id tag leading nowhere
        tags |= {"best_run_dir": best.dir, "best_run_name": name, "best_run_id": run_id,
                 "best_overrides": runs.read_overrides(best.dir)}
        c.log_text(parent_id, mask_secrets(yaml.safe_dump(best.config, sort_keys=False)),
                   "best_config.yaml")
    # one parent per worker, all tagged with the study they searched together
    tags["study"] = manifest.read(sweep_dir).get("study")
    now = int(time.time() * 1000)
    c.log_batch(parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in figures.items()],
                tags=[RunTag(k, v) for k, v in T.tag_values(tags).items()])
    if (sweep_dir / "multirun.yaml").is_file():
        runs.log_file(c, parent_id, sweep_dir / "multirun.yaml")
    c.set_terminated(parent_id, status or ("KILLED" if interrupted else "FINISHED"))
    info = runs.read(sweep_dir / runs.PARENT_FILE)
    write_json(sweep_dir / runs.PARENT_FILE, info | {"finished": True, "interrupted": interrupted})


def log_sweep_files(sweep_dir: Path, parent_id: str, files: list[Path], timeout_s: float,
                    uri: str) -> None:
    """Attach files (a sweep report, plots) to the sweep's parent run, masked, at the configured
    `uri` (never the one the parent file records: see tracking.sync)."""
    info = runs.read(sweep_dir / runs.PARENT_FILE)
    with open_store(uri, info["experiment"], timeout_s) as store:
        for f in files:
            runs.log_file(store.client, parent_id, Path(f))
