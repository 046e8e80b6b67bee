"""Measurement arithmetic on constructed timings, and the window loop on a clock the test
advances itself (a step "takes" exactly what it adds), so no figure depends on the machine's
load; one test checks the default clock is the real host clock."""

from __future__ import annotations

import math
import time

import pytest

from gpubench.core.stats import stats_from
from gpubench.parts.measure import run_window


def test_stats_throughput_is_images_over_window_not_mean_of_rates():
    # 4 steps of 8 images; the window also holds 0.2 s of gaps the steps do not show
    s = stats_from("e2e", 8, 32, [0.1, 0.1, 0.1, 0.1], window_s=0.6, wait_s=0.15,
                   warmup_times=[2.0, 0.1], warmup_s=2.1, truncated=False)
    assert s.images_per_sec == pytest.approx(32 / 0.6)
    assert s.data_wait_fraction == pytest.approx(0.25)
    assert s.step_time_p50_s == pytest.approx(0.1) and s.step_time_cv == pytest.approx(0.0)
    assert s.first_step_s == 2.0 and s.warmup_steps == 2
    assert "step_times_s" not in s.summary()


class FakeClock:
    """The host clock of a window under test: `sleep` advances it, nothing else does."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_window_excludes_warmup_and_separates_data_wait():
    clock, calls = FakeClock(), []

    def fetch():
        clock.sleep(0.02)  # the data side: 20 ms per batch
        return len(calls)

    def work(batch):
        calls.append(batch)
        clock.sleep(0.01 if len(calls) > 2 else 0.2)  # two slow warm-up steps
        return 4

    s = run_window("e2e", fetch, work, 4, "cpu", warmup_steps=2, steps=5,
                   warmup_max_s=10, max_s=10, clock=clock)
    assert len(calls) == 7 and s.steps == 5 and s.images == 20
    # a warm-up step is its fetch and its work; none of it is in the window
    assert s.warmup_steps == 2 and s.warmup_step_times_s == pytest.approx([0.22, 0.22])
    assert s.step_times_s == pytest.approx([0.03] * 5)
    assert s.seconds == pytest.approx(0.15)
    assert s.data_wait_fraction == pytest.approx(2 / 3)  # 20 of 30 ms per step wait for data
    assert s.images_per_sec == pytest.approx(20 / 0.15)


def test_time_cap_closes_the_window():
    clock = FakeClock()
    s = run_window("compute", lambda: None, lambda b: (clock.sleep(0.05), 1)[1], 1, "cpu",
                   warmup_steps=0, steps=1000, warmup_max_s=1, max_s=0.22, clock=clock)
    assert s.truncated and s.steps == 5  # the first step that ends past 0.22 s is the last


def test_window_that_ends_within_its_cap_is_not_truncated():
    clock = FakeClock()
    s = run_window("compute", lambda: None, lambda b: (clock.sleep(0.05), 1)[1], 1, "cpu",
                   warmup_steps=0, steps=4, warmup_max_s=1, max_s=0.22, clock=clock)
    assert not s.truncated and s.steps == 4


def test_warmup_runs_until_steps_are_steady_and_says_so():
    clock = FakeClock()
    times = iter([0.3, 0.2, 0.1] + [0.01] * 100)

    def work(_):
        clock.sleep(next(times))
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                   warmup_max_s=30, max_s=30, warmup_max_steps=40, clock=clock)
    assert s.warmup_settled is True
    # the first step aside, 2 slow steps, then two groups of 4 steady ones: settled at 11
    assert s.warmup_steps == 11
    assert s.step_times_s == pytest.approx([0.01] * 3)


def test_warmup_that_never_settles_stops_at_its_bound():
    clock = FakeClock()
    slow = iter([0.005 * (i + 1) for i in range(100)])  # every step slower than the last

    def work(_):
        clock.sleep(next(slow))
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=2, steps=1,
                   warmup_max_s=30, max_s=30, warmup_max_steps=12, clock=clock)
    assert s.warmup_settled is False and s.warmup_steps == 12


def test_warmup_time_cap_ends_an_unsettled_warmup():
    clock = FakeClock()

    def work(_):
        clock.sleep(0.1 * (1 + len(seen)))  # slower and slower: never steady
        seen.append(1)
        return 1

    seen: list = []
    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=1,
                   warmup_max_s=1.05, max_s=30, warmup_max_steps=40, clock=clock)
    # 0.1 + 0.2 + 0.3 + 0.4 = 1.0 s is not past the 1.05 s cap; the 5th step (1.5 s) is
    assert s.warmup_settled is False and s.warmup_steps == 5


def test_compile_sized_first_step_still_gets_steps_after_it():
    # a time cap shorter than the first step (torch.compile) must not end warm-up there
    clock = FakeClock()
    first = [True]

    def work(_):
        clock.sleep(0.3 if first else 0.001)
        first.clear()
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=1,
                   warmup_max_s=0.1, max_s=30, warmup_max_steps=20, clock=clock)
    assert s.warmup_steps == 3  # the first, then MIN_AFTER_FIRST (2) more, then the cap


def test_marks_around_each_step_split_idle_from_work():
    # on CUDA these are events (device idle vs the device time of the work); the arithmetic
    # is the same on the host clock: 5 steps of 20 ms waiting then 10 ms of work
    clock = FakeClock()
    s = run_window("loader", lambda: clock.sleep(0.02), lambda _: (clock.sleep(0.01), 1)[1], 1,
                   "cpu", warmup_steps=0, steps=5, warmup_max_s=1, max_s=30, clock=clock)
    assert s.device_idle_s == pytest.approx(0.1) and s.device_work_s == pytest.approx(0.05)
    assert s.seconds == pytest.approx(0.15)


def test_default_clock_is_the_host_clock():
    # real sleeps, one-sided bounds only: a loaded machine makes steps longer, never shorter
    def work(_):
        time.sleep(0.01)
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                   warmup_max_s=30, max_s=30)
    assert s.steps == 3 and min(s.step_times_s) >= 0.01 and min(s.warmup_step_times_s) >= 0.01
    assert s.seconds >= sum(s.step_times_s) - 1e-9


# ------------------------------------------------------------------ ranks agree (torchrun)


class ThreadRanks:
    """The all-reduce of ranks run as threads of one test (a stand-in for gloo/NCCL): each
    call returns once every rank has made it, with the reduction of all their values."""

    def __init__(self, world: int):
        import threading

        self.values: list = [None] * world
        # a bound on a hang only (a rank that never comes), not on anything measured
        self.barrier = threading.Barrier(world, timeout=60)
        self.calls = [0] * world

    def view(self, rank: int) -> RankView:
        return RankView(self, rank)

    def reduce(self, rank: int, value, how):
        self.calls[rank] += 1
        self.values[rank] = value
        self.barrier.wait()
        out = how(self.values)
        self.barrier.wait()  # nobody writes the next value before all have read this one
        return out


class RankView:
    def __init__(self, shared: ThreadRanks, rank: int):
        self.shared, self.rank = shared, rank

    def all_done(self, done: bool) -> bool:
        return self.shared.reduce(self.rank, bool(done), all)

    def most(self, n: int) -> int:
        return self.shared.reduce(self.rank, int(n), max)


def steps_settling_at(extra_slow: int):
    """A step's work on a clock of its own: one compile-sized first step, `extra_slow` slow
    ones, then steady steps: stats.settled says done after 1 + extra_slow + 8 steps."""
    clock = FakeClock()
    times = iter([1.0] + [0.5] * extra_slow + [1 / 64] * 1000)  # exact in binary

    def work(_):
        clock.sleep(next(times))
        return 1

    return clock, work


def _rank_window(rank: int, ranks, out: dict, **kw) -> None:
    clock, work = steps_settling_at(extra_slow=rank)  # rank 0 settles a step before rank 1
    out[rank] = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                           warmup_max_s=30, max_s=30, warmup_max_steps=40, clock=clock,
                           ranks=ranks, **kw)


def test_ranks_own_warmup_judgements_differ_by_a_step():
    # the case the agreement is for: alone, rank 0 ends warm-up at step 9 and rank 1 at 10
    out: dict = {}
    for rank in (0, 1):
        _rank_window(rank, None, out)
    assert [out[r].warmup_steps for r in (0, 1)] == [9, 10]


def test_ranks_agree_to_end_warmup_together():
    """Two ranks whose own judgements differ by a step run the same warm-up steps (the later
    rank's), each keeps its own verdict on whether it settled, and neither waits for ever."""
    import threading

    shared, out = ThreadRanks(2), {}
    threads = [threading.Thread(target=_rank_window, args=(r, shared.view(r), out))
               for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and set(out) == {0, 1}
    assert out[0].warmup_steps == out[1].warmup_steps == 10
    assert out[0].warmup_settled is True and out[1].warmup_settled is True
    assert out[0].steps == out[1].steps == 3
    assert shared.calls[0] == shared.calls[1]  # the same collectives, in the same order


def test_warmup_done_is_the_groups_decision_and_holds_once_said():
    # one rank, the others answered by a stand-in: "not yet" until the 14th step
    clock, work = steps_settling_at(extra_slow=0)
    asked: list[bool] = []

    def agree(mine: bool) -> bool:
        asked.append(mine)
        return mine and len(asked) >= 12  # asked from the floor (step 3) on: step 14

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=1,
                   warmup_max_s=30, max_s=30, warmup_max_steps=40, clock=clock,
                   ranks=_Agreeing(agree))
    assert s.warmup_steps == 14 and s.warmup_settled is True
    assert asked == [False] * 6 + [True] * 6  # this rank's "done" from step 9 on, kept


def test_time_cap_goes_through_the_agreement_too():
    # out of time on this rank, not on the others: it runs on until they are done too
    clock = FakeClock()

    def work(_):
        clock.sleep(0.5)  # steady from the start; the cap passes at the 3rd step
        return 1

    asked: list[bool] = []

    def agree(mine: bool) -> bool:
        asked.append(mine)
        return mine and len(asked) >= 4

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=0, steps=1,
                   warmup_max_s=1.2, max_s=30, warmup_max_steps=40, clock=clock,
                   ranks=_Agreeing(agree))
    assert asked == [True] * 4 and s.warmup_steps == 6 and s.warmup_settled is False


