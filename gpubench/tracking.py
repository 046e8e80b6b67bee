"""MLflow tracking: every run (and every sweep, as a parent run) lands in MLflow, nothing is lost.

A run is measured and results.json written before MLflow is contacted. `log_result` then
uploads params, metrics (summary figures and per-step series), tags and artifacts, and leaves a
marker file `mlflow.json` beside results.json saying whether (and as which run) it got there. A
run that could not reach MLflow keeps its results on disk, and

    python -m gpubench.tracking sync <outputs dir>

uploads it later. The run's `run_uid` identifies it in MLflow, so syncing twice (or after an
upload that broke half-way) never leaves duplicates.

MLflow stays optional: it is imported only inside functions, so `tracking=none` never loads it.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

import yaml

from gpubench.files import flatten, read_json, write_json

log = logging.getLogger("gpubench")

RESULTS_FILE = "results.json"  # as written by gpubench.runner (not imported: it loads torch)
MARKER_FILE = "mlflow.json"  # beside results.json: where and whether the run reached MLflow
PARENT_FILE = "mlflow_parent.json"  # in a sweep dir: the sweep's parent run
CONFIG_FILE = "resolved_config.yaml"  # the config as measured (auto sizes filled in)
# the sweep's parent run id, for jobs launched in this process (Hydra's basic launcher)
PARENT_ENV = "GPUBENCH_MLFLOW_PARENT_RUN_ID"

RUN_STATUS = {
    "ok": "FINISHED",
    "over_ceiling": "FINISHED",  # measured fine, just too big for the memory ceiling
    "oom": "FAILED",
    "failed": "FAILED",
    "killed": "KILLED",
    "running": "KILLED",  # results.json never got a final status: the process died
}

# files of a run dir worth keeping next to the run: plots, profiler traces, the job log
ARTIFACT_GLOBS = ("*.png", "*.svg", "*.html", "*.log", "*trace*.json", "*.json.gz")
ARTIFACT_DIRS = ("traces", "profiler", "plots")

# MLflow limits (mlflow.utils.validation)
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


class TrackingUnavailable(RuntimeError):
    """The tracking store could not be reached or refused the upload."""


# ------------------------------------------------------------------ where runs go


def default_uri(cwd: str | Path | None = None) -> str:
    """The embedded store: sqlite under <cwd>/outputs, no server needed."""
    db = Path(cwd or Path.cwd()).resolve() / "outputs" / "mlflow.db"
    return f"sqlite:///{db}"


def resolve_uri(uri: str | None, cwd: str | Path | None = None) -> str:
    return str(uri) if uri else default_uri(cwd)


def _sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):])
    return None


def _artifact_location(uri: str) -> str | None:
    """Artifacts of a sqlite store sit beside the database (outputs/mlartifacts); MLflow's own
    default would be ./mlruns under whatever the current directory happens to be."""
    db = _sqlite_path(uri)
    return (db.parent / "mlartifacts").resolve().as_uri() if db else None


def ui_hint(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    page = f"#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}"
    return f"`mlflow ui --backend-store-uri {uri}`, then {page}"


# ------------------------------------------------------------------ connecting


@contextlib.contextmanager
def _bounded_http(timeout_s: float):
    """MLflow's HTTP client retries 7 times with exponential backoff and a 120 s timeout: a
    dead server would hold a finished benchmark for minutes. Bound it while we talk to it."""
    limits = {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout_s))),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # one line of ours instead
    }
    saved = {k: os.environ.get(k) for k in limits}
    os.environ.update(limits)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _probe(uri: str, timeout_s: float) -> None:
    """Fail in well under timeout_s when a server is down (connection refused is instant)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        pass  # it answered: reachable (a proxy may not route /health)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise TrackingUnavailable(f"no answer: {reason}") from e


class Store:
    """An MLflow client bound to one tracking URI and one experiment (created if new)."""

    def __init__(self, uri: str, experiment: str, timeout_s: float = 10.0):
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):  # store creation chatter at INFO; keep warnings
            logging.getLogger(name).setLevel(logging.WARNING)
        _probe(uri, timeout_s)
        db = _sqlite_path(uri)
        if db:
            db.parent.mkdir(parents=True, exist_ok=True)  # sqlite creates the file, not the dir
        self.uri, self.experiment = uri, experiment
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment_id(experiment)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=_artifact_location(self.uri))
        except MlflowException:  # created by another process meanwhile
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def find(self, tag: str, value: str):
        """Live (not deleted) runs of this experiment whose tag `tag` equals `value`."""
        return self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.{tag} = '{value}'", max_results=10
        )


