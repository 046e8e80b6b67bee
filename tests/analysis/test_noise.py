"""Named validity checks on constructed phases."""

from __future__ import annotations

import pytest

from gpubench.analysis.noise import (
    WindowLoad,
    gpu_checks,
    interval_checks,
    load_checks,
    other_cores,
    queue_checks,
    remedies,
    step_checks,
    window_checks,
)
from gpubench.core.record import Flaw, Reason, RunRecord, longer


def plan(steps, repeats, **bench) -> RunRecord:
    """A record of a run planned as bench.steps/bench.repeats: what "measure longer" reads."""
    return RunRecord(config={"bench": {"steps": steps, "repeats": repeats, **bench}})


def test_steady_compute_steps_pass_and_spread_or_stalls_do_not():
    assert step_checks("compute", [0.1] * 20, 0.02) == []
    [vary] = step_checks("compute", [0.1] * 20, 0.5)
    assert vary.kind is Flaw.disturbed and "vary" in vary.text
    stalled = [0.1] * 18 + [2.0, 2.5]
    assert any("interrupted" in r.text for r in step_checks("e2e", stalled, 0.9))
    # a loader's bursts are its rhythm, not an interruption
    assert step_checks("loader", [0.0, 0.0, 0.0, 0.4] * 5, 1.7) == []
    # millisecond steps jitter by a scheduler tick on an idle host: not a disturbance
    ms = [0.003] * 11 + [0.012]
    assert step_checks("compute", ms, 0.6) == [] and step_checks("e2e", ms, 0.6) == []
    # half the steps slow is a rhythm (two modes of the workload), not a few interruptions
    assert not any("interrupted" in r.text for r in step_checks("e2e", [0.1, 0.5] * 10, 0.6))


def test_competition_counts_only_on_a_busy_host():
    # 2 cores: host 100% = 2 cores in use, the run 160% of one core -> 0.4 cores elsewhere
    assert other_cores(100.0, 160.0, 2) == pytest.approx(0.4)
    busy = [WindowLoad("e2e", 0, 100.0, 160.0, 5, 1.0, 2.0),
            WindowLoad("e2e", 1, 100.0, 198.0, 5, 1.0, 2.0)]
    reasons = load_checks(busy, 2)
    [r] = reasons
    assert r.kind is Flaw.disturbed and "e2e window 1 " in r.text and "0.4 cores" in r.text
    # a neighbour on a host with idle cores takes nothing from the run
    assert load_checks([WindowLoad("e2e", 0, 50.0, 100.0, 5, 1.0)], 8) == []
    assert load_checks([WindowLoad("e2e", 0, None, None, 0, 1.0)], 2) == []
    # a single-threaded run that got its one core loses nothing to a neighbour on the other
    assert load_checks([WindowLoad("e2e", 0, 100.0, 100.0, 5, 1.0, 1.0)], 2) == []
    # a 10 ms window is one scheduler tick: too coarse to subtract the run from the host
    assert load_checks([WindowLoad("loader", 0, 100.0, 100.0, 1, 0.01)], 2) == []


def test_cut_windows_and_unsettled_warmup_are_named():
    ws = [{"truncated": False}, {"truncated": True}]
    cut, warm = window_checks("compute", ws, False, 50)
    assert cut.kind is Flaw.cut_short and "window 2 cut short" in cut.text
    assert warm.kind is Flaw.warmup and "did not settle within 50" in warm.text
    assert window_checks("compute", [{"truncated": False}], None, 5) == []


@pytest.mark.parametrize("windows,coverage,words", [
    (4, 0.875, "e2e: 4 windows give an 88% interval, not 95%"),
    (3, 0.75, "e2e: 3 windows give a 75% interval, not 95%"),
    (1, None, "e2e: 1 window gives no interval, not 95%"),
])
def test_a_few_windows_reason_says_its_coverage_in_words(windows, coverage, words):
    [few] = interval_checks("e2e", [{}] * windows, coverage)
    assert few.text.startswith(words), few.text


def test_remedies_follow_the_reasons_kinds_not_their_words():
    """What to do is read from each reason's kind: a busy host asks for an idle machine, a
    shared or throttled GPU for one of its own, warm-up for a longer one; every remedy list
    ends by measuring longer, from the run's own bench.steps and bench.repeats."""
    [few] = interval_checks("e2e", [{}] * 3, 0.75)
    [queue] = queue_checks("loader", [{"steps": 2}], 8)
    [gpu] = gpu_checks("e2e", {"throttled_fraction": 0.5, "throttle_reasons": "power"})
    assert (few.kind, queue.kind, gpu.kind) == (Flaw.few_windows, Flaw.queue, Flaw.gpu)
    busy = Reason(Flaw.disturbed, "words that say nothing")
    warmed = plan(6, 6, warmup_steps=5, warmup_max_steps=20)
    warmed.noise_reasons = reasons = [busy, gpu, Reason(Flaw.warmup, "")]
    out = remedies(reasons, ["stress (pid 7) 99%"], warmed)
    assert out[0].startswith("rerun on an idle machine (stress (pid 7) 99% competed)")
    # no competitor seen: the remedy claims none (it told a user alone on the machine that
    # the run shared its cores with other work)
    alone = remedies([busy], [], plan(6, 6))[0]
    assert alone.startswith("rerun when the host is quieter: its steps varied though no "
                            "process here was seen competing") and "shares its cores" not in alone
    assert out[1].startswith("a GPU of its own")
    # a warm-up unsettled at its cap: the rerun raises the cap (more steps alone start it no
    # more settled: the advice measured 576 steps, still unsettled at 3)
    assert out[2].startswith("bench.steps=24 bench.repeats=10 bench.warmup_max_steps=40:")
    assert out[2].endswith("a longer warm-up: steps were still changing when measuring began")
    assert len(out) == 3
    # a sentence that mentions other processes is no competition unless its kind says so
    assert remedies([Reason(Flaw.few_windows, "other processes interrupted")], [],
                    plan(6, 6)) == [
        "bench.steps=24 bench.repeats=10: more and longer windows narrow the intervals"]


