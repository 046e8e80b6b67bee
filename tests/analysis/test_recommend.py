"""The recommendation rule (analysis.recommend) on single windows, where the intervals have no
spread: the AMP comparison, the headline's count of the configurations near the best."""

from __future__ import annotations

from gpubench.analysis.recommend import Effect, Row, amp_effect, interval_label, recommend
from gpubench.core.record import Flaw, Reason, RunRecord, Status


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

    # the rule said as it is (an interval that only overlaps the fastest's is not within 5%)
    assert rec_of(100.0)[0].endswith(
        "; no other configuration within 5% of it at the low end of its interval")
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


def _loader_run(ips: float, loader: float, workers: int = 0, **knobs) -> Row:
    """A stable CPU run at batch 4 whose loader phase measured `loader` img/s (compute 500)."""
    data = {k: v for k, v in knobs.items() if k in ("preload", "augment_on")}
    loader_knobs = {k: v for k, v in knobs.items() if k not in data}
    rec = RunRecord(status=Status.ok, images_per_sec=ips, images_per_sec_ci=[ips, ips],
                    peak_memory_fraction=0.1, memory_ceiling=0.8, measurement_stable=True,
                    loader_images_per_sec=loader, compute_images_per_sec=500.0,
                    env={"device": "cpu"},
                    config={"loader": {"batch_size": 4, "num_workers": workers, **loader_knobs},
                            "dataset": {"preload": False, **data}})
    return Row(f"w{workers}-{loader}", rec)


def test_the_loader_check_reads_only_runs_of_the_chosen_data_setting():
    """Two data settings at one worker count are no repeats: the check quotes the chosen one's
    loader rate, not a figure pooled over both (663.7 and 1978.2 read as 1320.9)."""
    slow, fast = _loader_run(90.0, 663.7), _loader_run(100.0, 1978.2, preload=True)
    rec = recommend([slow, fast])
    assert rec.chosen is fast
    (check,) = [x for x in rec.reasons if x.startswith("loader check")]
    assert "0 workers load 1978.2 img/s" in check, check
    # any data knob: the chosen setting's own figure, the other's never pooled in
    aug = [_loader_run(100.0, 1978.2, augment_on="device"), _loader_run(90.0, 663.7)]
    (check,) = [x for x in recommend(aug).reasons if x.startswith("loader check")]
    assert "0 workers load 1978.2 img/s" in check, check


def test_the_loader_check_compares_worker_only_knobs_where_they_act():
    """A 0-worker run loads as any persistent_workers setting would (inert without workers): it
    is the chosen setting's 0-worker point; a 1-worker run with another setting of it is not."""
    chosen = _loader_run(100.0, 600.0, workers=2, persistent_workers=True)
    zero = _loader_run(40.0, 300.0, workers=0, persistent_workers=False)
    other = _loader_run(60.0, 5000.0, workers=1, persistent_workers=False)
    rec = recommend([chosen, zero, other])
    assert rec.chosen is chosen
    (check,) = [x for x in rec.reasons if x.startswith("loader check")]
    # 2 workers' 600 clears compute 500; 0 workers' 300 does not; the other setting's 1 worker
    # (5000) is not this setting's figure
    assert "2 workers load 600.0 img/s" in check and "with 0: 300.0" in check, check


