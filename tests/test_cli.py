"""The real command line: `python -m gpubench` in a subprocess, from a fresh directory."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, run_cli


@pytest.mark.slow
def test_cli_run_prints_verdict_and_writes_results(tmp_path):
    proc = run_cli(*TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "narrowest pipe:" in proc.stdout
    assert "loader" in proc.stdout and "compute" in proc.stdout and "e2e" in proc.stdout
    results = list((tmp_path / "outputs" / "runs").glob("*/*/results.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert data["status"] == "ok" and data["images_per_sec"] > 0
    # Hydra's own record of the run sits beside it
    assert (results[0].parent / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,key",
    [
        ("model.name=resnet51", "model.name"),
        ("loader.batch_size=0", "loader.batch_size"),
        ("loader.num_workers=-2", "loader.num_workers"),
        ("precision=fp64", "precision"),
        ("dataset=imagefolder", "dataset.root"),
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(tmp_path, override, key):
    proc = run_cli(*TINY, override, cwd=tmp_path)
    assert proc.returncode == 2
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("gpubench: error: ") and key in err[0]
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("outputs/runs/*/*/results.json"))  # failed before any work


@pytest.mark.slow
def test_cli_full_error_shows_traceback(tmp_path):
    proc = run_cli(*TINY, "loader.batch_size=0", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.slow
def test_cli_oom_single_run_exits_nonzero_and_keeps_results(tmp_path):
    proc = run_cli(*TINY, "fault.oom_above_batch=1", cwd=tmp_path)
    assert proc.returncode == 1
    assert "status: oom" in proc.stdout
    data = json.loads(next(tmp_path.glob("outputs/runs/*/*/results.json")).read_text())
    assert data["status"] == "oom" and "loader" in data["phases"]


# Ctrl-C and SIGTERM: tests/test_reliability.py