def test_reasons_round_trip_through_results_json_and_old_ones_still_load():
    rec = RunRecord(noise_reasons=[Reason(Flaw.queue, "loader: window 1 ...")])
    d = rec.to_dict()
    assert d["noise_reasons"] == [{"kind": "queue", "text": "loader: window 1 ..."}]
    assert RunRecord.from_dict(d).noise_reasons == rec.noise_reasons
    # a record written before reasons had kinds: its sentences, read as `other`
    old = RunRecord.from_dict({"status": "ok", "noise_reasons": ["loader: ... in flight ..."]})
    assert old.noise_reasons == [Reason(Flaw.other, "loader: ... in flight ...")]
    # a kind a newer version wrote: other, its text kept
    new = RunRecord.from_dict({"noise_reasons": [{"kind": "cosmic_rays", "text": "t"}]})
    assert new.noise_reasons == [Reason(Flaw.other, "t")]


def test_stalls_in_windows_too_short_to_judge_are_too_short_not_disturbed():
    """A run with bench.steps=12: windows of 9 ms, one step of 202 ms among 6 ms ones. In a
    window that short the sampler sees no competition and one hiccup is most of a window:
    the run was too short, and the remedy is longer windows, not another machine."""
    stalled = [0.006] * 11 + [0.202]
    [r] = step_checks("e2e", stalled, 2.0, window_s=0.009)
    assert r.kind is Flaw.too_short and "in windows of 9 ms, too short" in r.text
    [r] = step_checks("e2e", stalled, 2.0, window_s=0.8)  # long windows: a real interruption
    assert r.kind is Flaw.disturbed and r.text.endswith("interrupted steps")
    run = plan(12, 6, max_seconds=60.0)
    run.noise_reasons = [Reason(Flaw.too_short, "")]
    # the one "measure longer" (core.record.longer) asks the least duration: every reader of
    # the flaw (the ranking's rerun line too) names it, not the console's advice alone
    [out] = remedies(run.noise_reasons, [], run)
    assert out.startswith("bench.steps=48 bench.repeats=10 bench.min_window_s=0.5: ")
    assert "windows of at least 0.5 s show whether other work competed" in out
    run.config["bench"]["max_seconds"] = 2.0  # each window may last 0.2 s: the cap rises too
    assert str(longer(run)) == ("bench.steps=48 bench.repeats=10 bench.max_seconds=5 "
                                "bench.min_window_s=0.5")
    # it had them: more steps and windows, and a cap that holds 10 windows of 0.5 s (under 2 s
    # settings refuses the command: min_window_s above max_seconds / repeats)
    run.config["bench"]["min_window_s"] = 0.5
    assert str(longer(run)) == "bench.steps=48 bench.repeats=10 bench.max_seconds=5"


def _bench(windows_s: float, host_cpu: float, run_cpu: float):
    """What `run.summary.validity` reads of a run: its record and its loader settings."""
    from types import SimpleNamespace

    from gpubench.core.record import PhaseRecord

    window = {"seconds": windows_s, "steps": 2, "host_cpu_util_mean": host_cpu,
              "process_cpu_util_mean": run_cpu, "samples": 5}
    rec = RunRecord(env={"cpu_count": 2}, extra={"cpu_demand_cores": 2.0},
                    phases={"e2e": PhaseRecord("e2e", 16, windows=[dict(window)] * 6,
                                               images_per_sec_ci_coverage=0.97)},
                    series={"e2e": {"step_times_s": [0.006] * 11 + [0.202]}})
    loader = SimpleNamespace(num_workers=0, prefetch_factor=None)
    return SimpleNamespace(record=rec, settings=SimpleNamespace(loader=loader))


def test_a_run_that_saw_competition_is_disturbed_whatever_its_windows():
    from gpubench.run.summary import validity

    # short windows, a quiet host: the stall is the shortness's
    assert [r.kind for r in validity(_bench(0.009, 20.0, 100.0))] == [Flaw.too_short]
    # windows the sampler can judge saw another process take a core: the stall is its doing
    kinds = [r.kind for r in validity(_bench(0.6, 100.0, 120.0))]
    assert kinds == [Flaw.disturbed, Flaw.disturbed]
