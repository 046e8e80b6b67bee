"""Bad input and faults through the real command line: one line, a non-zero exit, nothing
measured lost. docs/reliability.md lists the same cases with what a user sees."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, compose_config, run_cli, run_process, sqlite_store, start_process

from gpubench.run.runner import measure_run

TINY_NO_TRACKING = [a for a in TINY if not a.startswith("tracking=")]


def _fsize_limit(nbytes: int):
    """A file size limit for the child only: writes past it fail with EFBIG (Python ignores
    SIGXFSZ), the way a nearly full disk makes them fail with ENOSPC."""

    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


def _stderr_lines(proc) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


# ------------------------------------------------------------------ bad input, one line each

SINGLE = [
    ("sweep=fastest", "sweep='fastest'", "throughput"),
    ("experiment=cpu_smok", "experiment='cpu_smok'", "cpu_smoke"),
    ("tracking=mlflow tracking.uri=htp:/bad::uri", "tracking.uri", "http"),
    ("loader.num_workers=1000", "loader.num_workers=1000", "on this machine"),
    ("bench.monitor_interval_s=0", "bench.monitor_interval_s", "[0.05, 60]"),
    ("model.num_classes=5", "model.num_classes=5", "10 classes"),
    ("--bogus", "unrecognized arguments: --bogus", "--help"),
    ("compile=fast", "compile=fast", "max_autotune"),
    # issue 20: Hydra's lexer error, a key added with +, a name MLflow refuses after measuring
    ("model.name=résnet50", "model.name='résnet50'", "quote anything else: key='value'); "
     "model.name takes one of resnet50"),
    ("+loader.nosuch=1", "loader.nosuch=1", "loader.num_workers"),
    ("tracking.experiment=''", "tracking.experiment=''", "not blank"),
]
SWEEP = "-m hydra/sweeper=gpubench hydra.sweeper.storage=null"
MULTI = [
    (f"{SWEEP} hydra.sweeper.n_trials=0 loader.batch_size=choice(2,4)", "n_trials", ">= 1"),
    (f"{SWEEP} hydra.sweeper.sampler=cmaes loader.batch_size=choice(2,4)", "cmaes", "tpe"),
    ("-m hydra/sweeper=gpubench hydra.sweeper.storage=notaurl loader.batch_size=choice(2,4)",
     "hydra.sweeper.storage='notaurl'", "sqlite"),
    (f"{SWEEP} loader.batch_size=range(8,4)", "range(8,4", "empty"),
    (f"{SWEEP}", "nothing to search", "choice"),
    # issue 20: before, every trial failed and the sweep exited 0
    (f"{SWEEP} loader.batch_size=interval(2,8)", "'interval(2,8)'", "range(2,9)"),
    (f"{SWEEP} loader.batch_size=choice(2,4) hydra.sweeper.screen.overrides=[garbage]",
     "hydra.sweeper.screen.overrides[0]='garbage'", "key=value"),
]


@pytest.mark.slow
@pytest.mark.parametrize("args,names,allowed", SINGLE + MULTI, ids=[c[0] for c in SINGLE + MULTI])
def test_bad_input_is_one_line(tmp_path, args, names, allowed):
    argv = args.split()
    flags = [a for a in argv if a.startswith("-")]
    proc = run_cli(*flags, *TINY_NO_TRACKING,
                   *(["tracking=none"] if "tracking=" not in args else []),
                   *[a for a in argv if not a.startswith("-")], cwd=tmp_path)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: "), proc.stderr
    assert names in lines[0] and allowed in lines[0], lines[0]
    assert not list(tmp_path.glob("outputs/**/results.json"))  # failed before any work
    assert not list(tmp_path.glob("outputs/*.db"))  # no study, no MLflow store created


@pytest.mark.slow
def test_run_dir_that_cannot_be_created_names_the_path(tmp_path):
    (tmp_path / "afile").write_text("")
    target = tmp_path / "afile" / "run"
    proc = run_cli(*TINY, f"hydra.run.dir={target}", cwd=tmp_path)
    lines = _stderr_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert str(target) in lines[0] and "Not a directory" in lines[0]


# ------------------------------------------------------------------ a nearly full disk

@pytest.mark.slow
def test_write_json_failure_leaves_old_file_and_no_tmp(tmp_path):
    target = tmp_path / "results.json"
    target.write_text('{"status": "running"}')
    code = (
        "import sys; from gpubench.core.files import write_json\n"
        "try:\n    write_json(sys.argv[1], {'x': 'y' * 100000})\n"
        "except OSError as e:\n    print(e); sys.exit(1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                          text=True, preexec_fn=_fsize_limit(4096), env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith(f"cannot write {target}: File too large") and "MiB free" in out, out
    assert json.loads(target.read_text()) == {"status": "running"}  # the previous complete file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no .tmp left


@pytest.mark.slow
def test_cli_on_a_full_disk_is_one_line_and_leaves_no_garbage(tmp_path):
    proc = run_process(*TINY, cwd=tmp_path, fsize=6000)  # every file capped at 6000 bytes
    lines = _stderr_lines(proc)
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("gpubench: error: cannot write ") and "results.json" in lines[0]
    assert "free on its filesystem" in lines[0]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    for f in tmp_path.glob("outputs/runs/*/*/results.json"):  # what reached disk is whole
        assert json.loads(f.read_text())["status"] == "running"


# ------------------------------------------------------------------ SIGTERM and Ctrl-C

def _start_and_wait_for_loader(tmp_path: Path, *extra: str):
    proc = start_process(
        *TINY_NO_TRACKING, "bench.steps=1000000", "bench.max_seconds=1.5", *extra,
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as under `timeout` or a scheduler
    )
    deadline = time.time() + 120
    while time.time() < deadline:  # until the loader phase has landed on disk
        for f in tmp_path.glob("outputs/runs/*/*/results.json"):
            try:
                if "loader" in json.loads(f.read_text())["phases"]:
                    return proc, f
            except ValueError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the run never wrote its first phase: {proc.communicate()}")


@pytest.mark.slow
def test_sigterm_is_like_ctrl_c_and_reaches_mlflow(tmp_path):
    sqlite_store(tmp_path / "outputs" / "mlflow.db")  # the default store, already migrated
    proc, results = _start_and_wait_for_loader(tmp_path, "tracking=mlflow")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    ours = [ln for ln in err.splitlines() if ln.startswith("gpubench:")]
    assert len(ours) == 1 and ours[0].startswith("gpubench: interrupted by SIGTERM"), err
    assert "status killed" in ours[0] and str(results) in ours[0], ours[0]
    data = json.loads(results.read_text())
    assert data["status"] == "killed"
    assert data["phases"]["loader"]["images_per_sec"] > 0  # measured phases kept

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("gpubench")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]


@pytest.mark.slow
def test_ctrl_c_is_one_line_exit_130(tmp_path):
    proc, results = _start_and_wait_for_loader(tmp_path, "tracking=none")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err
    ours = [ln for ln in err.splitlines() if ln.strip()]
    assert ours == [ln for ln in ours if ln.startswith("gpubench: interrupted by Ctrl-C")], err
    assert json.loads(results.read_text())["status"] == "killed"


@pytest.mark.slow
def test_sigterm_to_the_process_group_with_loader_workers(tmp_path):
    """`timeout`, Slurm and a terminal signal the whole group: the DataLoader worker dies of the
    same SIGTERM, and the run must still end killed with one line, not with torch's "DataLoader
    worker ... killed by signal" error."""
    proc, results = _start_and_wait_for_loader(tmp_path, "tracking=none", "loader.num_workers=1",
                                               "loader.persistent_workers=true")
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "killed by signal" not in err, err
    assert [ln for ln in err.splitlines() if ln.strip()][-1].startswith("gpubench: interrupted by SIGTERM")
    data = json.loads(results.read_text())
    assert data["status"] == "killed" and data["phases"]["loader"]["images_per_sec"] > 0


