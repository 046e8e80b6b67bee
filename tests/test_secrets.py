"""No password on disk: a real sweep tracked at a URI with a password leaves it in no file of its
sweep folder (sweep.json's best overrides, job records, Hydra's copies, the report)."""

from __future__ import annotations

import pytest
from conftest import TINY, run_cli

PASSWORD = "pw-4a7c1e"  # noqa: S105 - a marker to search for, not a credential


@pytest.mark.slow
def test_a_sweep_writes_no_password_anywhere(tmp_path):
    sweep = tmp_path / "sweep"
    # port 9 (discard) on loopback refuses at once: tracking warns and the runs go on, while
    # the URI rides along in every job's overrides, the best trial's among them
    p = run_cli("-m", "hydra/sweeper=gpubench", *[o for o in TINY if not o.startswith("tracking=")],
                "tracking=mlflow", f"tracking.uri=http://bob:{PASSWORD}@127.0.0.1:9",
                "tracking.timeout_s=1", "loader.batch_size=choice(2,4)",
                "hydra.sweeper.n_trials=2", "hydra.sweeper.seed=0", "hydra.sweeper.confirm.top=0",
                f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}",
                f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (sweep / "sweep.json").is_file() and (sweep / "report" / "summary.json").is_file()
    assert "bob:***@" in (sweep / "sweep.json").read_text()  # the URI is there, masked
    leaks = [str(f.relative_to(sweep)) for f in sorted(sweep.rglob("*"))
             if f.is_file() and PASSWORD.encode() in f.read_bytes()]
    assert not leaks, leaks
    assert PASSWORD not in p.stdout + p.stderr
