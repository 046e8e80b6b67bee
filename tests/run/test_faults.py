"""Faults a sweep or an upload meets (issue 20, items 5 to 9): nothing measured lost, nothing
uploaded twice, one line where a command ends. docs/reliability.md lists the same cases with the
command and what a user sees."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from conftest import TINY, run_cli, sqlite_store, start_process
from optuna.trial import TrialState

from gpubench.core import record
from gpubench.core.record import Status
from gpubench.search.jobs import mark_stale_runs, read_job
from gpubench.search.study import measured_trials

SWEEP_TINY = [o for o in TINY if not o.startswith("tracking=")]


def _dead_pid() -> int:
    """A pid no process has: the kernel's pid_max (every pid is below it)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """A real run's results.json (the tiny model, all three phases)."""
    tmp = tmp_path_factory.mktemp("measured")
    p = run_cli(*TINY, f"hydra.run.dir={tmp / 'run'}", cwd=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads((tmp / "run" / "results.json").read_text())


def _left_running(measured: dict, where: Path, pid: int, drop: tuple[str, ...] = ()) -> Path:
    """The record a run leaves when it dies after saving its last phase, before its final
    status (a full disk refuses the final write): `running`, every phase saved, no summary."""
    data = {**measured, "status": "running", "error": None, "pid": pid,
            "host": socket.gethostname(), "objective": None}
    for k in ("images_per_sec", "images_per_sec_ci", "bottleneck", "reason"):
        data[k] = None
    data["phases"] = {k: v for k, v in measured["phases"].items() if k not in drop}
    where.mkdir(parents=True)
    (where / "results.json").write_text(json.dumps(data))
    return where


# ------------------------------------------------------------------ 5: a measured job lost


@pytest.mark.slow
def test_a_resume_keeps_a_record_whose_every_phase_was_saved(measured, tmp_path):
    dead = _dead_pid()
    whole = _left_running(measured, tmp_path / "0", dead)
    cut = _left_running(measured, tmp_path / "1", dead, drop=("e2e",))
    alive = _left_running(measured, tmp_path / "2", os.getpid(), drop=("e2e",))

    assert mark_stale_runs(tmp_path) == 1  # only the one that died mid-measurement
    rec = record.load(whole)
    assert rec.status is Status.ok and rec.error is None
    assert rec.throughput == pytest.approx(measured["phases"]["e2e"]["images_per_sec"])
    assert rec.objective > 0 and "ended before its final status" in rec.extra["recovered"]
    assert record.load(cut).status is Status.killed
    assert record.load(alive).status is Status.running  # its process is alive: left alone
    done = _left_running(measured, tmp_path / "3", dead)
    (done / "results.json").write_text(json.dumps({**measured, "pid": dead}))
    assert mark_stale_runs(tmp_path) == 0 and record.load(done).status is Status.ok


@pytest.mark.slow
def test_a_job_whose_final_write_failed_is_told_as_measured(measured, tmp_path):
    """In-process (Hydra's basic launcher) the job's own process is the sweeper: alive, yet
    the job is over; its record holds every phase."""
    d = _left_running(measured, tmp_path / "0", os.getpid())
    err = OSError(28, "No space left on device")
    rec = read_job(d, err, record.Rung.full)
    assert rec.status is Status.ok and rec.feasible and rec.throughput > 0
    # refused before its last phase: failed by its disk, so asked again (not the config's fault)
    d = _left_running(measured, tmp_path / "1", os.getpid(), drop=("e2e",))
    rec = read_job(d, err, record.Rung.full)
    assert rec.status is Status.failed and rec.extra.get("requeue")
    assert "No space left on device" in rec.error
    # the resume, once that process is gone: the outcome the study was told, not `killed`
    d = _left_running(measured, tmp_path / "dead" / "1", _dead_pid(), drop=("e2e",))
    assert mark_stale_runs(tmp_path / "dead", {str(d): ("failed", rec.error)}) == 0
    assert record.load(d).status is Status.failed and record.load(d).error == rec.error


def _wait(cond, proc, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended before {what}: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def _jobs_listed(path: Path) -> int:
    try:
        return len(json.loads(path.read_text()).get("jobs", []))
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_a_sweep_json_that_cannot_be_written_costs_no_measurement(tmp_path):
    """sweep.json refused after the second job measured (a full disk): the job is told to the
    study before the sweep stops, and the same command run again measures only what is left."""
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=gpubench", *SWEEP_TINY, "tracking=none",
            f"hydra.sweep.dir={sweep}", f"hydra.sweeper.storage=sqlite:///{tmp_path}/study.db",
            # its one phase lasts its 1 s cap: time to refuse the manifest
            "bench.steps=1000000", "bench.max_seconds=1", "bench.phases=[e2e]",
            "loader.batch_size=choice(2,4,8)",
            "hydra.sweeper.n_trials=3", "hydra.sweeper.screen.steps=null",
            "hydra.sweeper.confirm.top=0", "hydra.sweeper.report=false", "hydra.sweeper.seed=0"]
    proc = start_process(*args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
    manifest = sweep / "sweep.json"
    try:
        _wait(lambda: _jobs_listed(manifest) == 1, proc, "the first job")
        kept = manifest.read_text()
        # a folder where sweep.json was: every later write of it fails, as on a full disk
        manifest.unlink()
        (manifest / "x").mkdir(parents=True)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if ln.startswith("gpubench")]
    assert proc.returncode == 1 and lines == [lines[0]], err[-2000:]
    assert "sweep.json" in lines[0]
    study = optuna.load_study(study_name=json.loads(kept)["study_name"],
                              storage=f"sqlite:///{tmp_path}/study.db")
    assert len(measured_trials(study)) == 2  # the job measured after the refusal is kept

    (manifest / "x").rmdir()
    manifest.rmdir()
    manifest.write_text(kept)
    p = run_cli(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    study = optuna.load_study(study_name=json.loads(kept)["study_name"],
                              storage=f"sqlite:///{tmp_path}/study.db")
    done = measured_trials(study)
    assert len(done) == 3 and not [t for t in study.trials if t.state == TrialState.RUNNING]
    # three configurations, three jobs: none measured twice
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1", "2"]
    assert not (sweep / "report").exists()  # hydra.sweeper.report=false: none at its end
    assert sorted(t.params["loader.batch_size"] for t in done) == [2, 4, 8]


# ------------------------------------------------------------------ 6: uploaded twice

def _run_record(run_dir: Path, uid: str, pid: int | None, status: str = "ok") -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({
        "run_uid": uid, "status": status, "images_per_sec": 100.0,
        "phases": {"e2e": {"phase": "e2e", "batch_size": 4, "images_per_sec": 100.0}},
        "config": {"model": {"name": "tiny"}, "loader": {"batch_size": 4},
                   "precision": {"name": "fp32"}, "tracking": {"experiment": "gpubench"}},
        "pid": pid, "host": socket.gethostname()}))
    return run_dir


def _runs(uri: str, experiment: str = "gpubench") -> list:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(experiment)
    return c.search_runs([exp.experiment_id]) if exp else []


_HOLD = ("import sys, time; from pathlib import Path; from gpubench.tracking.runs import "
         "upload_claim\nwith upload_claim(Path(sys.argv[1])) as holder:\n    assert holder is None"
         "\n    print('held', flush=True)\n    time.sleep(600)")


@pytest.mark.slow
def test_an_upload_is_claimed_once_whoever_starts_it(tmp_path):
    from gpubench.tracking.sync import sync

    uri = sqlite_store(tmp_path / "mlflow.db")
    run = _run_record(tmp_path / "out" / "run", "claimed1", _dead_pid())
    # another process (the run itself, or a second sync) is uploading it: left alone
    holder = start_process(str(run), code=_HOLD, module=None, cwd=tmp_path, stdout=subprocess.PIPE,
                       text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        counts = sync(tmp_path / "out", uri=uri)
        assert counts["uploaded"] == 0 and counts["skipped"] == 1 and not _runs(uri)
    finally:
        holder.kill()
        holder.wait()
    # its claimer died mid-upload: the claim is taken over, the run uploaded once
    assert sync(tmp_path / "out", uri=uri)["uploaded"] == 1
    assert not (run / "mlflow.claim").exists()
    assert sync(tmp_path / "out", uri=uri)["uploaded"] == 0
    assert [r.data.tags["run_uid"] for r in _runs(uri)] == ["claimed1"]


@pytest.mark.slow
def test_syncs_started_together_upload_a_run_once(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    from gpubench.tracking.store import open_store

    with open_store(uri, "gpubench"):  # the store exists: only the upload races
        pass
    for i in range(4):
        _run_record(tmp_path / "out" / str(i), f"together{i}", _dead_pid())
    procs = [start_process("sync", tmp_path / "out", "--uri", uri, module="gpubench.tracking",
                       cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    uids = sorted(r.data.tags["run_uid"] for r in _runs(uri))
    assert uids == [f"together{i}" for i in range(4)], uids  # each run once


@pytest.mark.slow
def test_sync_leaves_a_live_process_and_its_sweep_alone(tmp_path):
    from mlflow.tracking import MlflowClient

    from gpubench.tracking import sweeps
    from gpubench.tracking.store import open_store
    from gpubench.tracking.sync import sync

    uri = sqlite_store(tmp_path / "mlflow.db")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {overrides: {task: ['loader.batch_size=2,4']}}")
    sweeps.mark_ended(sweep, False)  # this process is the sweep, running
    with open_store(uri, "gpubench") as store:
        parent = sweeps.open_sweep(store, sweep, {"overrides": {"task": ["loader.batch_size=2,4"]}})
    # a job that ended but has not uploaded itself yet (its process is this one, alive)
    _run_record(sweep / "0", "live0", os.getpid())
    counts = sync(sweep, uri=uri)
    assert counts["uploaded"] == 0 and counts["skipped"] == 1
    assert MlflowClient(tracking_uri=uri).get_run(parent).info.status == "RUNNING"


# ------------------------------------------------------------------ 7: two workers, one store

_OPEN = ("import sys; from gpubench.tracking.store import open_store\n"
         "with open_store(sys.argv[1], 'gpubench') as s: print(s.experiment_id)")


@pytest.mark.slow
def test_processes_creating_one_sqlite_store_at_once_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    procs = [start_process(uri, code=_OPEN, module=None, cwd=tmp_path, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-1500:] for _, e in outs]
    assert len({o.strip() for o, _ in outs}) == 1  # one experiment


@pytest.mark.slow
def test_sync_attaches_jobs_uploaded_without_their_parent(tmp_path):
    """The worker that lost the store-creation race ran its sweep without a parent: each job
    uploaded itself alone. sync gives the sweep its parent and the jobs to it."""
    from gpubench.tracking import sweeps
    from gpubench.tracking.runs import PARENT_FILE, upload, write_marker
    from gpubench.tracking.store import open_store
    from gpubench.tracking.sync import sync

    uri = sqlite_store(tmp_path / "mlflow.db")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {overrides: {task: ['loader.batch_size=2,4']}}")
    sweeps.mark_ended(sweep, True)  # the sweep ended; its parent was never created
    with open_store(uri, "gpubench") as store:
        for i in range(2):
            d = _run_record(sweep / str(i), f"orphan{i}", _dead_pid())
            rid = upload(store, record.load(d), d, None)
            write_marker(d, f"orphan{i}", store.uri, store.experiment, rid, store.experiment_id)
    sync(sweep, uri=uri)
    parent = json.loads((sweep / PARENT_FILE).read_text())["run_id"]
    runs = {r.info.run_id: r for r in _runs(uri)}
    assert runs[parent].info.status == "FINISHED"
    children = [r for r in runs.values() if r.info.run_id != parent]
    assert sorted(r.data.tags["run_uid"] for r in children) == ["orphan0", "orphan1"]
    assert {r.data.tags.get("mlflow.parentRunId") for r in children} == {parent}


# ------------------------------------------------------------------ 8: read-only folders

@pytest.fixture
def read_only():
    """Makes a folder read-only for the commands under test: by its mode for a normal user,
    by a read-only bind mount for root (whom modes do not stop)."""
    mounted: list[Path] = []

    def make(path: Path) -> None:
        if os.geteuid() != 0:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
            return
        for cmd in (["mount", "--bind", str(path), str(path)],
                    ["mount", "-o", "remount,bind,ro", str(path)]):
            if subprocess.run(cmd, capture_output=True).returncode != 0:
                if mounted or cmd[1] == "-o":
                    subprocess.run(["umount", str(path)], capture_output=True)
                pytest.skip("root, and no read-only bind mount allowed here")
        mounted.append(path)

    yield make
    for path in mounted:  # lazily: a command run in this process may still hold a file there
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def _stderr_lines(p) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if ln.strip()]


@pytest.mark.slow
def test_report_on_a_read_only_sweep_is_one_line(measured, tmp_path, read_only):
    sweep = tmp_path / "sweep"
    for i in range(2):
        (sweep / str(i)).mkdir(parents=True)
        (sweep / str(i) / "results.json").write_text(json.dumps(measured))
    read_only(sweep)
    p = run_cli(str(sweep), module="gpubench.report", cwd=tmp_path)
    lines = _stderr_lines(p)
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-2000:]
    assert str(sweep) in lines[0] and "read-only" in lines[0] and "--out DIR" in lines[0]
    p = run_cli(str(sweep), "--out", str(tmp_path / "elsewhere"), module="gpubench.report",
                cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "elsewhere" / "ranking.csv").is_file(), p.stderr


@pytest.mark.slow
def test_sync_meeting_a_read_only_stale_run_is_one_line(tmp_path, read_only):
    run = _run_record(tmp_path / "out" / "run", "ro1", _dead_pid(), status="running")
    read_only(run)
    p = run_cli("sync", str(tmp_path / "out"), "--uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                module="gpubench.tracking", cwd=tmp_path)
    lines = _stderr_lines(p)
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-2000:]
    assert str(run / "results.json") in lines[0] and "read-only" in lines[0]
    assert json.loads((run / "results.json").read_text())["status"] == "running"  # untouched


# ------------------------------------------------------------------ 9: a damaged file

@pytest.mark.slow
def test_a_damaged_sweep_json_or_results_json_is_named_kept_and_read_around(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=gpubench", *SWEEP_TINY, "tracking=none",
            f"hydra.sweep.dir={sweep}", f"hydra.sweeper.storage=sqlite:///{tmp_path}/study.db",
            "loader.batch_size=choice(2,4,8)", "hydra.sweeper.screen.steps=null",
            "hydra.sweeper.confirm.top=0", "hydra.sweeper.report=false", "hydra.sweeper.seed=0"]
    p = run_cli(*args, "hydra.sweeper.n_trials=2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    manifest, results = sweep / "sweep.json", sweep / "0" / "results.json"
    cut = manifest.read_text()[: len(manifest.read_text()) // 2]  # a crash mid-write
    manifest.write_text(cut)
    results.write_text(results.read_text()[:200])

    p = run_cli(str(sweep), module="gpubench.report", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"{manifest} is damaged" in p.stderr and "reading study" in p.stderr
    assert f"{results} is damaged" in p.stderr and "what the study kept" in p.stderr
    ranking = (sweep / "report" / "ranking.csv").read_text().splitlines()
    assert len(ranking) == 1 + 2, ranking  # both trials, the damaged one from the study

    p = run_cli(*args, "hydra.sweeper.n_trials=3", cwd=tmp_path)  # the same sweep, resumed
    assert p.returncode == 0, p.stderr[-2000:]
    said = p.stdout + p.stderr  # the sweeper's log lines go where Hydra's logging sends them
    assert f"{manifest} is damaged" in said and "kept as sweep.json.damaged" in said, said
    assert "2 of 2 jobs matched to their trials" in said, said
    assert (sweep / "sweep.json.damaged").read_text() == cut  # never overwritten uncopied
    jobs = json.loads(manifest.read_text())["jobs"]
    # the two read back from their folders with their trials, then the new job (a sampled
    # duplicate of a measured trial takes a number without a job)
    assert sorted((j["num"], j.get("trial")) for j in jobs)[:2] == [(0, 0), (1, 1)]
    assert [j["num"] for j in jobs if j.get("trial", 0) >= 2] == [2]
    assert results.read_text().startswith("{") and len(results.read_text()) == 200  # untouched


# ------------------------------------------------------------------ 10: a storage that does not open

def _sweep_on(tmp: Path, url: str, *extra: str):
    return run_cli("-m", "hydra/sweeper=gpubench", *SWEEP_TINY, "tracking=none",
                   f"hydra.sweep.dir={tmp / 'sweep'}", f"hydra.sweeper.storage={url}",
                   "loader.batch_size=choice(2,4)", "hydra.sweeper.screen.steps=null",
                   "hydra.sweeper.confirm.top=0", "hydra.sweeper.report=false", *extra, cwd=tmp)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["refused", "not a database", "locked"])
def test_a_sweep_whose_storage_does_not_open_is_one_line(tmp_path, kind):
    """PostgreSQL down, a file that is no database, a lock another process holds: one line
    naming the storage (password masked) and the database's reason, exit 1, no job (before:
    100-150 lines of traceback, or a minute of retries)."""
    import sqlite3

    from conftest import free_port

    db = tmp_path / "study.db"
    url, reason, lock = f"sqlite:///{db}", "", None
    if kind == "refused":
        url = f"postgresql+psycopg://u:secretpw@127.0.0.1:{free_port()}/db"
        reason = "Connection refused"
    elif kind == "not a database":  # refused as bad input, before any work, the file kept
        db.write_text("a spreadsheet, not a database")
        reason = "holds something else"
    else:
        optuna.create_study(storage=url, study_name="held")
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        reason = "database is locked"
    try:
        p = _sweep_on(tmp_path, url)
    finally:
        if lock is not None:
            lock.close()
    lines = _stderr_lines(p)
    bad_input = kind == "not a database"
    assert p.returncode == (2 if bad_input else 1) and len(lines) == 1, p.stderr[-2000:]
    assert ("is not allowed" if bad_input else "could not be opened") in lines[0], lines[0]
    assert reason in lines[0], lines[0]
    assert "secretpw" not in p.stdout + p.stderr
    if bad_input:
        assert db.read_text() == "a spreadsheet, not a database"
    assert not list((tmp_path / "sweep").glob("*/results.json"))


@pytest.mark.slow
def test_a_resume_whose_study_is_on_a_read_only_mount_is_one_line(tmp_path, read_only):
    store = tmp_path / "store"
    store.mkdir()
    url = f"sqlite:///{store / 'study.db'}"
    p = _sweep_on(tmp_path, url, "hydra.sweeper.n_trials=1")
    assert p.returncode == 0, p.stderr[-2000:]
    read_only(store)
    p = _sweep_on(tmp_path, url, "hydra.sweeper.n_trials=2")
    lines = _stderr_lines(p)
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-2000:]
    assert "could not be opened: attempt to write a readonly database" in lines[0], lines[0]
    assert len(json.loads((tmp_path / "sweep" / "sweep.json").read_text())["jobs"]) == 1


# ------------------------------------------------------------------ 11: issue 29: a run folder
# that holds a run, SIGHUP, a second Ctrl-C (a hang: tests/test_watchdog.py)

def _refused(call, cfg) -> str:
    from gpubench.config.errors import ConfigError

    with pytest.raises(SystemExit) as e:
        call(cfg)
    assert isinstance(e.value.code, ConfigError), e.value.code
    return str(e.value.code)


def test_a_folder_holding_an_earlier_run_is_refused_before_anything_is_written(compose_cfg,
                                                                             tmp_path):
    from gpubench.cli.callbacks import MlflowSweepCallback

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text('{"status": "ok", "phases": {"e2e": {}}}')  # or damaged
    msg = _refused(MlflowSweepCallback().on_run_start,
                   compose_cfg(f"hydra.run.dir={run}", hydra=True))
    assert msg == (f"hydra.run.dir='{run}' is not allowed: it must be a folder holding no earlier run "
                   f"({run / 'results.json'} is one, never written over); leave hydra.run.dir "
                   "unset for a new timestamped folder, or move that run away")
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]
    for blank in ("''", "' '"):  # Hydra would write into the current folder
        msg = _refused(MlflowSweepCallback().on_run_start,
                       compose_cfg(f"hydra.run.dir={blank}", hydra=True))
        assert msg.startswith(f"hydra.run.dir={blank} is not allowed: it must be a folder path (blank "
                              "writes into the current folder"), msg
    # a run in a folder below is not written over: the folder is the user's to choose
    MlflowSweepCallback().on_run_start(compose_cfg(f"hydra.run.dir={tmp_path}", hydra=True))


def test_a_sweep_folder_holding_runs_is_resumed_only_by_the_sweeper_that_adds_folders(
        compose_cfg, tmp_path):
    from gpubench.cli.callbacks import RESUMING_SWEEPER, MlflowSweepCallback
    from hydra_plugins.gpubench_sweeper.config import GpubenchSweeperConf

    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    MlflowSweepCallback().on_multirun_start(compose_cfg(f"hydra.sweep.dir={sweep}", hydra=True))
    (sweep / "0" / "results.json").write_text("{}")
    msg = _refused(MlflowSweepCallback().on_multirun_start,
                   compose_cfg(f"hydra.sweep.dir={sweep}", hydra=True))  # Hydra's basic sweeper
    assert f"({sweep / '0' / 'results.json'} is one, never written over: this sweeper numbers " \
           "its jobs from 0); leave hydra.sweep.dir unset" in msg, msg
    # gpubench's sweeper resumes it: its jobs take new folders (manifest.reserve_job_dir)
    MlflowSweepCallback().on_multirun_start(
        compose_cfg("sweep=batch", f"hydra.sweep.dir={sweep}", hydra=True))
    assert RESUMING_SWEEPER == GpubenchSweeperConf._target_
    assert "a folder path" in _refused(MlflowSweepCallback().on_multirun_start,
                                       compose_cfg("hydra.sweep.dir=''", hydra=True))


@pytest.fixture
def handlers():
    """The process's signal handlers, put back after a test that changes them."""
    import signal

    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                             signal.SIGCHLD)}
    yield
    for s, h in kept.items():
        signal.signal(s, h)