@contextlib.contextmanager
def open_store(uri: str, experiment: str, timeout_s: float = 10.0):
    with _bounded_http(timeout_s):
        yield Store(uri, experiment, timeout_s)


# ------------------------------------------------------------------ what a run logs


def _param_str(v) -> str:
    # Hydra's own spelling, so a value can be pasted back as an override
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, (bool, list, dict)):
        return json.dumps(v)
    return str(v)


def _key(k: str) -> str:
    return _BAD_KEY_CHARS.sub("_", k)[:MAX_KEY]


def run_params(data: dict) -> dict[str, str]:
    """The knobs people compare on, by plain name, then the whole resolved config (dotted)."""
    c, env = data.get("config") or {}, data.get("env") or {}
    ds, ld, model = c.get("dataset", {}), c.get("loader", {}), c.get("model", {})
    knobs = {
        "model": model.get("_target_") or model.get("name"),
        "dataset": ds.get("name"),
        "image_size": ds.get("image_size"),
        "batch_size": ld.get("batch_size"),
        "num_workers": ld.get("num_workers"),
        "pin_memory": ld.get("pin_memory"),
        "prefetch_factor": ld.get("prefetch_factor"),
        "persistent_workers": ld.get("persistent_workers"),
        "precision": c.get("precision", {}).get("name"),
        "channels_last": c.get("channels_last"),
        "compile": c.get("compile"),
        "device": env.get("device"),
        "preload": ds.get("preload"),
        "augment_on": ds.get("augment_on"),
        "decode_on": ds.get("decode_on"),
        "optimizer": c.get("bench", {}).get("optimizer"),
    }
    params = knobs | flatten(c)
    return {_key(k): _param_str(v)[:MAX_PARAM_VALUE] for k, v in params.items()}


def _number(v) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def run_metrics(data: dict, now_ms: int | None = None) -> list[tuple[str, float, int, int]]:
    """(name, value, step, timestamp_ms): results.json's figures under the same names, phases as
    `<phase>/<name>`, and per-step series (with warm-up, so the UI draws the warm-up curve)."""
    now_ms = now_ms or int(time.time() * 1000)
    out = []

    def add(name, v, step=0, ts=now_ms):
        x = _number(v)
        if x is not None:
            out.append((_key(name), x, step, ts))

    for k, v in data.items():
        add(k, v)
    for k, v in (data.get("data_info") or {}).items():
        add(f"data_info/{k}", v)
    for phase, ph in (data.get("phases") or {}).items():
        for k, v in {**ph, **(ph.get("telemetry") or {}), **(ph.get("memory") or {})}.items():
            add(f"{phase}/{k}", v)

    # telemetry sample times are a monotonic clock: keep their spacing, anchored at now
    series = data.get("series") or {}
    times = [x["t"] for s in series.values() for x in s.get("telemetry", [])]
    t0 = min(times) if times else 0.0
    for phase, s in series.items():
        bs = (data.get("phases") or {}).get(phase, {}).get("batch_size")
        steps = [*s.get("warmup_step_times_s", []), *s.get("step_times_s", [])]
        for i, dt in enumerate(steps):
            add(f"{phase}/step_time_s", dt, i)
            if bs and dt and dt > 0:
                add(f"{phase}/step_images_per_sec", bs / dt, i)
        for i, sample in enumerate(s.get("telemetry", [])):
            ts = now_ms + int((sample["t"] - t0) * 1000)
            for k, v in sample.items():
                if k != "t":
                    add(f"{phase}/telemetry/{k}", v, i, ts)
    return out


def read_overrides(run_dir: Path, cfg=None) -> str | None:
    """The Hydra override string: from the run dir's .hydra/ (CLI runs, and sync), else from a
    composed config's hydra node."""
    f = run_dir / ".hydra" / "overrides.yaml"
    if f.is_file():
        return " ".join(yaml.safe_load(f.read_text()) or [])
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        pass
    task = cfg.get("hydra", {}).get("overrides", {}).get("task") if cfg is not None else None
    return " ".join(task) if task is not None else None


