"""One run into MLflow: its record with its artifacts (text ones masked: a URI or storage URL may
carry a password), and a marker beside it saying whether and as which run, for `sync`."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import os
import socket
import time
from datetime import datetime
from pathlib import Path

import yaml

from gpubench.analysis.select import knob_of
from gpubench.core.files import inside, read_json, try_lock, write_json, write_text
from gpubench.core.record import GPU_METRICS_FILE, RESULTS_FILE, TRACE_DIR, RunRecord
from gpubench.core.secrets import error_text, mask_secrets, say
from gpubench.tracking import translate as T
from gpubench.tracking.store import Store, open_store, resolve_uri, ui_hint

log = logging.getLogger("gpubench")

MARKER_FILE = "mlflow.json"  # beside results.json: where and whether the run reached MLflow
PARENT_FILE = "mlflow_parent.json"  # in a sweep dir: the sweep's parent run
CLAIM_FILE = "mlflow.claim"  # beside results.json while one process uploads the run
CONFIG_FILE = "resolved_config.yaml"  # the config as measured (auto sizes filled in)
# the sweep's parent run id, for jobs launched in this process (Hydra's basic launcher)
PARENT_ENV = "GPUBENCH_MLFLOW_PARENT_RUN_ID"

ARTIFACT_GLOBS = ("*.png", "*.svg", "*.html", "*.log", "*.csv", "*trace*.json", "*.json.gz")
ARTIFACT_DIRS = (TRACE_DIR, "profiler", "plots")
TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".log", ".txt", ".csv", ".md", ".html")
MASK_LIMIT = 64 << 20  # larger files (traces) are uploaded as they are


def read(path: Path) -> dict:
    return read_json(path) or {}


def user() -> str | None:
    with contextlib.suppress(KeyError, OSError):
        return getpass.getuser()
    return None


def log_file(client, run_id: str, path: Path, artifact_path: str | None = None,
             root: Path | None = None) -> None:
    """Upload one file (a text file holding a password: a masked copy). A link out of `root`
    (default: its folder) is not read: one warning line."""
    root = Path(path).parent if root is None else root
    if not inside(path, root):
        say(f"not uploaded: {path} is a link out of {root} (to {Path(path).resolve()})")
        return
    if not path.is_file():  # absent, a folder, or a dangling link
        return
    if path.suffix in TEXT_SUFFIXES and path.stat().st_size <= MASK_LIMIT:
        masked = mask_secrets(text := path.read_text(errors="replace"))
        if masked != text:  # MLflow writes it to a temporary file and logs that
            client.log_text(run_id, masked, f"{artifact_path or '.'}/{path.name}")
            return
    client.log_artifact(run_id, str(path), artifact_path)


def log_dir(client, run_id: str, folder: Path, artifact_path: str, root: Path) -> None:
    """The files under `folder` (if any) that lie in `root` once links are followed."""
    if not inside(folder, root):
        log_file(client, run_id, folder, root=root)  # the warning line; nothing is read
        return
    for dirpath, dirnames, names in os.walk(folder):  # followlinks=False
        dirnames.sort()
        for n in sorted(names) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            p = Path(dirpath) / n
            if p.is_file() or not inside(p, root):  # a link out is named in a warning
                sub = Path(artifact_path) / p.parent.relative_to(folder)  # `hydra/.` is `hydra`
                log_file(client, run_id, p, sub.as_posix(), root)


def upload(store: Store, rec: RunRecord, run_dir: Path, parent_id: str | None = None,
           name: str | None = None, overrides: str | None = None) -> str:
    """One MLflow run from a record; its id. Terminated last: a RUNNING one broke half-way."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param

    c = store.client
    tags = T.run_tags(rec, overrides, user())
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    try:
        start = int(datetime.strptime(rec.started_at, "%Y-%m-%dT%H:%M:%S%z").timestamp() * 1000)
    except (TypeError, ValueError):
        start = None
    rid = c.create_run(store.experiment_id, start_time=start, tags=tags,
                       run_name=T.run_name(rec, name)).info.run_id
    c.set_tag(rid, "mlflow.note.content", T.describe(rec, rid, (run_dir / T.PICTURE).is_file()))

    metrics = [Metric(k, v, ts, step) for k, v, step, ts in T.run_metrics(rec)]
    log_csv = run_dir / GPU_METRICS_FILE
    if log_csv.is_file() and inside(log_csv, run_dir):  # the nvidia-smi-style log as series
        from gpubench.telemetry.gpulog import series

        metrics += [Metric(k, v, ts or int(time.time() * 1000), step)
                    for k, v, step, ts in series(log_csv)]
    # MlflowClient.log_batch splits them into batches within MLflow's limits
    c.log_batch(rid, metrics=metrics, params=[Param(k, v) for k, v in T.run_params(rec).items()])
    # the runs table's Dataset column is shown by default: name the data the run read
    ds = str(knob_of(rec.knob, "dataset") or "dataset")
    size = knob_of(rec.knob, "image_size")
    digest = hashlib.sha1(json.dumps(rec.knob("dataset"), sort_keys=True, default=str).encode())
    c.log_inputs(rid, [DatasetInput(
        Dataset(name=mask_secrets(f"{ds} {size}px" if size else ds), digest=digest.hexdigest()[:8],
                source_type="gpubench", source=mask_secrets(ds)),
        [InputTag("mlflow.data.context", "benchmark")])])

    # nothing out of the run folder is read: log_file/log_dir name a link out and skip it
    globbed = {p for g in ARTIFACT_GLOBS for p in run_dir.glob(g)} - {run_dir / MARKER_FILE}
    for f in (run_dir / RESULTS_FILE, run_dir / CONFIG_FILE, *sorted(globbed)):
        log_file(c, rid, f, root=run_dir)
    for d, name in ((".hydra", "hydra"), *((d, d) for d in ARTIFACT_DIRS)):
        log_dir(c, rid, run_dir / d, name, run_dir)

    end = start + int(rec.seconds * 1000) if start and rec.seconds else None
    c.set_terminated(rid, T.RUN_STATUS[rec.status], end_time=end)
    return rid


