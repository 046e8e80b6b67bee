"""`tracking sync` and sweep parents against real stores (sqlite, a real `mlflow server`):
dead runs, artifact-store copies, quotes in identities, credentials, resumed sweeps."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, sqlite_store, start_cli

from gpubench.core import record
from gpubench.core.record import RunRecord, Status
from gpubench.tracking import MARKER_FILE, PARENT_FILE, open_store, sweeps, upload
from gpubench.tracking.sync import in_artifact_store, sync


def write_run(run_dir: Path, uid: str, status=Status.ok, pid=None, uri=None, **kw) -> RunRecord:
    rec = RunRecord.from_dict({
        "run_uid": uid, "status": status.value, "images_per_sec": 100.0, "bottleneck": "data",
        "phases": {"loader": {"phase": "loader", "batch_size": 4, "images_per_sec": 250.0}},
        "config": {"model": {"name": "tiny"}, "loader": {"batch_size": 4, "num_workers": 0},
                   "precision": {"name": "fp32"},
                   "tracking": {"uri": uri, "experiment": "gpubench"}},
        "pid": pid, "host": socket.gethostname(), **kw,
    }, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rec.save()
    return rec


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def all_runs(uri, experiment="gpubench"):
    c = client(uri)
    return c.search_runs([c.get_experiment_by_name(experiment).experiment_id])


def test_dead_running_record_is_killed_kept_and_uploaded(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    dead = write_run(tmp_path / "out" / "dead", "dead1", Status.running, pid=dead_pid())
    write_run(tmp_path / "out" / "alive", "alive1", Status.running, pid=None)  # cannot be judged
    counts = sync(tmp_path / "out", uri=uri)
    assert counts == {"uploaded": 1, "present": 0, "skipped": 1, "failed": 0}
    rec = record.load(dead.dir)
    assert rec.status is Status.killed and "ended without a final status" in rec.error
    assert rec.phases["loader"].images_per_sec == 250.0  # what it measured is kept
    (run,) = all_runs(uri)
    assert run.info.status == "KILLED" and run.data.tags["status"] == "killed"
    assert run.data.metrics["loader/images_per_sec"] == 250.0


def test_untracked_runs_are_left_alone_unless_a_uri_is_given(tmp_path):
    """A run measured with tracking=none named no store (its tracking.uri, whatever it says,
    was never used nor checked): `sync` without --uri leaves it be instead of failing on it;
    with --uri it is uploaded on purpose."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    tracked = write_run(tmp_path / "out" / "tracked", "t1", uri=uri)
    untracked = write_run(tmp_path / "out" / "untracked", "u1", uri="htp:/never-checked")
    untracked.config["tracking"]["backend"] = "none"
    untracked.save()
    tracked.config["tracking"]["backend"] = "mlflow"
    tracked.save()
    assert sync(tmp_path / "out") == {"uploaded": 1, "present": 0, "skipped": 1, "failed": 0}
    assert [r.data.tags["run_uid"] for r in all_runs(uri)] == ["t1"]
    assert sync(tmp_path / "out", uri=uri) == {"uploaded": 1, "present": 1, "skipped": 0,
                                               "failed": 0}
    assert sorted(r.data.tags["run_uid"] for r in all_runs(uri)) == ["t1", "u1"]