def run_tags(data: dict, overrides: str | None = None) -> dict[str, str]:
    env = data.get("env") or {}
    tags = {
        "run_uid": data.get("run_uid"),
        "status": data.get("status"),
        "bottleneck": data.get("bottleneck"),
        "error": data.get("error"),
        "device_name": env.get("device_name"),
        "device_kind": env.get("device"),
        "driver": env.get("driver"),
        "cuda": env.get("cuda"),
        "cudnn": env.get("cudnn"),
        "torch": env.get("torch"),
        "torchvision": env.get("torchvision"),
        "python": env.get("python"),
        "cpu_count": env.get("cpu_count"),
        "host": env.get("host"),
        "platform": env.get("platform"),
        "gpubench_version": env.get("gpubench"),
        "git_commit": env.get("git_commit"),
        "overrides": overrides,
        "mlflow.source.name": "gpubench",
        "mlflow.source.type": "LOCAL",
        "mlflow.source.git.commit": env.get("git_commit"),
        "mlflow.user": _user(),
        "mlflow.note.content": _note(data),
    }
    return {k: str(v)[:MAX_TAG_VALUE] for k, v in tags.items() if v not in (None, "")}


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def _note(data: dict) -> str | None:
    """The verdict as the run's description in the UI."""
    if not data.get("bottleneck"):
        return data.get("error")
    advice = "".join(f"\n{i}. {a}" for i, a in enumerate(data.get("advice") or [], 1))
    return f"narrowest pipe: **{data['bottleneck']}**. {data.get('reason') or ''}\n{advice}"


def run_name(data: dict, name: str | None = None) -> str:
    if name:
        return name
    c = data.get("config") or {}
    ld = c.get("loader", {})
    parts = [
        str(c.get("model", {}).get("name")),
        f"bs{ld.get('batch_size')}",
        f"w{ld.get('num_workers')}",
        str(c.get("precision", {}).get("name")),
    ]
    if c.get("channels_last"):
        parts.append("cl")
    if c.get("compile") not in (None, "off"):
        parts.append(f"compile-{c['compile']}")
    return "-".join(parts)


def _epoch_ms(stamp: str | None) -> int | None:
    try:
        return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp() * 1000)
    except (TypeError, ValueError):
        return None


def _artifacts(run_dir: Path) -> tuple[list[Path], list[Path]]:
    files = {p for g in ARTIFACT_GLOBS for p in run_dir.glob(g) if p.is_file()}
    files -= {run_dir / MARKER_FILE}
    dirs = [run_dir / d for d in ARTIFACT_DIRS if (run_dir / d).is_dir()]
    return sorted(files), dirs


def upload(store: Store, data: dict, run_dir: Path, parent_id: str | None = None,
           name: str | None = None, overrides: str | None = None) -> str:
    """One complete MLflow run from a results.json dict; returns its run id. The run is marked
    terminated last, so a run still RUNNING in MLflow is an upload that broke half-way."""
    from mlflow.entities import Metric, Param

    c = store.client
    tags = run_tags(data, overrides)
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    start = _epoch_ms(data.get("started_at"))
    run = c.create_run(store.experiment_id, start_time=start, tags=tags,
                       run_name=run_name(data, name))
    rid = run.info.run_id

    params = [Param(k, v) for k, v in run_params(data).items()]
    for i in range(0, len(params), PARAMS_PER_BATCH):
        c.log_batch(rid, params=params[i:i + PARAMS_PER_BATCH])
    metrics = [Metric(k, v, ts, step) for k, v, step, ts in run_metrics(data)]
    for i in range(0, len(metrics), METRICS_PER_BATCH):
        c.log_batch(rid, metrics=metrics[i:i + METRICS_PER_BATCH])

    c.log_artifact(rid, str(run_dir / RESULTS_FILE))
    if (run_dir / CONFIG_FILE).is_file():
        c.log_artifact(rid, str(run_dir / CONFIG_FILE))
    if (run_dir / ".hydra").is_dir():
        c.log_artifacts(rid, str(run_dir / ".hydra"), "hydra")
    files, dirs = _artifacts(run_dir)
    for f in files:
        c.log_artifact(rid, str(f))
    for d in dirs:
        c.log_artifacts(rid, str(d), d.name)

    seconds = data.get("seconds")
    end = start + int(seconds * 1000) if start and seconds else None
    c.set_terminated(rid, RUN_STATUS.get(data.get("status"), "FAILED"), end_time=end)
    return rid


