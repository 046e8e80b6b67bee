"""The real command line: `python -m gpubench` in a subprocess, from a fresh directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TINY, run_cli, start_cli


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


# ------------------------------------------------------------------ exit codes a script can trust


def test_mistyped_key_names_the_close_key(compose_cfg):
    from gpubench.cli.messages import describe

    for override, line in (
            ("loader.batchsize=32", "loader.batchsize=32 is not allowed: a key of the config "
             "(close: loader.batch_size); +loader.batchsize=... adds a new one"),
            # the first part mistyped: Hydra's error names `lodaer` only
            ("lodaer.batch_size=3", "lodaer.batch_size=3 is not allowed: a key of the config "
             "(close: loader.batch_size); +lodaer.batch_size=... adds a new one"),
            ("chanels_last=true", "chanels_last=true is not allowed: a key of the config "
             "(close: channels_last); +chanels_last=... adds a new one")):
        with pytest.raises(Exception) as err:
            compose_cfg(override)
        assert describe(err.value) == (line, 2)


@pytest.mark.slow
def test_cli_mistyped_key_in_a_single_run_suggests_the_close_key(tmp_path):
    proc = run_cli(*TINY, "loader.batchsize=32", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpubench: error: loader.batchsize=32 is not allowed: a key of the config (close: "
        "loader.batch_size); +loader.batchsize=... adds a new one"]


@pytest.mark.slow
def test_cli_over_ceiling_exits_5_with_advice_and_a_sweep_goes_on(tmp_path):
    from gpubench.core.exits import ExitCode

    proc = run_cli(*TINY, "memory.ceiling=0.0001", cwd=tmp_path)
    assert proc.returncode == ExitCode.OVER_CEILING == 5, proc.stderr[-2000:]
    out = proc.stdout
    assert "status: over_ceiling" in out and "to fit under memory.ceiling:" in out
    assert "loader.batch_size=2: a smaller batch" in out  # TINY's batch is 4
    assert "model.checkpointing=true" in out and "precision=amp_bf16" in out
    # in a multirun the job is a finished trial: the sweep goes on, the command ends 0
    proc = run_cli("-m", *TINY, "memory.ceiling=0.0001", "loader.batch_size=2,4",
                   "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    statuses = [json.loads(p.read_text())["status"]
                for p in sorted((tmp_path / "sweep").glob("*/results.json"))]
    assert statuses == ["over_ceiling", "over_ceiling"]


def _into_closed_pipe(module: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS | head` where head has already gone: every write to stdout
    fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = start_cli(*args, module=module, cwd=cwd, stdout=write, stderr=subprocess.PIPE,
                         text=True)
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    from gpubench.core.exits import ExitCode

    proc = _into_closed_pipe("gpubench", "--help", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (ExitCode.BROKEN_PIPE, "")
    assert ExitCode.BROKEN_PIPE == 141  # as a shell reports a writer that SIGPIPE ended
    shutil.copytree(Path(__file__).parent / "golden" / "fixtures" / "sweep", tmp_path / "sweep")
    proc = _into_closed_pipe("gpubench.report", "sweep", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (ExitCode.BROKEN_PIPE, "")