class _Agreeing:
    """Ranks whose warm-up decision is a test's function and whose step counts agree as
    given (`most` returns this rank's count, or `others`)."""

    def __init__(self, agree, others: int = 0):
        self.all_done, self.others = agree, others
        self.planned: list[int] = []

    def most(self, n: int) -> int:
        self.planned.append(n)
        return max(n, self.others)


# ------------------------------------------------------------------ windows long enough to read


def test_window_runs_on_until_it_has_lasted_min_s():
    clock = FakeClock()
    s = run_window("compute", lambda: None, lambda b: (clock.sleep(0.0625), 1)[1], 1, "cpu",
                   warmup_steps=0, steps=3, warmup_max_s=1, max_s=10, clock=clock, min_s=0.5)
    assert s.steps == 8 and s.seconds == pytest.approx(0.5) and not s.truncated
    # without a minimum: the configured steps
    s = run_window("compute", lambda: None, lambda b: (clock.sleep(0.05), 1)[1], 1, "cpu",
                   warmup_steps=0, steps=3, warmup_max_s=1, max_s=10, clock=clock)
    assert s.steps == 3


def test_window_minimum_is_still_bounded_by_the_time_cap():
    clock = FakeClock()
    s = run_window("compute", lambda: None, lambda b: (clock.sleep(0.0625), 1)[1], 1, "cpu",
                   warmup_steps=0, steps=3, warmup_max_s=1, max_s=0.22, clock=clock, min_s=5)
    assert s.steps == 4 and not s.truncated  # its 3 steps done: the cap ended the extension