@pytest.mark.slow
def test_sigterm_during_a_sweep_ends_its_mlflow_parent_killed(tmp_path):
    """Hydra calls the end-of-sweep callback only when the sweep returns: the parent run of a
    sweep stopped by SIGTERM must still end (KILLED, with the jobs measured so far), not stay
    RUNNING until someone runs `sync`."""
    from conftest import start_two_job_sweep

    sqlite_store(tmp_path / "outputs" / "mlflow.db")  # the default store, already migrated
    proc, _ = start_two_job_sweep(tmp_path, "tracking=mlflow")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("gpubench")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in runs if "mlflow.parentRunId" in r.data.tags),
                      key=lambda r: r.info.start_time)
    assert [r.info.status for r in parents] == ["KILLED"], [r.info.status for r in runs]
    assert [r.info.status for r in children] == ["FINISHED", "KILLED"]
    assert parents[0].data.metrics.get("jobs") == 2.0  # the jobs measured so far


@pytest.mark.slow
def test_names_from_a_team_config_dir_count(tmp_path):
    team = tmp_path / "team_conf" / "experiment"
    team.mkdir(parents=True)
    (team / "ours.yaml").write_text("# @package _global_\nbench:\n  steps: 3\n")
    ok = run_cli("-cd", str(team.parent), *TINY, "experiment=ours", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("-cd", str(team.parent), *TINY, "experiment=ourz", cwd=tmp_path)
    lines = _stderr_lines(bad)
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert "experiment='ourz'" in lines[0] and "ours" in lines[0] and "cpu_smoke" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("swept,key,allowed", [
    (["hydra/sweeper=gpubench", "loader.batch_sise=choice(8,16)"], "loader.batch_sise",
     "close: loader.batch_size"),
    (["hydra/sweeper=gpubench", "loader.batch_size=choice(8,-16)"], "loader.batch_size=-16",
     "an integer in [1, 65536]"),
    (["loader.num_workers=0,-1"], "loader.num_workers=-1", "an integer in [0, 1024]"),
    (["hydra/sweeper=gpubench", "memory.ceiling=interval(0.5,1.5)"], "memory.ceiling=1.5",
     "a number in [1e-06, 1]"),
    (["precision=fp32,fp8"], "precision='fp8'", "one of amp_bf16"),
])
def test_a_bad_swept_key_or_value_stops_the_sweep_before_any_trial(tmp_path, swept, key, allowed):
    """A misspelled swept key, or a value outside its key's range, would fail every trial one
    by one (and the gpubench sweeper then abort with a traceback): one line, exit 2, and no
    sweep folder, study or trial behind."""
    p = run_cli("-m", *TINY_NO_TRACKING, "tracking=none", *swept,
                f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"gpubench: error: {key}"), p.stderr
    assert allowed in lines[0]
    assert not (tmp_path / "sweep").exists()


# ------------------------------------------------------------------ a diverging model


class DivergesAt(torch.nn.Module):
    """Logits turn NaN from the `at`-th training forward on (counted with gradients on: the
    output check before the phases runs without), the way a too-high learning rate ends."""

    def __init__(self, num_classes: int = 10, at: int = 3):
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)
        self.at, self.calls = at, 0

    def forward(self, x):
        out = self.fc(x.float().mean((2, 3)))
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls >= self.at:
                out = out * float("nan")
        return out


