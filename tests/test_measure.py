"""Measurement arithmetic on constructed timings, and the window loop on a CPU clock."""

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


def test_window_excludes_warmup_and_separates_data_wait():
    calls = []

    def fetch():
        time.sleep(0.02)  # the data side: 20 ms per batch
        return len(calls)

    def work(batch):
        calls.append(batch)
        time.sleep(0.01 if len(calls) > 2 else 0.2)  # two slow warm-up steps
        return 4

    s = run_window("e2e", fetch, work, 4, "cpu", warmup_steps=2, steps=5,
                   warmup_max_s=10, max_s=10)
    assert len(calls) == 7 and s.steps == 5 and s.images == 20
    assert s.warmup_steps == 2 and min(s.warmup_step_times_s) > 0.19
    assert max(s.step_times_s) < 0.15  # warm-up excluded from the window
    assert 0.5 < s.data_wait_fraction < 0.85  # ~20 of ~30 ms per step waits for data
    assert s.images_per_sec == pytest.approx(20 / s.seconds)


def test_time_cap_closes_the_window():
    s = run_window("compute", lambda: None, lambda b: (time.sleep(0.05), 1)[1], 1, "cpu",
                   warmup_steps=0, steps=1000, warmup_max_s=1, max_s=0.2)
    assert s.truncated and 3 <= s.steps < 1000


def test_warmup_runs_until_steps_are_steady_and_says_so():
    times = iter([0.3, 0.2, 0.1] + [0.01] * 100)

    def work(_):
        time.sleep(next(times))
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=3,
                   warmup_max_s=30, max_s=30, warmup_max_steps=40)
    assert s.warmup_settled is True
    assert 11 <= s.warmup_steps <= 14  # 3 slow steps, then two steady groups of 4
    assert max(s.step_times_s) < 0.1


def test_warmup_that_never_settles_stops_at_its_bound():
    slow = iter([0.005 * (i + 1) for i in range(100)])  # every step slower than the last

    def work(_):
        time.sleep(next(slow))
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=2, steps=1,
                   warmup_max_s=30, max_s=30, warmup_max_steps=12)
    assert s.warmup_settled is False and s.warmup_steps == 12


def test_compile_sized_first_step_still_gets_steps_after_it():
    # a time cap shorter than the first step (torch.compile) must not end warm-up there
    first = [True]

    def work(_):
        if first:
            first.clear()
            time.sleep(0.3)
        return 1

    s = run_window("compute", lambda: None, work, 1, "cpu", warmup_steps=1, steps=1,
                   warmup_max_s=0.1, max_s=30, warmup_max_steps=20)
    assert s.warmup_steps >= 3


def test_marks_around_each_step_split_idle_from_work():
    # on CUDA these are events (device idle vs the device time of the work); the arithmetic
    # is the same on the host clock: 5 steps of 20 ms waiting then 10 ms of work
    def fetch():
        time.sleep(0.02)

    def work(_):
        time.sleep(0.01)
        return 1

    s = run_window("loader", fetch, work, 1, "cpu", warmup_steps=0, steps=5,
                   warmup_max_s=1, max_s=30)
    assert 0.09 < s.device_idle_s < 0.2 and 0.045 < s.device_work_s < 0.1
    assert s.device_idle_s + s.device_work_s <= s.seconds + 1e-6