# ------------------------------------------------------------------ marker files


def _read_json(path: Path) -> dict:
    return read_json(path) or {}


def write_marker(run_dir: Path, run_uid: str, uri: str, experiment: str, run_id=None,
                 experiment_id=None, error=None) -> None:
    write_json(run_dir / MARKER_FILE, {
        "run_uid": run_uid,
        "synced": run_id is not None,
        "tracking_uri": uri,
        "experiment": experiment,
        "experiment_id": experiment_id,
        "run_id": run_id,
        "error": error,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })


def write_config(run_dir: Path, data: dict) -> None:
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(data.get("config") or {}, sort_keys=False))


def _warn(uri: str, err: BaseException, run_dir: Path) -> None:
    where = _sweep_of(run_dir) or run_dir  # a sweep's jobs are synced together with it
    msg = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    print(
        f"gpubench: warning: run not logged to MLflow at tracking.uri={uri} ({msg}); its results "
        f"are kept in {run_dir}; upload them later: python -m gpubench.tracking sync {where}",
        file=sys.stderr, flush=True,
    )


# ------------------------------------------------------------------ a run, a sweep


def _job_parent(run_dir: Path) -> str | None:
    """The sweep's parent run, for a job of a multirun: the env var set by the callback in this
    process, else the file it left in the sweep dir (launchers that run jobs elsewhere)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        sweep_dirs = [Path(hc.sweep.dir), run_dir.parent]
    except (ImportError, ValueError):
        return None
    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    for d in sweep_dirs:
        p = _read_json(d / PARENT_FILE)
        if p.get("run_id"):
            return p["run_id"]
    return None


def log_result(cfg, result) -> bool:
    """Upload one finished run. Never raises: on any failure it prints one warning line, marks
    the run unsynced and returns False (its results stay on disk for `sync`)."""
    t = cfg.tracking
    uri = resolve_uri(t.uri)
    run_dir = Path(result.path).parent
    data = result.data
    try:
        write_config(run_dir, data)  # on disk before any store is contacted
        with open_store(uri, t.experiment, float(t.timeout_s)) as store:
            rid = upload(store, data, run_dir, _job_parent(run_dir), t.get("run_name"),
                         read_overrides(run_dir, cfg))
    except Exception as e:  # a tracking failure must never cost the measurement
        log.debug("MLflow upload failed", exc_info=True)
        write_marker(run_dir, data["run_uid"], uri, t.experiment, error=f"{type(e).__name__}: {e}")
        _warn(uri, e, run_dir)
        return False
    write_marker(run_dir, data["run_uid"], uri, t.experiment, rid, store.experiment_id)
    log.info("MLflow run %s: %s", rid, ui_hint(uri, store.experiment_id, rid))
    return True


def _sweep_params(overrides: list[str], sweeper_params: dict | None) -> dict[str, str]:
    params = {}
    for o in overrides:
        k, _, v = o.partition("=")
        params[_key(k.lstrip("+~"))] = v[:MAX_PARAM_VALUE]
    for k, v in (sweeper_params or {}).items():
        params[_key(str(k))] = str(v)[:MAX_PARAM_VALUE]
    return params


def open_sweep(store: Store, sweep_dir: Path, overrides: list[str], sweeper: str | None = None,
               sweeper_params: dict | None = None, name: str | None = None) -> str:
    """The sweep's parent run (found again by its sweep_uid, or created), recorded in the sweep
    dir's parent file; returns its run id."""
    from mlflow.entities import Param

    sweep_dir.mkdir(parents=True, exist_ok=True)
    info = _read_json(sweep_dir / PARENT_FILE)
    uid = info.get("sweep_uid") or uuid.uuid4().hex
    found = store.find("sweep_uid", uid)
    if found:
        rid = found[0].info.run_id
    else:
        tags = {
            "sweep_uid": uid,
            "sweep_dir": str(sweep_dir),
            "overrides": " ".join(overrides),
            "sweeper": sweeper,
            "mlflow.source.name": "gpubench",
            "mlflow.source.type": "LOCAL",
            "mlflow.user": _user(),
        }
        run = store.client.create_run(
            store.experiment_id, run_name=name or f"sweep {sweep_dir.parent.name}/{sweep_dir.name}",
            tags={k: str(v)[:MAX_TAG_VALUE] for k, v in tags.items() if v},
        )
        rid = run.info.run_id
        params = [Param(k, v) for k, v in _sweep_params(overrides, sweeper_params).items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            store.client.log_batch(rid, params=params[i:i + PARAMS_PER_BATCH])
    write_json(sweep_dir / PARENT_FILE, info | {
        "sweep_uid": uid, "tracking_uri": store.uri, "experiment": store.experiment,
        "experiment_id": store.experiment_id, "run_id": rid, "synced": True,
    })
    return rid


def best_job(sweep_dir: Path) -> tuple[Path, dict] | None:
    """The job with the highest objective (0 for infeasible ones), from its results.json.
    A gpubench-sweeper sweep names its best itself in sweep.json: its short screening jobs
    must not win over full-length measurements."""
    chosen = (_read_json(sweep_dir / "sweep.json").get("best") or {}).get("dir")
    if chosen and (Path(chosen) / RESULTS_FILE).is_file():
        return Path(chosen), _read_json(Path(chosen) / RESULTS_FILE)
    best = None
    for p in find_runs(sweep_dir):
        d = _read_json(p)
        obj = d.get("objective") if d.get("status") == "ok" else None
        if obj is not None and (best is None or obj > best[1]["objective"]):
            best = (p.parent, d)
    return best


def close_sweep(store: Store, sweep_dir: Path, parent_id: str) -> None:
    """Log the best child's id, config and throughput to the parent run, and end it."""
    from mlflow.entities import Metric, RunTag

    c = store.client
    jobs = [_read_json(p) for p in find_runs(sweep_dir)]
    now = int(time.time() * 1000)
    metrics = [
        Metric("jobs", float(len(jobs)), now, 0),
        Metric("jobs_ok", float(sum(j.get("status") == "ok" for j in jobs)), now, 0),
    ]
    tags = []
    best = best_job(sweep_dir)
    if best:
        run_dir, d = best
        child = _read_json(run_dir / MARKER_FILE).get("run_id")
        metrics.append(Metric("best_objective", float(d["objective"]), now, 0))
        if d.get("images_per_sec") is not None:
            metrics.append(Metric("best_images_per_sec", float(d["images_per_sec"]), now, 0))
        tags += [RunTag("best_run_dir", str(run_dir))]
        if child:
            tags.append(RunTag("best_run_id", child))
        ov = read_overrides(run_dir)
        if ov is not None:
            tags.append(RunTag("best_overrides", ov[:MAX_TAG_VALUE]))
        c.log_text(parent_id, yaml.safe_dump(d.get("config") or {}, sort_keys=False),
                   "best_config.yaml")
    c.log_batch(parent_id, metrics=metrics, tags=tags)
    if (sweep_dir / "multirun.yaml").is_file():
        c.log_artifact(parent_id, str(sweep_dir / "multirun.yaml"))
    # a sweep stopped by Ctrl-C never reaches Hydra's end callback; `sync` closes it, as KILLED
    killed = any(j.get("status") in ("killed", "running") for j in jobs)
    c.set_terminated(parent_id, "KILLED" if killed else "FINISHED")
    info = _read_json(sweep_dir / PARENT_FILE)
    write_json(sweep_dir / PARENT_FILE, info | {"finished": True})


def log_sweep_files(sweep_dir: Path, parent_id: str, files: list[Path],
                    timeout_s: float = 10.0) -> None:
    """Attach files (a sweep report, plots) to the sweep's parent run."""
    info = _read_json(sweep_dir / PARENT_FILE)
    with open_store(info["tracking_uri"], info["experiment"], timeout_s) as store:
        for f in files:
            store.client.log_artifact(parent_id, str(f))


# ------------------------------------------------------------------ finding runs


def _sweep_of(run_dir: Path) -> Path | None:
    return run_dir.parent if (run_dir.parent / "multirun.yaml").is_file() else None


# artifact stores hold copies of results.json; those are uploads, not runs
STORE_DIRS = ("mlartifacts", "mlruns")


def find_runs(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STORE_DIRS)
        if RESULTS_FILE in files:
            found.append(Path(dirpath) / RESULTS_FILE)
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m gpubench.tracking sync DIR`: see gpubench/sync.py."""
    from gpubench.sync import main as sync_main

    return sync_main(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
