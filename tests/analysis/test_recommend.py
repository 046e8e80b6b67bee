"""The recommendation rule (analysis.recommend) on single windows, where the intervals have no
spread: the AMP comparison, the headline's count of the configurations near the best."""

from __future__ import annotations

from gpubench.analysis.recommend import Effect, Row, amp_effect, interval_label, recommend
from gpubench.core.record import RunRecord, Status


def one_window(ips: float) -> Row:
    return Row(f"{ips}", RunRecord(status=Status.ok, images_per_sec=ips))


def test_single_windows_are_decided_by_their_figures_and_equal_ones_are_no_difference():
    assert one_window(120.0).interval == (120.0, 120.0)
    assert amp_effect(one_window(120.0), one_window(100.0)) is Effect.faster
    assert amp_effect(one_window(90.0), one_window(100.0)) is Effect.slower
    assert amp_effect(one_window(100.0), one_window(100.0)) is Effect.same


def test_the_headline_counts_the_other_configurations_near_the_best():
    """`1 configuration(s) within 5%` was the best itself: the others are counted, in words."""
    def rec_of(*ips: float) -> list[str]:
        return recommend([one_window(x) for x in ips], 0.05).reasons

    assert rec_of(100.0)[0].endswith("; no other configuration within 5% of it on their intervals")
    assert "; 1 other configuration within 5%" in rec_of(100.0, 97.0)[0]
    assert "; 2 other configurations within 5%" in rec_of(100.0, 97.0, 96.0)[0]
    assert "(s)" not in " ".join(rec_of(100.0, 50.0))


def test_a_table_of_runs_without_an_interval_claims_no_coverage():
    """Every run failed (or held one window): the column of dashes is headed `interval`, not
    `95% interval`; a measured one with a spread names its own."""
    failed = Row("f", RunRecord(status=Status.failed))
    assert interval_label([failed, one_window(100.0)]) == "interval"
    spread = Row("s", RunRecord(status=Status.ok, images_per_sec=100.0,
                                images_per_sec_ci=[90.0, 110.0]))
    assert interval_label([failed, spread]) == "95% interval"