@pytest.mark.parametrize("at, where", [
    (3, "at micro-batch 3 (e2e phase, window 1, warm-up)"),  # read after each warm-up sync
    (4, "at micro-batch 4 (e2e phase, window 1)"),  # read at the window's closing sync
])
def test_a_loss_that_turns_nan_fails_the_run_naming_the_step(tmp_path, at, where):
    """Before: NaN steps were measured and the run ended `ok`. The loss is read only where the
    device was synchronized anyway (no sync per measured step): failed, naming the micro-batch
    and the phase, with the phases measured before it kept."""
    cfg = compose_config("model=custom", "model._target_=test_reliability.DivergesAt",
                         f"+model.kwargs.at={at}", "bench.flops=false",
                         "bench.phases=[loader,compute,e2e]")
    rec = measure_run(cfg, tmp_path).record
    # compute: warm-up 1 + 1 step (forwards 1, 2); e2e: warm-up (3), its first window step (4)
    assert rec.status.value == "failed"
    assert rec.error == (f"NonFiniteLoss: the loss became nan {where}: the model diverges (a "
                         "lower bench.lr, or check the model)")
    assert set(rec.phases) == {"loader", "compute"}  # measured before it: kept
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["status"] == "failed" and f"micro-batch {at}" in saved["error"]


# ------------------------------------------------------------------ issue 29: blamed on the right key


class NoParameters(torch.nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x):
        return x.flatten(1)[:, :self.num_classes] * 1.0


