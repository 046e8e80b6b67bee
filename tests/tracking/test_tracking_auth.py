"""A tracking server that requires a password (MLflow's basic-auth app, a real server): a
`user:pw@` tracking URI connects, a wrong password is one warning line, and the password is
written nowhere (marker, params, tags, uploaded artifacts, output)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import ROOT, MlflowServer

from gpubench.tracking import MARKER_FILE
from gpubench.tracking.sync import sync

PASSWORD = "s3cret-Pw_123"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("flask_wtf") is None,
                       reason="MLflow's basic-auth app needs Flask-WTF (pip install -e '.[dev]')"),
]


@pytest.fixture(scope="session")
def auth_server():
    """One password-protected server for the test run, whichever worker asks first."""
    from conftest import shared

    def start(root: Path) -> dict:
        root.mkdir()
        (root / "auth.ini").write_text(
            "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
            f"database_uri = sqlite:///{root / 'auth.db'}\nadmin_username = admin\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        srv = MlflowServer(root, ("--app-name", "basic-auth"), {
            "MLFLOW_AUTH_CONFIG_PATH": str(root / "auth.ini"),
            "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": "gpubench-test"})
        return {"root": str(root), "port": srv.port, "pid": srv.pid}

    info = shared("mlflow_auth", start)
    return MlflowServer(Path(info["root"]), attach=info)


def tiny_run(run_dir, uri):
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({
        "run_uid": "auth1", "status": "ok", "images_per_sec": 10.0,
        "config": {"tracking": {"uri": uri, "experiment": "auth"}}}))


def test_password_uri_connects_and_is_never_written(auth_server, tmp_path, monkeypatch):
    host = auth_server.url.removeprefix("http://")
    good, bad = f"http://admin:{PASSWORD}@{host}", f"http://admin:wrong@{host}"
    tiny_run(tmp_path / "out" / "r", good)
    from conftest import run_cli

    def cli(uri: str):
        return run_cli("sync", str(tmp_path / "out"), "--uri", uri, module="gpubench.tracking",
                       cwd=ROOT)

    proc = cli(bad)
    assert proc.returncode == 1 and "401" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli(good)
    assert proc.returncode == 0 and "1 uploaded" in proc.stdout, proc.stderr
    for text in (proc.stdout + proc.stderr, (tmp_path / "out" / "r" / MARKER_FILE).read_text()):
        assert PASSWORD not in text and "wrong" not in text

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    c = MlflowClient(auth_server.url)
    (run,) = c.search_runs([c.get_experiment_by_name("auth").experiment_id])
    assert not any(PASSWORD in v for v in [*run.data.params.values(), *run.data.tags.values()])
    stored = c.download_artifacts(run.info.run_id, "results.json", str(tmp_path))
    assert PASSWORD not in open(stored).read() and "admin:***@" in open(stored).read()
    # later, to the server named without a password (never from the marker's URI alone):
    # the password comes from the environment, and the marker's masked URI is the same store
    (tmp_path / "out" / "r" / MARKER_FILE).write_text(
        json.dumps(json.loads((tmp_path / "out" / "r" / MARKER_FILE).read_text())
                   | {"synced": False}))
    assert sync(tmp_path / "out")["skipped"] == 1  # the marker's store is not followed
    assert sync(tmp_path / "out", uri=auth_server.url)["present"] == 1


def test_tracked_multirun_with_password_uri(auth_server, tmp_path, monkeypatch):
    """The real CLI: a multirun's parent (callback), its jobs (runner) and the sweep's end all
    reach a password-protected server through a `user:pw@` URI."""
    from conftest import TINY, run_cli
    from mlflow.tracking import MlflowClient

    host = auth_server.url.removeprefix("http://")
    proc = run_cli("-m", *TINY, "tracking=mlflow", f"tracking.uri=http://admin:{PASSWORD}@{host}",
                   "tracking.experiment=auth-sweep", "loader.batch_size=2,4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in proc.stderr and PASSWORD not in proc.stdout + proc.stderr
    (sweep,) = tmp_path.glob("outputs/multirun/*/*")
    for name in ("mlflow_parent.json", "*/mlflow.json", "*/resolved_config.yaml", "*/*.log",
                 "multirun.yaml", "*/.hydra/*.yaml"):
        for f in sweep.glob(name):
            assert PASSWORD not in f.read_text(), f

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    c = MlflowClient(auth_server.url)
    runs = c.search_runs([c.get_experiment_by_name("auth-sweep").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED" and len(runs) == 3
    assert {r.data.tags.get("mlflow.parentRunId") for r in runs} == {None, parent.info.run_id}
    assert not any(PASSWORD in v for r in runs for v in [*r.data.params.values(),
                                                         *r.data.tags.values()])