def test_artifact_store_copies_are_not_runs(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    out = tmp_path / "out"
    write_run(out / "runs" / "a", "real1")
    rid = "0123456789abcdef0123456789abcdef"
    for copy in (out / "server-artifacts" / "1" / rid / "artifacts",  # any --artifacts-destination
                 out / "mlartifacts" / "1" / rid / "artifacts"):
        write_run(copy, "copy1")
    assert in_artifact_store(out / "server-artifacts" / "1" / rid / "artifacts")
    assert not in_artifact_store(out / "runs" / "a")
    assert sync(out, uri=uri)["uploaded"] == 1
    assert {r.data.tags["run_uid"] for r in all_runs(uri)} == {"real1"}
    assert not (out / "server-artifacts" / "1" / rid / "artifacts" / MARKER_FILE).exists()


def test_quotes_in_identity_do_not_break_search(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    uids = ["it's", 'say "hi"', "x' or tags.run_uid != '"]
    for i, uid in enumerate(uids):
        write_run(tmp_path / "out" / str(i), uid)
    assert sync(tmp_path / "out", uri=uri)["uploaded"] == 3
    for i in range(3):  # forget the markers: identities alone must find the runs again
        (tmp_path / "out" / str(i) / MARKER_FILE).unlink()
    again = sync(tmp_path / "out", uri=uri)
    assert again["uploaded"] == 0 and again["present"] == 3
    assert sorted(r.data.tags["run_uid"] for r in all_runs(uri)) == sorted(uids)


def test_resumed_sweep_parent_ends_finished_with_every_job(tmp_path):
    """The callback's sequence: the first attempt is killed (no end), `sync` closes it KILLED;
    the resume into the same dir reopens the same parent, adds its jobs, ends FINISHED."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {overrides: {task: ['loader.batch_size=2,4']}}")
    sweeps.mark_ended(sweep, False)
    with open_store(uri, "gpubench") as store:
        parent = sweeps.open_sweep(store, sweep, ["loader.batch_size=2,4"])
        killed = write_run(sweep / "0", "job0", Status.killed)
        upload(store, killed, killed.dir, parent)
    write_run(sweep / "1", "job1", Status.running, pid=dead_pid())  # kill -9 of the sweep
    # the sweep's process, recorded by mark_ended, is the one killed (a live one is left alone)
    info = json.loads((sweep / PARENT_FILE).read_text())
    (sweep / PARENT_FILE).write_text(json.dumps(info | {"pid": dead_pid()}))
    sync(sweep, uri=uri)
    info = json.loads((sweep / PARENT_FILE).read_text())
    assert info["finished"] and info["interrupted"]
    assert client(uri).get_run(parent).info.status == "KILLED"

    sweeps.mark_ended(sweep, False)  # the resume
    with open_store(uri, "gpubench") as store:
        assert sweeps.open_sweep(store, sweep, ["loader.batch_size=2,4"]) == parent
        for i, uid in ((2, "job2"), (3, "job3")):
            rec = write_run(sweep / str(i), uid, images_per_sec=100.0 + i)
            upload(store, rec, rec.dir, parent)
        sweeps.mark_ended(sweep, True)
        sweeps.close_sweep(store, sweep, parent, interrupted=sweeps.interrupted(sweep, []))
    p = client(uri).get_run(parent)
    assert p.info.status == "FINISHED"
    children = [r for r in all_runs(uri) if r.info.run_id != parent]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent}
    assert sorted(r.data.tags["run_uid"] for r in children) == ["job0", "job1", "job2", "job3"]
    assert p.data.metrics["best_images_per_sec"] == 103.0 and p.data.metrics["jobs"] == 4
    assert sync(sweep, uri=uri)["uploaded"] == 0
    assert client(uri).get_run(parent).info.status == "FINISHED"  # a later sync keeps it


def test_credentials_in_uri_connect_and_are_masked(mlflow_server, tmp_path, capsys):
    host = mlflow_server.url.removeprefix("http://")
    secret_uri = f"http://bob:s3cr3t-pw@{host}"
    rec = write_run(tmp_path / "out" / "r", "cred1", uri=secret_uri)
    (rec.dir / "gpubench.log").write_text(f"tracking.uri={secret_uri}\n")
    proc = run_cli("sync", str(tmp_path / "out"), "--uri", secret_uri, "--experiment", "creds",
                   module="gpubench.tracking", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "s3cr3t" not in proc.stdout + proc.stderr
    marker = json.loads((rec.dir / MARKER_FILE).read_text())
    assert marker["synced"] and marker["tracking_uri"] == f"http://bob:***@{host}"
    (run,) = all_runs(mlflow_server.url, "creds")
    c = client(mlflow_server.url)
    values = [*run.data.params.values(), *run.data.tags.values()]
    assert run.data.params["tracking.uri"] == f"http://bob:***@{host}"
    assert not any("s3cr3t" in v for v in values)
    for name in ("results.json", "gpubench.log"):
        text = Path(c.download_artifacts(run.info.run_id, name, str(tmp_path))).read_text()
        assert "s3cr3t" not in text and "bob:***@" in text
    # a later sync from the marker alone (masked URI) still reaches the server
    assert sync(tmp_path / "out")["present"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["sync", "/no/such/dir"], "not a folder"),
    (["sync", ".", "--timeout", "0"], "--timeout"),
    (["sync", ".", "--uri", "htp:/bad::uri"], "not a tracking URI"),
    (["sync", ".", "--uri", "http://bob:pw@host:port"], "--uri 'http://bob:***@host:port'"),
    (["sync", ".", "--bogus"], "unrecognized arguments: --bogus"),
    (["push"], "invalid choice: 'push'"),
])
def test_cli_bad_input_is_one_line(args, needle, tmp_path):
    proc = run_cli(*args, module="gpubench.tracking", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _final_jobs(sweep: Path) -> int:
    n = 0
    for j in json.loads((sweep / "sweep.json").read_text()).get("jobs", []):
        rec = record.load(j["dir"])
        n += rec is not None and rec.status.final
    return n


@pytest.mark.slow
def test_cli_sweep_killed_then_resumed_parent_finished(tmp_path):
    """The real commands: a tracked gpubench sweep killed with -9 mid-way, `tracking sync`,
    then the same command again."""
    import os
    import signal
    import time

    from conftest import TINY

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=gpubench", *[o for o in TINY if not o.startswith("tracking=")],
            "tracking=mlflow", f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}",
            "loader.batch_size=range(1,9)", "hydra.sweeper.n_trials=4",
            "hydra.sweeper.screen.steps=null", "hydra.sweeper.seed=3",
            "hydra.sweeper.report=false", "hydra.sweeper.confirm.top=0"]
    proc = start_cli(*args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            if (sweep / "sweep.json").is_file() and _final_jobs(sweep) >= 2:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # as kill -9: no end callback, nothing cleaned up
        proc.wait()
    assert 2 <= _final_jobs(sweep) < 4, "the sweep was not killed mid-way"

    sync(sweep, uri=uri)
    parent = json.loads((sweep / PARENT_FILE).read_text())["run_id"]
    assert client(uri).get_run(parent).info.status == "KILLED"

    p = run_cli(*args, cwd=tmp_path)  # the same command again resumes the study
    assert p.returncode == 0, p.stderr[-3000:]
    runs = all_runs(uri)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_id for r in parents] == [parent]
    assert client(uri).get_run(parent).info.status == "FINISHED"
    uids = {record.load(d).run_uid for d in record.find_runs(sweep)}
    children = {r.data.tags["run_uid"] for r in runs if r.data.tags.get("mlflow.parentRunId") == parent}
    assert children == uids and len(uids) >= 4  # every job of both attempts (a killed one too)
    assert all(record.load(d).status.final for d in record.find_runs(sweep))
