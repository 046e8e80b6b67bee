"""`tracking sync` and sweep parents against real stores (sqlite, a real `mlflow server`):
dead runs, artifact-store copies, quotes in identities, credentials, resumed sweeps."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import run_cli, sqlite_store, start_process

from gpubench.config.errors import ConfigError
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


@pytest.mark.slow
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
    uri = sqlite_store(tmp_path / "outputs" / "mlflow.db")  # the default store of outputs/
    tracked = write_run(tmp_path / "outputs" / "tracked", "t1", uri=uri)
    untracked = write_run(tmp_path / "outputs" / "untracked", "u1", uri="htp:/never-checked")
    untracked.config["tracking"]["backend"] = "none"
    untracked.save()
    tracked.config["tracking"]["backend"] = "mlflow"
    tracked.save()
    assert sync(tmp_path / "outputs") == {"uploaded": 1, "present": 0, "skipped": 1, "failed": 0}
    assert [r.data.tags["run_uid"] for r in all_runs(uri)] == ["t1"]
    assert sync(tmp_path / "outputs", uri=uri) == {"uploaded": 1, "present": 1, "skipped": 0,
                                                   "failed": 0}
    assert sorted(r.data.tags["run_uid"] for r in all_runs(uri)) == ["t1", "u1"]


class Recorder(http.server.BaseHTTPRequestHandler):
    """A tracking server's stand-in that notes every request (path, Authorization header)."""

    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        Recorder.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.end_headers()

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def recording_server():
    Recorder.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_store_named_in_a_run_folder_is_never_followed(tmp_path, monkeypatch, capsys,
                                                          recording_server):
    """Copied run folders whose mlflow.json / results.json name another host (with or without
    a password) or a sqlite path: without --uri nothing is sent there (the user's
    MLFLOW_TRACKING_* credentials least of all) and no database is made; each store is named
    once, with the --uri that uploads its runs. With --uri, the runs go where the user said."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-s3cret")
    evil_db = tmp_path / "elsewhere" / "evil.db"
    host_pw = recording_server.replace("://", "://bob:pw-in-file@")
    cases = {"host": recording_server, "host_pw": host_pw, "db": f"sqlite:///{evil_db}",
             "file": f"file://{tmp_path / 'elsewhere' / 'mlruns'}"}
    out = tmp_path / "copied"
    for name, uri in cases.items():
        rec = write_run(out / name, f"uid-{name}", uri=uri)
        (rec.dir / MARKER_FILE).write_text(json.dumps(
            {"synced": False, "tracking_uri": uri, "experiment": "gpubench"}))
    write_run(out / "config_only", "uid-config", uri=recording_server)  # results.json alone

    counts = sync(out)
    text = capsys.readouterr().out
    assert Recorder.seen == [] and not (tmp_path / "elsewhere").exists()
    assert not (tmp_path / "outputs").exists()  # nor anything made in the default store
    assert counts == {"uploaded": 0, "present": 0, "skipped": 5, "failed": 0}
    assert f"skip 3 runs recorded for {recording_server}:" in text  # one line per store
    assert f"--uri '{recording_server}' uploads them there" in text
    assert f"--uri 'sqlite:///{evil_db}'" in text and "pw-in-file" not in text
    # a store no --uri takes (MLflow 3 refuses file stores) is not offered as the way out
    assert "(MLflow 3 refuses file stores" in text and "--uri 'file:" not in text

    mine = sqlite_store(tmp_path / "mine.db")
    assert sync(out, uri=mine)["uploaded"] == 5
    assert Recorder.seen == [] and not (tmp_path / "elsewhere").exists()
    assert len(all_runs(mine)) == 5


def test_sync_against_a_server_that_never_answers_is_bounded(tmp_path, capsys):
    """A server that accepts and never answers (a listening socket nobody reads) and a port
    that refuses: one warning line each, the password masked, within the timeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshakes; no reply ever comes
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()
    write_run(tmp_path / "out" / "r", "never1")
    try:
        for port, why in ((silent.getsockname()[1], "timed out"), (refused_port, "refused")):
            counts = sync(tmp_path / "out", uri=f"http://bob:pw-9f3@127.0.0.1:{port}",
                          timeout_s=0.5)
            err = capsys.readouterr().err
            assert counts["failed"] == 1 and why in err, err
            assert len(err.strip().splitlines()) == 1 and "pw-9f3" not in err
    finally:
        silent.close()


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