def test_runs_that_differ_only_in_a_knob_inert_where_they_ran_are_one_setting(compose_cfg):
    """0 workers with persistent_workers false or true (prefetch_factor 2 or 4; thread workers
    with either persistent_workers) ran alike: their records hold the knob's inert value
    (Knob.inert), so the ranking's setting key pools them as repeats of one setting."""
    from omegaconf import OmegaConf

    from gpubench.analysis.recommend import latest_per_setup, varying
    from gpubench.config.settings import resolve

    def runs(*variants: str, base: tuple[str, ...] = ("loader.num_workers=0",)) -> list[Row]:
        out = []
        for i, v in enumerate(variants):
            cfg = resolve(compose_cfg(*base, v)).config
            rec = RunRecord(status=Status.ok, images_per_sec=100.0 + i, peak_memory_fraction=0.1,
                            memory_ceiling=0.8, config=OmegaConf.to_container(cfg), rung="full",
                            started_at=f"2026-01-0{i + 1}")
            out.append(Row(str(i), rec))
        return out

    for rows in (runs("loader.persistent_workers=false", "loader.persistent_workers=true"),
                 runs("loader.prefetch_factor=2", "loader.prefetch_factor=4"),
                 runs("loader.persistent_workers=false", "loader.persistent_workers=true",
                      base=("loader.num_workers=2", "loader.worker_type=thread"))):
        assert varying(rows) == []
        (one,) = latest_per_setup(rows)
        assert len(one.confirms) == 1


def _measured(ips: float, *flaws: Flaw, lo: float | None = None, hi: float | None = None,
              rung: str | None = None) -> RunRecord:
    return RunRecord(status=Status.ok, images_per_sec=ips,
                     images_per_sec_ci=[lo or ips * 0.99, hi or ips * 1.01],
                     peak_memory_fraction=0.1, memory_ceiling=0.8,
                     measurement_stable=not flaws, rung=rung,
                     noise_reasons=[Reason(f, f.value) for f in flaws])


def test_the_confirm_steps_unconfirmed_line_asks_what_the_re_measurements_flaws_ask():
    """A top trial whose re-measurement agreed but flagged too few windows was told `rerun ...
    on a quiet machine` beside the line asking a longer measurement; where every measurement
    flagged itself that one line says it all; where re-measurements only disagreed, a quiet
    machine is the rerun."""
    def lines(rows: list[Row]) -> list[str]:
        return [r for r in recommend(rows).reasons if r.startswith("UNCONFIRMED")]

    top = Row("top", _measured(100.0, Flaw.few_windows))
    top.confirms = [_measured(101.0, Flaw.few_windows, rung="confirm")]
    [line] = lines([top, Row("other", _measured(90.0, Flaw.few_windows))])
    assert "every measurement flagged itself" in line and "measuring longer" in line
    flagged_again = Row("top", _measured(100.0))
    flagged_again.confirms = [_measured(101.0, Flaw.too_short, rung="confirm")]
    [line] = lines([flagged_again, Row("steady", _measured(90.0))])
    assert "confirm step" in line and "measuring longer" in line and "quiet" not in line
    apart = Row("top", _measured(100.0))
    apart.confirms = [_measured(60.0, lo=59.0, hi=61.0, rung="confirm")]
    [line] = lines([apart, Row("steady", _measured(90.0))])
    assert "confirm step" in line and "on a quiet machine" in line
    # a grid's repeat of a setup (no confirm step) that disagreed: the steady row measured once
    # is recommended as it is, no UNCONFIRMED line of a confirm step that never ran
    apart.confirms = [_measured(60.0, lo=59.0, hi=61.0)]
    assert lines([apart, Row("steady", _measured(90.0))]) == []


def test_a_grids_repeated_setup_never_outranks_a_faster_steady_one_measured_once():
    """A grid key inert at 0 workers (prefetch_factor=2,4) pooled the 0-worker runs as one
    repeated setup: the report named it "fastest feasible" at 870.6 over a steady 1005.4 measured
    once, "unconfirmed ... the confirm step re-measured other trials" in a grid with no confirm
    step. Only a search's confirm step, which re-measures the top trials, makes confirmed win."""
    once = Row("3", _measured(1005.4))
    repeated = Row("1", _measured(870.6))
    repeated.confirms = [_measured(875.0)]
    rec = recommend([repeated, once])
    assert rec.best is once and not any("confirm step" in x for x in rec.reasons)
    repeated.confirms = [_measured(875.0, rung="confirm")]  # a search's confirm step
    assert recommend([repeated, once]).best is repeated