def test_sighup_ends_a_run_as_sigterm_does_and_nohup_keeps_it_ignored(handlers, tmp_path):
    import signal

    from gpubench.cli import signals

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # started under nohup
    signals.install_sigterm()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signals._on_signal
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signals.install_sigterm()
    with pytest.raises(signals.Terminated) as e:
        signal.raise_signal(signal.SIGHUP)  # a dropped ssh session
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # a second one: the cleanup goes on
    e.value.run_dir = _run_record(tmp_path / "run", "hup1", os.getpid(), status="killed")
    assert signals.interrupted_line(e.value) == (
        "gpubench: interrupted by SIGHUP; status killed, 1 measured phase kept in "
        f"{tmp_path / 'run' / 'results.json'}", 128 + signal.SIGHUP)
    assert signals.killed_by_signal(128 + signal.SIGHUP) and not signals.killed_by_signal(1)


def test_a_second_signal_waits_until_the_record_is_final_then_goes_on(handlers):
    import signal

    from gpubench.run.ending import Hold

    # as a new interpreter starts (an earlier test of this worker may have left its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    hold = Hold()
    with hold:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the first ends measuring
        signal.raise_signal(signal.SIGINT)  # Ctrl-C again while the record is made final
        signal.raise_signal(signal.SIGHUP)  # (its default action would end this process)
    assert hold.late == [signal.SIGINT, signal.SIGHUP]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    with pytest.raises(KeyboardInterrupt):
        hold.replay()  # then it goes on: the caller skipped the upload
    hold = Hold()
    with hold:
        hold.arm()  # measuring ended by itself: the first signal waits too
        signal.raise_signal(signal.SIGTERM)
    assert hold.late == [signal.SIGTERM]


