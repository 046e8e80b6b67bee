"""The AMP comparison of the recommendation rule (analysis.recommend.amp_effect) on single
windows, where the intervals have no spread."""

from __future__ import annotations

from gpubench.analysis.recommend import Row, amp_effect
from gpubench.core.record import RunRecord, Status


def one_window(ips: float) -> Row:
    return Row(f"{ips}", RunRecord(status=Status.ok, images_per_sec=ips))


def test_single_windows_are_decided_by_their_figures_and_equal_ones_are_no_difference():
    assert one_window(120.0).interval == (120.0, 120.0)
    assert amp_effect(one_window(120.0), one_window(100.0)) == "faster"
    assert amp_effect(one_window(90.0), one_window(100.0)) == "slower"
    assert amp_effect(one_window(100.0), one_window(100.0)) == "same"