class NaNImages(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((3, 16, 16), float("nan")), i % 10


class Endless(NaNImages):
    def __len__(self):
        return 10**30


@pytest.mark.parametrize("overrides, line", [
    # was: bench.optimizer_impl='auto' is not allowed ... (optimizer got an empty parameter list)
    (("model=custom", "model._target_=test_reliability.NoParameters"),
     "model._target_='test_reliability.NoParameters' is not allowed: it must be a model with parameters to "
     "train (it has none)"),
    # was: the loader measured, then NonFiniteLoss "the model diverges"
    (("dataset=custom", "dataset._target_=test_reliability.NaNImages"),
     "dataset._target_='test_reliability.NaNImages' is not allowed: it must be a dataset whose images are "
     "finite numbers (the first batch holds NaN or infinity)"),
    # was: OverflowError: cannot fit 'int' into an index-sized integer
    (("dataset=custom", "dataset._target_=test_reliability.Endless"),
     "dataset._target_='test_reliability.Endless' is not allowed: it must be a Dataset whose __len__ is its "
     "number of samples (cannot fit 'int' into an index-sized integer)"),
])
def test_a_team_class_is_blamed_on_its_own_key_before_any_phase(tmp_path, overrides, line):
    from gpubench.config.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        measure_run(compose_config(*overrides, "bench.flops=false"), tmp_path)
    assert str(err.value) == line
    assert not (tmp_path / "results.json").exists() or json.loads(
        (tmp_path / "results.json").read_text())["phases"] == {}


def test_an_optimizer_that_torch_refuses_is_blamed_on_optimizer_impl_only_when_set():
    from gpubench.config.errors import ConfigError
    from gpubench.parts.step import make_optimizer

    with pytest.raises(ValueError, match="empty parameter list") as err:
        make_optimizer(NoParameters(), "sgd", 0.1, "auto")
    assert not isinstance(err.value, ConfigError)


def test_a_loss_that_is_nan_before_any_update_blames_the_batches_or_the_forward(tmp_path):
    """The first micro-batch's loss ran on the initial weights: NaN there is no divergence, and
    bench.lr no remedy (was: "the model diverges (a lower bench.lr, or check the model)")."""
    cfg = compose_config("model=custom", "model._target_=test_reliability.DivergesAt",
                         "+model.kwargs.at=1", "bench.flops=false", "bench.phases=[compute]")
    rec = measure_run(cfg, tmp_path).record
    assert rec.status.value == "failed"
    assert rec.error == ("NonFiniteLoss: the loss was nan at micro-batch 1 (compute phase, "
                         "window 1, warm-up), before any weight update: the batches (check the "
                         "dataset's images and labels) or the model's forward give non-finite "
                         "values")


@pytest.mark.slow
def test_sighup_leaves_the_run_killed_with_one_line(tmp_path):
    proc, results = _start_and_wait_for_loader(tmp_path, "tracking=none")
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 128 + signal.SIGHUP and len(lines) == 1, err
    assert lines[0].startswith("gpubench: interrupted by SIGHUP; status killed"), lines
    data = json.loads(results.read_text())
    assert data["status"] == "killed" and data["error"] == "interrupted by SIGHUP"


@pytest.mark.slow
def test_ctrl_c_twice_keeps_the_record_the_picture_and_says_how_to_upload(tmp_path):
    """The second Ctrl-C comes while the run is ending (its picture, its upload to a server
    that never answers): the record is final, run.png drawn, the upload skipped, one line."""
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc, results = _start_and_wait_for_loader(
            tmp_path, "tracking=mlflow", f"tracking.uri={uri}", "tracking.timeout_s=120")
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 120
        while not (results.parent / "run.png").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert time.monotonic() - started < 60  # not the upload's 120 s
    lines = [ln for ln in err.splitlines() if ln.startswith("gpubench")]
    assert proc.returncode == 128 + signal.SIGINT and len(lines) == 1, err
    assert lines[0] == (f"gpubench: interrupted by Ctrl-C; status killed, 1 measured phase "
                        f"kept in {results} and run.png; not in MLflow: python -m "
                        f"gpubench.tracking sync {results.parent} --uri {uri}"), lines
    assert json.loads(results.read_text())["status"] == "killed"
