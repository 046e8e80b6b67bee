"""Interval arithmetic and warm-up settling on constructed timings."""

from __future__ import annotations

import math

import pytest

from gpubench.core.pipe import batches_in_flight, serial_rate
from gpubench.core.ranges import range_last
from gpubench.core.stats import (
    Est,
    median,
    median_interval,
    percentile,
    pool,
    settled,
    stats_from,
)


def test_percentile_matches_linear_interpolation():
    xs = [0.4, 0.1, 0.3, 0.2]
    assert percentile(xs, 50) == pytest.approx(0.25)
    assert percentile(xs, 95) == pytest.approx(0.385)
    assert percentile([0.7], 95) == 0.7
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize("n,coverage", [(2, 0.5), (5, 1 - 2 / 32), (6, 1 - 2 / 64)])
def test_small_samples_give_min_max_with_their_coverage(n, coverage):
    xs = list(range(10, 10 + n))
    lo, hi, cover = median_interval(xs)
    assert (lo, hi) == (10, 10 + n - 1)
    assert cover == pytest.approx(coverage)


def test_larger_samples_narrow_to_inner_order_statistics():
    xs = [float(x) for x in range(1, 21)]  # n = 20: P(B(20,.5) < 6) = 0.0207 -> k = 6
    lo, hi, cover = median_interval(xs)
    assert (lo, hi) == (6.0, 15.0)
    assert 0.95 <= cover < 0.99


def test_one_window_has_no_interval_and_outliers_do_not_move_the_median():
    assert median_interval([5.0]) is None
    w = [stats_from("e2e", 4, 40, [0.1] * 10, s, 0.0, [], 0.0, False)
         for s in (1.0, 1.0, 1.0, 1.05, 0.95, 10.0)]  # one window disturbed 10x
    p = pool(w)
    assert p["images_per_sec"] == pytest.approx(40.0)  # the median, not the pooled 240/15
    assert p["images_per_sec_ci"][0] == pytest.approx(4.0)  # the outlier widens the interval
    assert p["repeats"] == 6 and p["steps"] == 60 and p["images"] == 240


def test_settled_needs_two_steady_groups_after_the_first_step():
    compile_then_steady = [16.0] + [0.1] * 8
    assert settled(compile_then_steady)
    assert not settled([16.0] + [0.1] * 7)  # one group short
    still_falling = [16.0, 1.0, 0.9, 0.8, 0.7, 0.4, 0.3, 0.2, 0.1]
    assert not settled(still_falling)
    # loader-like bursts (0, 0, 0, 0.4 per 4 steps) settle on their means
    assert settled([1.0] + [0.0, 0.0, 0.0, 0.4] * 2)


@pytest.mark.parametrize("ci,value,expected", [
    ((10.0, 20.0, 0.95), 15.0, (10.0, 20.0)),   # inside: unchanged
    ((10.0, 20.0, 0.95), 25.0, (10.0, 25.0)),   # above: the top moves to the figure
    ((10.0, 20.0), 5.0, (5.0, 20.0)),           # below: the bottom moves
    (None, 7.0, (7.0, 7.0)),                    # no interval: the figure alone
])
def test_an_interval_is_widened_to_hold_its_figure(ci, value, expected):
    from gpubench.core.stats import holding

    assert holding(ci, value) == expected


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert median([4.0, 1.0, 10.0, 2.0]) == 3.0  # not the upper middle value (4)
    assert median([3.0, 1.0, 2.0]) == 2.0


@pytest.mark.parametrize("start, stop, step, last", [
    (0, 4, 1, 3), (8, 33, 8, 32), (8, 32, 8, 24), (10, 0, -3, 1), (0.5, 1.0, 0.2, 0.9),
    (4, 4, 1, None), (4, 0, 1, None), (0, 4, 0, None),
])
def test_a_hydra_range_ends_before_its_stop(start, stop, step, last):
    got = range_last(start, stop, step)
    assert got == pytest.approx(last) if last is not None else got is None
    if isinstance(step, int) and step:  # as Python's range
        assert got == (list(range(start, stop, step)) or [None])[-1]


def test_batches_in_flight_and_the_serial_rate():
    assert batches_in_flight(0, 4) == 0  # no workers: the main process makes each batch
    assert batches_in_flight(3, None) == 6  # torch's prefetch_factor when unset
    assert batches_in_flight(3, 4) == 12
    # 100 img/s of compute plus 5 ms of device data work per image, one after the other
    assert serial_rate(100.0, 0.005) == pytest.approx(1 / (0.01 + 0.005))


def test_one_estimate_its_ratio_and_its_rendering():
    """Est is every "x [lo-hi]" of gpubench: built from a figure and its interval (widened to
    hold the figure), divided interval-conservatively, written one way in any number format."""
    loader, compute = Est.of(812.3, [790.0, 840.0]), Est.of(540.0, (520.0, 555.0))
    assert f"{loader}" == "812 [790-840]" and f"{loader:.1f}" == "812.3 [790.0-840.0]"
    share = loader.over(compute)
    assert (share.lo, share.hi) == (pytest.approx(790 / 555), pytest.approx(840 / 520))
    assert f"{share:.0%}" == "150% [142%-162%]"
    # no spread: the figure alone; each number by its own size without a spec
    assert f"{Est.of(41.52)}" == "41.5" and f"{Est(105.0, 95.0, 115.0)}" == "105 [95.0-115]"
    # the interval widened to hold its figure, or dropped when an end was not measured
    assert Est.of(100.0, [110.0, 120.0]) == Est(100.0, 100.0, 120.0)
    assert Est.of(100.0, [0.0, 120.0]).exact and Est.of(100.0, [None, 1.0]).exact
    assert Est.of(0.0) is None and Est.of(float("nan")) is None and Est.of(None) is None
    # windows' figures: their median and its order-statistic interval
    assert Est.median_of([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == Est(3.5, 1.0, 6.0)
    assert Est.median_of([2.0]).exact
    # repeats pooled by medians; several measurements of a bound inside the widest interval
    a, b, c = Est(10.0, 9.0, 11.0), Est(12.0, 8.0, 13.0), Est(11.0, 10.0, 12.0)
    assert Est.pooled([a, b, c]) == Est(11.0, 9.0, 12.0)
    assert Est.envelope([a, b, c]) == Est(11.0, 8.0, 13.0)


def test_spread_of_a_window_with_a_step_time_that_is_not_finite_reads_nan():
    """A NaN or inf step time gives NaN, not an error at the window's close."""
    from gpubench.core.stats import spread

    assert math.isnan(spread([0.1, 0.2, math.nan])[1])
    assert math.isnan(spread([0.1, math.inf])[1])
    mean, cv = spread([0.1, 0.1, 0.4])
    assert mean == pytest.approx(0.2) and cv == pytest.approx(math.sqrt(0.02) / 0.2)
