"""Measurement arithmetic on constructed timings, and the window loop on a clock the test
advances itself (a step "takes" exactly what it adds), so no figure depends on the machine's
load; one test checks the default clock is the real host clock."""

from __future__ import annotations

import time

import pytest

from gpubench.parts.measure import run_window, stats_from


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