def test_window_steps_rule():
    from gpubench.core.stats import steady_step_s, window_steps

    assert window_steps(9, 2.0, 0.05, 10.0) == 40  # 40 steps of 50 ms last 2 s
    assert window_steps(50, 2.0, 0.05, 10.0) == 50  # long enough already
    assert window_steps(9, 2.0, 0.05, 1.0) == 20  # no more than fit in the cap
    assert window_steps(9, 2.0, 0.05, math.inf) == 40
    assert window_steps(9, 0.0, 0.05, 10.0) == window_steps(9, 2.0, None, 10.0) == 9
    assert steady_step_s([5.0, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1]) == pytest.approx(0.1)
    assert steady_step_s([5.0]) is None


def test_under_torchrun_the_window_length_is_fixed_before_it_opens():
    """The count planned from the warm-up's steady step time, the largest of the ranks', and
    run whatever the clock says: no rank may stop on its own (the cap would truncate it)."""
    clock, work = steps_settling_at(extra_slow=0)  # steady at 1/64 s a step
    ranks = _Agreeing(bool)
    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                   warmup_max_s=30, max_s=10, warmup_max_steps=40, clock=clock, min_s=0.5,
                   ranks=ranks)
    assert ranks.planned == [32] and s.steps == 32 and not s.truncated
    ranks = _Agreeing(bool, others=70)  # another rank's steps are faster: its count is run
    clock, work = steps_settling_at(extra_slow=0)
    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                   warmup_max_s=30, max_s=0.2, warmup_max_steps=40, clock=clock, min_s=0.1,
                   ranks=ranks)
    assert ranks.planned == [7] and s.steps == 70 and not s.truncated  # past its 0.2 s cap
    # a later window: the step time the caller measured in the last one
    ranks = _Agreeing(bool)
    clock, work = steps_settling_at(extra_slow=0)
    run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
               warmup_max_s=30, max_s=10, clock=clock, min_s=0.5, ranks=ranks, step_s=0.03125)
    assert ranks.planned == [16]