def test_what_a_stopped_run_kept_and_how_to_upload_it(tmp_path):
    from gpubench.run.ending import kept

    run = _run_record(tmp_path / "run", "kept1", os.getpid(), status="killed")
    line = f"status killed, 1 measured phase kept in {run / 'results.json'}"
    assert kept(run) == line  # not tracked: nothing to upload
    data = json.loads((run / "results.json").read_text())
    data["config"]["tracking"] |= {"backend": "mlflow", "uri": "http://u:pw@host:5000"}
    data["picture"] = str(run / "run.png")
    (run / "results.json").write_text(json.dumps(data))
    assert kept(run) == (f"{line} and run.png; not in MLflow: python -m gpubench.tracking sync "
                         f"{run} --uri http://u:***@host:5000")
    (run / "mlflow.json").write_text(json.dumps({"synced": True, "run_id": "abc"}))
    assert kept(run) == f"{line} and run.png"
    assert kept(tmp_path) is None


@pytest.mark.slow  # Hydra's own writes come before the task: the whole command is the subject
def test_a_rerun_into_a_run_or_sweep_folder_writes_nothing_there(tmp_path):
    run = tmp_path / "run"
    p = run_cli(*TINY, f"hydra.run.dir={run}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    (tmp_path / "empty").mkdir()
    for args, key, where, cwd in (((f"hydra.run.dir={run}",), "hydra.run.dir", run, tmp_path),
                                  (("hydra.run.dir=''",), "hydra.run.dir", "", tmp_path / "empty"),
                                  (("-m", "bench.steps=2,3", f"hydra.sweep.dir={run.parent}"),
                                   "hydra.sweep.dir", run.parent, tmp_path)):
        p = run_cli(*args, *TINY, cwd=cwd)
        lines = _stderr_lines(p)
        assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
        assert lines[0].startswith(f"gpubench: error: {key}='{where}' is not allowed"), lines
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    assert not any((tmp_path / "empty").iterdir())