def write_marker(run_dir: Path, run_uid: str, uri: str, experiment: str, run_id=None,
                 experiment_id=None, error=None, parent_id=None) -> None:
    # tracking_uri: masked by write_json; parent_run_id: the sweep's parent it went under (sync
    # attaches a job uploaded without one)
    write_json(run_dir / MARKER_FILE, {
        "run_uid": run_uid, "synced": run_id is not None, "tracking_uri": uri,
        "experiment": experiment, "experiment_id": experiment_id, "run_id": run_id,
        "parent_run_id": parent_id, "error": error, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


# A run's process uploads it as it ends, `sync` what missed MLflow: both may reach one run at
# once. Only the holder of its claim (`mlflow.claim`, a file lock: core.files.try_lock) uploads;
# a process that died mid-upload (kill -9) left it free (the kernel released its lock).
@contextlib.contextmanager
def upload_claim(run_dir: Path):
    """None while this process holds the run's upload, else who does. Its file is removed while
    held: one opened meanwhile is found unlinked and made anew (filelock checks the link count)."""
    path = Path(run_dir) / CLAIM_FILE
    lock = try_lock(path, note=f"{socket.gethostname()}:{os.getpid()}")
    if lock is None:
        holder = ""
        with contextlib.suppress(OSError):  # released and removed this instant
            holder = path.read_text().strip()
        yield holder or "another process"
        return
    try:
        yield None
    finally:
        Path(lock.lock_file).unlink(missing_ok=True)
        lock.release()


def sweep_of(run_dir: Path) -> Path | None:
    return run_dir.parent if (run_dir.parent / "multirun.yaml").is_file() else None


def sync_command(run_dir: Path, uri: str) -> str:
    """The command that uploads a run later (with its sweep, to a store the user names)."""
    return f"python -m gpubench.tracking sync {sweep_of(run_dir) or run_dir} --uri {uri}"


def read_overrides(run_dir: Path, task=None) -> str | None:
    """The override string (masked): the run dir's .hydra/, the running Hydra's, or `task`."""
    f = run_dir / ".hydra" / "overrides.yaml"
    if f.is_file():
        return mask_secrets(" ".join(yaml.safe_load(f.read_text()) or []))
    with contextlib.suppress(ImportError, ValueError):
        from hydra.core.hydra_config import HydraConfig

        return mask_secrets(" ".join(HydraConfig.get().overrides.task))
    return mask_secrets(" ".join(task)) if task is not None else None


def job_parent(run_dir: Path) -> str | None:
    """A multirun job's parent run: the callback's env var here, else its file in the sweep dir."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        sweep_dirs = [Path(hc.sweep.dir), run_dir.parent]
    except (ImportError, ValueError):
        return None
    return os.environ.get(PARENT_ENV) or next(
        (rid for d in sweep_dirs if (rid := read(d / PARENT_FILE).get("run_id"))), None)


def log_result(t, rec: RunRecord, task=None) -> bool:
    """Upload a finished (or killed) run with tracking settings `t`. Never raises: a failure prints
    one warning line, marks the run unsynced and returns False (results stay for `sync`)."""
    uri = resolve_uri(t.uri)
    run_dir = Path(rec.dir)
    parent = job_parent(run_dir)
    try:
        # the config as measured, on disk before any store is contacted
        write_text(run_dir / CONFIG_FILE, yaml.safe_dump(rec.config or {}, sort_keys=False))
        with upload_claim(run_dir) as holder:
            if holder is not None:  # `sync` is uploading it right now: one MLflow run per run
                log.info("MLflow: %s is being uploaded by %s", run_dir, holder)
                return True
            with open_store(uri, t.experiment, float(t.timeout_s)) as store:
                rid = upload(store, rec, run_dir, parent, t.run_name, read_overrides(run_dir, task))
            write_marker(run_dir, rec.run_uid, uri, t.experiment, rid, store.experiment_id,
                         parent_id=parent)
    except Exception as e:  # a tracking failure must never cost the measurement
        log.debug("MLflow upload failed", exc_info=True)
        with contextlib.suppress(OSError):  # a folder that refuses writes: the warning says it
            write_marker(run_dir, rec.run_uid, uri, t.experiment, error=f"{type(e).__name__}: {e}")
        say(f"run not logged to MLflow at tracking.uri={uri} ({error_text(e)}); its results are "
            f"kept in {run_dir}; upload them later: {sync_command(run_dir, uri)}")
        return False
    log.info("MLflow run %s: %s", rid, ui_hint(uri, store.experiment_id, rid))
    return True
