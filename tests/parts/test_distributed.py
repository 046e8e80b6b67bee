"""Under torchrun: 2 processes (gloo on CPU), DistributedDataParallel, a sharded loader; one
results.json from rank 0 with the run's throughput summed over ranks."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, torchrun

pytestmark = pytest.mark.slow


def test_torchrun_two_ranks(tmp_path):
    proc = torchrun(*TINY, "bench.steps=4", "hydra.run.dir=outputs/ddp", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("narrowest pipe:") == 1  # only rank 0 reports
    data = json.loads((tmp_path / "outputs" / "ddp" / "results.json").read_text())
    assert data["status"] == "ok" and data["world_size"] == 2
    for name in ("loader", "compute", "e2e"):
        ph = data["phases"][name]
        assert len(ph["ranks_images_per_sec"]) == 2 and ph["images"] == 2 * 4 * 4
        for w in ph["windows"]:
            ranks = w["ranks_images_per_sec"]
            assert len(ranks) == 2 and all(r > 0 for r in ranks)
            # all images over the slowest rank's window: at most the sum of the ranks' rates
            assert 0 < w["images_per_sec"] <= sum(ranks) * 1.0001
            assert w["images_per_sec"] >= 2 * min(ranks) * 0.9999


@pytest.mark.parametrize("fault,status,text", [
    # rank 1 fails before its first window, rank 0 waits at the window's barrier
    ("fault.fail_message=injected on one rank", "failed", "injected on one rank"),
    # rank 1 runs out of memory in its first step, rank 0 waits inside DDP's all-reduce
    ("fault.oom_above_batch=1", "oom", "OutOfMemoryError"),
])
def test_fault_on_one_rank_ends_both_promptly(tmp_path, fault, status, text):
    """fault.rank=1: rank 0 must learn of rank 1's failure within seconds (not the process
    group's timeout), record it in results.json and exit; rank 1 exits too."""
    import time

    t0 = time.monotonic()
    proc = torchrun(*TINY, "bench.steps=4", "hydra.run.dir=outputs/ddp", fault, "fault.rank=1",
                    cwd=tmp_path, timeout=170)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    data = json.loads((tmp_path / "outputs" / "ddp" / "results.json").read_text())
    assert data["status"] == status, data["error"]
    assert "rank 1" in data["error"] and text in data["error"]
    # well under the process group's 180 s timeout: two ranks' start-up plus seconds
    assert took < 90, took


def test_agree_and_fault_rank_logic():
    from gpubench.parts.distributed import Dist, fault_hits

    assert fault_hits(None, 0) and fault_hits(None, 3)
    assert fault_hits(1, 1) and not fault_hits(1, 0)
    single = Dist()  # without torchrun: no collective, the rank's own answer
    assert single.agree(None) is None and single.agree("boom") == "boom"


def _agree_worker(rank: int, world: int, port: int, errors: list, out) -> None:
    import torch.distributed as tdist

    from gpubench.parts.distributed import Dist

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                             world_size=world)
    d = Dist(rank, world, rank, True, "cpu")
    out.put((rank, d.agree(None), d.agree(errors[rank])))
    d.close()


def _two_gloo_ranks(worker, *args) -> tuple[list, list]:
    """(what each rank of `worker(rank, 2, port, *args, queue)` put, sorted; the processes),
    both spawned and joined (bounded: no hang)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, *args, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        return sorted(q.get(timeout=120) for _ in procs), procs
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def test_agree_across_two_gloo_processes():
    got, _ = _two_gloo_ranks(_agree_worker, [None, "OutOfMemoryError: injected"])
    assert got == [(0, None, "rank 1: OutOfMemoryError: injected"),
                   (1, None, "rank 1: OutOfMemoryError: injected")]


def _warmup_worker(rank: int, world: int, port: int, out) -> None:
    """One rank of a window under torchrun, on a clock of its own: rank 0's steps are steady a
    step before rank 1's, and rank 1's are twice as fast (its window needs more steps to last
    bench.min_window_s). Each step all-reduces like DDP's backward, and the window opens with
    the runner's barrier: ranks one step apart would mismatch the two and fail or hang."""
    from datetime import timedelta

    import torch
    import torch.distributed as tdist

    from gpubench.parts.distributed import Dist
    from gpubench.parts.measure import run_window

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                             world_size=world, timeout=timedelta(seconds=30))
    d = Dist(rank, world, rank, True, "cpu")
    t = [1000.0]
    times = iter([1.0] + [0.5] * rank + [1 / (64 * (rank + 1))] * 1000)

    def work(_):
        grads = torch.ones(4)
        tdist.all_reduce(grads)  # what DDP does inside every step
        t[0] += next(times)
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                   warmup_max_s=30, max_s=30, warmup_max_steps=40, clock=lambda: t[0],
                   on_open=d.barrier, min_s=0.5, ranks=d)
    ok = d.agree(None)  # the runner's end-of-window check: every rank got here
    out.put((rank, s.warmup_steps, s.warmup_settled, s.steps, ok))
    d.close()


def test_ranks_end_warmup_and_windows_together_over_gloo():
    """Two gloo processes whose own warm-up judgements differ by a step run the same warm-up
    steps and the same window steps, and the run ends normally (bounded: no hang)."""
    got, procs = _two_gloo_ranks(_warmup_worker)
    assert [p.exitcode for p in procs] == [0, 0]
    # alone, rank 0 would stop warm-up at step 9 and rank 1 at 10 (tests/test_measure.py);
    # rank 1's steps of 1/128 s need 64 to last 0.5 s, rank 0's 32: both run 64
    assert got == [(0, 10, True, 64, None), (1, 10, True, 64, None)]


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan", "inf"])
def test_a_bad_process_group_timeout_is_one_line_naming_it(monkeypatch, raw):
    """GPUBENCH_DIST_TIMEOUT_S is checked as a config key is: a raw float() ValueError named
    neither the variable nor what it takes."""
    from gpubench.config.errors import ConfigError
    from gpubench.parts.distributed import PROCESS_GROUP_TIMEOUT_S, TIMEOUT_ENV, timeout_s

    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert timeout_s() == PROCESS_GROUP_TIMEOUT_S
    monkeypatch.setenv(TIMEOUT_ENV, "600")
    assert timeout_s() == 600.0
    monkeypatch.setenv(TIMEOUT_ENV, raw)
    with pytest.raises(ConfigError) as e:
        timeout_s()
    assert str(e.value) == (f"GPUBENCH_DIST_TIMEOUT_S='{raw}' is not allowed: it must be a number "
                            "of seconds > 0")