# ------------------------------------------------------------------ host-blocking decode


def test_device_work_starts_after_a_host_blocking_decode():
    """nvJPEG blocks the host for its whole decode on a stream of its own: the step's device
    work is marked from where the decode returns, and the decode's host time is kept apart.
    5 steps: 20 ms fetch, 30 ms decode (host blocked), 10 ms of device work after it."""
    from gpubench.parts.measure import DeviceStart

    clock, start = FakeClock(), DeviceStart()

    def work(_):
        clock.sleep(0.03)
        start()  # the decode returned
        clock.sleep(0.01)
        return 1

    s = run_window("loader", lambda: clock.sleep(0.02), work, 1, "cpu", warmup_steps=2,
                   steps=5, warmup_max_s=1, max_s=30, clock=clock, device_start=start)
    assert s.device_work_s == pytest.approx(0.05)
    assert s.host_blocked_s == pytest.approx(0.15)
    assert s.device_idle_s == pytest.approx(0.25)  # the training stream idles through the decode
    assert s.step_times_s == pytest.approx([0.06] * 5)  # the steps themselves unchanged
    # outside a window (warm-up above, profiling) the call marks nothing
    at = start.at
    start()
    assert start.at == at


def test_work_without_a_host_blocking_part_reports_none():
    clock = FakeClock()
    s = run_window("loader", lambda: clock.sleep(0.02), lambda _: (clock.sleep(0.01), 1)[1], 1,
                   "cpu", warmup_steps=0, steps=3, warmup_max_s=1, max_s=30, clock=clock)
    assert s.host_blocked_s is None and s.device_work_s == pytest.approx(0.03)
