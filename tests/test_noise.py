"""Named validity checks on constructed phases."""

from __future__ import annotations

import pytest

from gpubench.analysis.noise import (
    WindowLoad,
    load_checks,
    other_cores,
    step_checks,
    window_checks,
)


def test_steady_compute_steps_pass_and_spread_or_stalls_do_not():
    assert step_checks("compute", [0.1] * 20, 0.02) == []
    assert "vary" in step_checks("compute", [0.1] * 20, 0.5)[0]
    stalled = [0.1] * 18 + [2.0, 2.5]
    assert any("interrupted" in r for r in step_checks("e2e", stalled, 0.9))
    # a loader's bursts are its rhythm, not an interruption
    assert step_checks("loader", [0.0, 0.0, 0.0, 0.4] * 5, 1.7) == []
    # millisecond steps jitter by a scheduler tick on an idle host: not a disturbance
    ms = [0.003] * 11 + [0.012]
    assert step_checks("compute", ms, 0.6) == [] and step_checks("e2e", ms, 0.6) == []
    # half the steps slow is a rhythm (two modes of the workload), not a few interruptions
    assert not any("interrupted" in r for r in step_checks("e2e", [0.1, 0.5] * 10, 0.6))


def test_competition_counts_only_on_a_busy_host():
    # 2 cores: host 100% = 2 cores in use, the run 160% of one core -> 0.4 cores elsewhere
    assert other_cores(100.0, 160.0, 2) == pytest.approx(0.4)
    busy = [WindowLoad("e2e", 0, 100.0, 160.0, 5, 1.0, 2.0),
            WindowLoad("e2e", 1, 100.0, 198.0, 5, 1.0, 2.0)]
    reasons = load_checks(busy, 2)
    assert len(reasons) == 1 and "e2e window 1 " in reasons[0] and "0.4 cores" in reasons[0]
    # a neighbour on a host with idle cores takes nothing from the run
    assert load_checks([WindowLoad("e2e", 0, 50.0, 100.0, 5, 1.0)], 8) == []
    assert load_checks([WindowLoad("e2e", 0, None, None, 0, 1.0)], 2) == []
    # a single-threaded run that got its one core loses nothing to a neighbour on the other
    assert load_checks([WindowLoad("e2e", 0, 100.0, 100.0, 5, 1.0, 1.0)], 2) == []
    # a 10 ms window is one scheduler tick: too coarse to subtract the run from the host
    assert load_checks([WindowLoad("loader", 0, 100.0, 100.0, 1, 0.01)], 2) == []


def test_cut_windows_and_unsettled_warmup_are_named():
    ws = [{"truncated": False}, {"truncated": True}]
    reasons = window_checks("compute", ws, False, 50)
    assert "window 2 cut short" in reasons[0] and "did not settle within 50" in reasons[1]
    assert window_checks("compute", [{"truncated": False}], None, 5) == []