def test_the_loader_check_judges_the_loader_against_compute_on_their_intervals():
    """A loader median above compute's, inside compute's wide interval, read `above compute ...
    by more than 5%` (the check passed bare figures); the workers answer and the pipes path
    judge interval against interval, and so does the check now."""
    rec = RunRecord(status=Status.ok, images_per_sec=900.0, images_per_sec_ci=[880.0, 920.0],
                    peak_memory_fraction=0.1, memory_ceiling=0.8, measurement_stable=True,
                    loader_images_per_sec=1301.5, loader_images_per_sec_ci=[1007.0, 2002.0],
                    compute_images_per_sec=1071.1, compute_images_per_sec_ci=[249.0, 3758.0],
                    env={"device": "cpu"},
                    config={"loader": {"batch_size": 4, "num_workers": 2},
                            "dataset": {"preload": False}})
    [line] = [r for r in recommend([Row("w2", rec)]).reasons if "loader check" in r]
    assert "above compute" not in line and "1301.5" in line
    # compute measured 850 [800-900]: the loader's whole interval is above it, 5% to spare
    rec.compute_images_per_sec, rec.compute_images_per_sec_ci = 850.0, [800.0, 900.0]
    [line] = [r for r in recommend([Row("w2", rec)]).reasons if "loader check" in r]
    assert "above compute 850.0 by more than 5%" in line


def test_the_loader_check_bounds_by_every_compute_measurement_of_the_setup():
    """The loader check read the chosen run's compute phase alone (500 [495-505]), where the
    workers answer takes the envelope of every compute measurement of that setup: another
    data setting's run measured compute 560 [540-580], and 2 workers' 560 [555-565] cleared
    the one bound and not the other. Both read workers.compute_bound now: open, not cleared."""
    chosen = _loader_run(100.0, 560.0, workers=2)
    chosen.record.loader_images_per_sec_ci = [555.0, 565.0]
    chosen.record.compute_images_per_sec_ci = [495.0, 505.0]
    (alone,) = [x for x in recommend([chosen]).reasons if x.startswith("loader check")]
    assert alone.startswith("loader check: 2 workers load 560.0 img/s"), alone
    other = _loader_run(60.0, 300.0, workers=1, preload=True)
    other.record.compute_images_per_sec, other.record.compute_images_per_sec_ci = 560.0, [540, 580]
    rec = recommend([chosen, other])
    assert rec.chosen is chosen
    (check,) = [x for x in rec.reasons if x.startswith("loader check")]
    assert check.startswith("loader check: no worker count measured out-runs compute 530.0 "
                            "img/s; 2 workers load 560.0 img/s"), check
    assert "the intervals overlap, so it is not decided" in check


def test_a_run_with_a_fault_injected_is_never_the_pick():
    """A grid of fault.stall_every=null,1 whose clean first job ran cold: the stalled run
    measured faster and was recommended, with a recommended.yaml that drops the fault."""
    clean, stalled = _loader_run(60.0, 300.0), _loader_run(90.0, 300.0)
    stalled.record.config["fault"] = {"stall_every": 1, "stall_s": 0.05}
    assert recommend([clean, stalled]).chosen is clean
    assert recommend([stalled]).chosen is stalled  # nothing else measured: still reported


def test_a_failed_run_with_one_measured_repeat_takes_that_repeats_interval():
    """The figure was the repeat's while the interval stayed the failed run's (0, 0): `100.0`
    with no interval where the repeat measured [90-110], and a plot whisker down to 0."""
    again = RunRecord(status=Status.ok, images_per_sec=100.0, images_per_sec_ci=[90.0, 110.0])
    row = Row("r", RunRecord(status=Status.failed), confirms=[again])
    assert (row.throughput, row.interval) == (100.0, (90.0, 110.0))
    assert row.as_ranked.images_per_sec_ci == [90.0, 110.0]