@pytest.mark.slow
def test_resumed_sweep_parent_ends_finished_with_every_job(tmp_path):
    """The callback's sequence: the first attempt is killed (no end), `sync` closes it KILLED;
    the resume into the same dir reopens the same parent, adds its jobs, ends FINISHED."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {overrides: {task: ['loader.batch_size=2,4']}}")
    sweeps.mark_ended(sweep, False)
    with open_store(uri, "gpubench") as store:
        parent = sweeps.open_sweep(store, sweep, {"overrides": {"task": ["loader.batch_size=2,4"]}})
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
        hydra = {"overrides": {"task": ["loader.batch_size=2,4"]}}
        assert sweeps.open_sweep(store, sweep, hydra) == parent
        for i, uid in ((2, "job2"), (3, "job3")):
            rec = write_run(sweep / str(i), uid, images_per_sec=100.0 + i)
            upload(store, rec, rec.dir, parent)
        sweeps.mark_ended(sweep, True)
        sweeps.close_sweep(store, sweep, parent)  # ended, by mark_ended: FINISHED
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
                   module="gpubench.tracking", cwd=tmp_path)
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
    # a later sync to the server named without its password: the marker's masked URI is the
    # same store, so the run is found there (the marker alone is never followed)
    assert sync(tmp_path / "out", uri=mlflow_server.url)["present"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["sync", "/no/such/dir"], "not a folder"),
    (["sync", ".", "--timeout", "0"], "--timeout"),
    (["sync", ".", "--uri", "htp:/bad::uri"], "not a tracking URI"),
    (["sync", ".", "--uri", "http://bob:pw@host:port"], "--uri 'http://bob:***@host:port'"),
    (["sync", ".", "--uri", "file:///tmp/mlruns"], "MLflow 3 refuses file stores"),
    (["sync", ".", "--uri", "./mlruns"], "use sqlite:///path/mlflow.db"),
    (["sync", ".", "--bogus"], "unrecognized arguments: --bogus"),
    (["push"], "invalid choice: 'push'"),
])
def test_cli_bad_input_is_one_line(args, needle, tmp_path):
    proc = run_cli(*args, module="gpubench.tracking", cwd=tmp_path)
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
    proc = start_process(*args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "mlruns", "./mlruns", "/abs/mlruns",
                                 "file:", "databricks-uc", "uc:http://host:8080"])
def test_a_store_mlflow_refuses_is_refused_before_measuring(compose_cfg, monkeypatch, uri):
    """MLflow 3.17 refuses its file store (unless MLFLOW_ALLOW_FILE_STORE is true) and Unity
    Catalog as a tracking URI: both were accepted, measured, then exit 3. Refused when the
    settings resolve (before any work), one line saying what to use; with MLflow's own opt-in
    set, a file store is taken as MLflow takes it."""
    from gpubench.config.settings import resolve
    from gpubench.tracking.store import uri_problem

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError) as err:
        resolve(compose_cfg("tracking=mlflow", f"tracking.uri='{uri}'"))
    msg = str(err.value)
    assert err.value.key == "tracking.uri" and "\n" not in msg
    assert uri_problem(uri)  # `sync --uri` and `report --tracking-uri` by the same rule
    file_store = not uri.startswith(("databricks", "uc"))
    assert ("sqlite:///path/mlflow.db" in msg) == file_store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert (uri_problem(uri) is None) == (file_store and uri != "file:")
