"""The watchdog (gpubench/run/watchdog.py): a step that never returns ends the run, its record
written failed first, naming the phase, the window, the step and what it was doing. Time comes
from an injected clock; a stall is the `fault.stall_*` stand-in whose sleep moves that clock."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

import pytest
from torch.utils.data import Dataset

from gpubench.core.record import Status
from gpubench.run.watchdog import FETCH, HANG_MIN_S, Watchdog, hang_limit_s


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Ended(BaseException):
    """What the injected exit raises: the process would end here."""


def _exit(code):
    raise Ended(code)


def test_the_hang_limit_is_twice_a_phase_s_budget_and_at_least_a_minute():
    assert hang_limit_s(60, 60) == 240
    assert hang_limit_s(1, 3) == HANG_MIN_S == 60


def test_a_call_that_does_not_return_in_time_is_named_with_its_place():
    clock = Clock()
    dog = Watchdog(100, lambda line: None, clock=clock, poll_s=None)
    clock.t = 1e6
    assert dog.check() is None  # not watching yet
    dog.at("loader phase, window 2")
    clock.t += 100
    assert dog.check() is None  # at the limit: not past it
    clock.t += 1
    assert dog.check().startswith("loader phase, window 2: stuck before its first step for 101 s")
    seen = {}

    def fetch():
        clock.t += 150
        seen["fetch"] = dog.check()
        return "batch"

    def work(batch):
        clock.t += 101
        seen["work"] = dog.check()
        return 4

    dog.at("loader phase, window 2")
    f, w = dog.phase("loader", fetch, work, compiled=True)  # the loader phase has no compile
    assert w(f()) == 4
    assert seen["fetch"] == (f"loader phase, window 2, step 1: stuck {FETCH[0]} for 150 s (the "
                             "hang limit: 100 s, 2 x (bench.warmup_max_seconds + "
                             "bench.max_seconds), at least 60)")
    assert seen["work"].startswith("loader phase, window 2, step 1: stuck moving its batch to "
                                   "the device for 101 s")
    assert dog.check() is None  # each return is a sign of life
    f()
    clock.t += 101  # between steps: after the fetch, before the next call (a sync, the device)
    assert dog.check().startswith("loader phase, window 2, step 2: stuck after fetching its batch")
    dog.at(None)
    assert dog.check() is None


def test_a_compiled_phase_s_train_step_is_not_watched_its_fetch_is():
    clock = Clock()
    dog = Watchdog(100, lambda line: None, clock=clock, poll_s=None)
    seen = []

    def compiles(batch):
        clock.t += 10_000  # a compile takes as long as it takes
        seen.append(dog.check())

    dog.at("e2e phase, window 1")
    f, w = dog.phase("e2e", lambda: clock.__setattr__("t", clock.t + 101) or dog.check(), compiles,
                     compiled=True)
    assert f().startswith("e2e phase, window 1, step 1: stuck fetching its batch")
    w(None)
    assert seen == [None]
    clock.t += 101
    assert "step 1: stuck after its train step for 101 s" in dog.check()
    _, w = dog.phase("compute", f, compiles, compiled=False)
    w(None)
    assert seen[-1].startswith("e2e phase, window 1, step 1: stuck in its train step (the "
                               "model's forward and backward, the optimizer) for 10000 s")


def test_a_hang_writes_first_then_dumps_the_stacks_to_the_log_then_ends_once(tmp_path, capsys):
    clock, done = Clock(), []
    log = logging.FileHandler(tmp_path / "gpubench.log")
    logging.getLogger().addHandler(log)

    def on_hang(line):
        done.append(("record", line))
        return f"{line}; status failed, kept"

    def exit(code):
        done.append(("exit", code))

    try:
        dog = Watchdog(60, on_hang, lambda: done.append(("end", None)), clock=clock, exit=exit,
                       poll_s=None)
        with dog.watching("building", "checking the model"):
            clock.t = 61
            dog.poll()
            dog.poll()  # once
    finally:
        logging.getLogger().removeHandler(log)
        log.close()
    assert [d[0] for d in done] == ["record", "end", "exit"] and done[2][1] == 1
    assert done[0][1].startswith("building: stuck checking the model for 61 s")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpubench: error: hung: {done[0][1]}; status failed, kept; the threads' "
                   f"stacks are in {tmp_path / 'gpubench.log'}"]
    text = (tmp_path / "gpubench.log").read_text()
    assert "hung: building: stuck checking the model" in text
    assert "Current thread" in text and "test_watchdog.py" in text  # faulthandler's dump


def test_a_stalled_step_ends_the_run_failed_with_what_it_measured(compose_cfg, tmp_path):
    from gpubench.run.runner import Benchmark

    # the second compute step stalls for 600 s (fault.stall_*), past the default limit of 240 s
    bench = Benchmark(compose_cfg("fault.stall_every=2", "fault.stall_s=600"), tmp_path / "run")
    clock = Clock()
    dog = bench.watchdog = Watchdog(bench.watchdog.limit_s, bench._hung, bench._end_hung,
                                    clock=clock, exit=_exit, poll_s=None)

    def stall(seconds):  # the watchdog's thread would poll while the step sleeps
        clock.t += seconds
        dog.poll()

    bench.faults.sleep = stall
    with pytest.raises(Ended) as e, bench.hold:
        bench.run()
    assert e.value.args == (1,)
    data = json.loads((tmp_path / "run" / "results.json").read_text())
    assert data["status"] == Status.failed.value, data["error"]
    assert data["error"].startswith("hung: compute phase, window 1, step 2: stuck in its train "
                                    "step (the model's forward and backward, the optimizer) for "
                                    "600 s (the hang limit: 240 s")
    assert data["phases"]["loader"]["images_per_sec"] > 0  # measured before: kept


def _started(pid: int) -> str | None:
    """When process `pid` started (/proc/<pid>/stat's 22nd field, in clock ticks); None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except OSError:
        return None


class Stalls(Dataset):
    """Tiny images; the item after the `after`-th a process reads never returns (the process
    writes its pid first)."""

    def __init__(self, after: int, pid_file: str) -> None:
        self.after, self.pid_file, self.read = after, pid_file, 0

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import torch

        self.read += 1
        if self.read > self.after:  # its pid and start time: a pid is reused once it ends
            Path(self.pid_file).write_text(f"{os.getpid()} {_started(os.getpid())}")
            time.sleep(3600)
        return torch.zeros(3, 16, 16), torch.tensor(i % 10)


# the run in a process of its own, its watchdog's limit 3 s (the rule's own limit is a minute)
_HUNG_RUN = """
import logging, sys
from conftest import compose_config
from gpubench.run.runner import Benchmark
from gpubench.run.watchdog import Watchdog
bench = Benchmark(compose_config(*sys.argv[2:]), sys.argv[1])
logging.getLogger().addHandler(logging.FileHandler(sys.argv[1] + "/gpubench.log"))
bench.watchdog = Watchdog(3.0, bench._hung, bench._end_hung, poll_s=0.2)
with bench.hold:
    bench.run()
"""


@pytest.mark.slow  # the process is the subject: its thread ends it, and its worker with it
def test_a_dataset_that_never_returns_ends_the_process_and_its_worker(tmp_path):
    from conftest import ROOT, run_process

    run, pid_file = tmp_path / "run", tmp_path / "worker.pid"
    run.mkdir()
    p = run_process(str(run), "dataset=custom", "dataset._target_=test_watchdog.Stalls",
                "+dataset.kwargs.after=12", f"+dataset.kwargs.pid_file={pid_file}",
                "bench.phases=[loader]", "loader.num_workers=1", code=_HUNG_RUN, module=None,
                cwd=tmp_path, timeout=120,
                env={"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "run"), str(ROOT / "tests"),
                                                   str(ROOT)])})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1 and re.match(
        rf"gpubench: error: hung: loader phase, window \d+, step \d+: stuck {re.escape(FETCH[0])}",
        lines[-1]), p.stderr[-3000:]
    assert re.search(rf"\b(1 measured phase|\d+ measured phases) kept in "
                     rf"{re.escape(str(run / 'results.json'))}", lines[-1]), lines[-1]
    data = json.loads((run / "results.json").read_text())
    assert data["status"] == "failed" and data["error"].startswith("hung: loader phase, window")
    assert "Thread 0x" in (run / "gpubench.log").read_text()  # every thread's stack
    pid, started = pid_file.read_text().split()
    # ended (a zombie at most); the pid may be another process's by now (the suite's others)
    if _started(int(pid)) == started:
        assert "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
