"""The run record: one table of runs checked once against feasible / constraint / objective.
The sweeper, the report and tracking read runs through these same records."""

from __future__ import annotations

import json
import math
import os
import socket

import pytest

from gpubench.core.record import (
    OOM_CONSTRAINT,
    Bottleneck,
    PhaseRecord,
    Rung,
    RunRecord,
    Status,
    find_runs,
    interval_label_of,
    load,
    longer,
    longer_plan,
    missing,
    window_plan,
)


def make(status="ok", e2e=100.0, compute=120.0, loader=400.0, peak=0.5, ceiling=0.8,
         rung="run", **kw) -> RunRecord:
    return RunRecord(status=Status(status), images_per_sec=e2e, compute_images_per_sec=compute,
                     loader_images_per_sec=loader, peak_memory_fraction=peak,
                     memory_ceiling=ceiling, rung=rung, **kw)


# (record, feasible, constraint, objective, full)
TABLE = {
    "ok": (make(), True, 0.5 - 0.8, 100.0, True),
    "ok without a memory peak": (make(peak=None), True, 0.0, 100.0, True),
    "ok, loader phase only": (make(e2e=None, compute=None), True, -0.3, 400.0, True),
    "ok but measured nothing": (make(e2e=None, compute=None, loader=None), False, -0.3, 0.0, True),
    "over_ceiling": (make("over_ceiling", peak=0.9), False, 0.9 - 0.8, 0.0, True),
    "oom": (make("oom", e2e=None, compute=None, peak=0.99), False, OOM_CONSTRAINT, 0.0, True),
    "failed": (make("failed", peak=None), False, OOM_CONSTRAINT, 0.0, True),
    "killed": (make("killed", peak=None), False, OOM_CONSTRAINT, 0.0, True),
    "screening job": (make(rung="screen"), True, 0.5 - 0.8, 100.0, False),
    "max-batch probe": (make(rung="probe", peak=0.6), True, 0.6 - 0.8, 100.0, False),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_meaning_of_a_record(name):
    rec, feasible, constraint, objective, full = TABLE[name]
    assert rec.feasible is feasible
    assert rec.constraint == pytest.approx(constraint)
    assert rec.objective == pytest.approx(objective)
    assert rec.full is full


def test_over_ceiling_keeps_its_measured_speed():
    rec = TABLE["over_ceiling"][0]
    assert rec.throughput == 100.0 and rec.objective == 0.0  # measured, not feasible


def test_fits_under_a_reserve():
    assert make(peak=0.7).fits_under(0.05)  # 0.7 <= 0.8 * 0.95
    assert not make(peak=0.77).fits_under(0.05)
    assert not make("oom", peak=None).fits_under(0.05)
    assert make("over_ceiling", peak=0.5, ceiling=0.8).fits_under(0.0)


def test_round_trip_keeps_every_key(tmp_path):
    rec = RunRecord.start(tmp_path, {"loader": {"batch_size": 8}}, {"device": "cpu"}, 0.8)
    rec.status, rec.images_per_sec = Status.ok, 50.0
    rec.extra["profile"] = {"steps": 2}  # a key this version keeps without knowing it
    rec.save()
    raw = json.loads((tmp_path / "results.json").read_text())
    assert raw["schema_version"] == 2 and raw["status"] == "ok" and raw["objective"] == 50.0
    assert raw["profile"] == {"steps": 2} and raw["pid"] == os.getpid()
    back = load(tmp_path)
    assert back.to_dict() == raw
    assert back.knob("loader.batch_size") == 8 and back.knob("loader.nope") is None


def test_a_running_record_has_no_objective_yet(tmp_path):
    rec = RunRecord.start(tmp_path, {}, {}, 0.8)
    assert rec.to_dict()["objective"] is None


def test_old_and_broken_files(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"status": "weird", "phases": {}}))
    rec = load(tmp_path)
    assert rec.status is Status.failed and rec.schema_version == 1
    (tmp_path / "results.json").write_text("{half")
    assert load(tmp_path) is None
    m = missing(tmp_path, "no results.json")
    assert m.status is Status.failed and not m.feasible and m.constraint == OOM_CONSTRAINT


@pytest.mark.slow
def test_stale_only_when_its_process_is_gone(tmp_path):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = RunRecord(pid=p.pid, host=socket.gethostname())
    assert dead.stale
    assert not RunRecord(pid=os.getpid(), host=socket.gethostname()).stale  # alive
    assert not RunRecord(pid=p.pid, host="another-host").stale  # cannot tell
    assert not RunRecord(status=Status.ok, pid=p.pid, host=socket.gethostname()).stale


def test_find_runs_skips_artifact_stores(tmp_path):
    for d in ("a", "b/c", "mlartifacts/1/x/artifacts", "mlruns/2"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "results.json").write_text("{}")
    assert [p.relative_to(tmp_path).as_posix() for p in find_runs(tmp_path)] == ["a", "b/c"]


def test_throughput_interval_is_the_headline_phases_and_holds_the_figure():
    rec = make(e2e=100.0)
    assert rec.throughput_interval == (100.0, 100.0)  # one window: the figure itself
    rec.images_per_sec_ci = [95.0, 99.0]  # an interval whose ends miss the median is widened
    assert rec.throughput_interval == (95.0, 100.0)
    loader_only = make(e2e=None, compute=None, loader=400.0)
    loader_only.loader_images_per_sec_ci = [380.0, 410.0]
    assert loader_only.throughput_interval == (380.0, 410.0)


def test_a_records_rung_is_the_readers_else_its_own():
    d = {"run_uid": "x", "status": "ok", "rung": "screen"}  # written by a sweeper's job
    assert RunRecord.from_dict(d).rung is Rung.screen and not RunRecord.from_dict(d).full
    assert RunRecord.from_dict(d, rung="full").rung is Rung.full  # sweep.json says otherwise
    assert RunRecord.from_dict(d | {"rung": "from-a-newer-version"}).rung is Rung.run
    assert RunRecord.from_dict({"run_uid": "x", "status": "ok"}).rung is Rung.run
    assert [r for r in Rung if r.short] == [Rung.screen, Rung.probe]


def test_window_plan_splits_the_phase_steps_over_its_windows():
    assert window_plan(24, 6) == (6, 4)
    assert window_plan(6, 6) == (6, 1)  # a sweep's bench.steps=6: one step a window, not six
    assert window_plan(25, 6) == (6, 5)  # rounded up: never fewer steps than asked
    assert window_plan(2, 6) == (2, 1)  # never more windows than steps


def test_a_table_of_runs_names_the_coverage_its_intervals_have():
    def with_coverage(c):
        return make(images_per_sec_ci=[90.0, 110.0], phases={"e2e": PhaseRecord.from_dict(
            {"images_per_sec_ci": [90.0, 110.0], "images_per_sec_ci_coverage": c})})

    def label(*runs):
        return interval_label_of(r.interval_coverage for r in runs)

    assert label(with_coverage(0.95), with_coverage(0.95)) == "95% interval"
    assert label(with_coverage(0.75)) == with_coverage(0.75).interval_label == "75% interval"
    assert label(with_coverage(0.95), with_coverage(0.75)) == "75-95% interval"
    assert label() == "interval"  # no run with an interval: no coverage claimed
    # a run whose phases hold no interval (an OOM's one window) heads a column of dashes
    one = make(phases={"loader": PhaseRecord.from_dict({"images_per_sec": 3041.7})})
    assert one.interval_label == "interval"


def test_a_runs_interval_label_states_each_phases_coverage_not_the_lowest():
    """A job failed after 8 windows: loader and compute kept 3 windows (75%), e2e 2 (50%). The
    label of its phases' intervals said `50% interval` over the 75% ones: it is their span, and
    the run's own figure (e2e's) is named by e2e's coverage alone."""
    ci = {"loader": (900.0, 0.75), "compute": (120.0, 0.75), "e2e": (100.0, 0.5)}
    phases = {n: PhaseRecord.from_dict({"images_per_sec": v, "images_per_sec_ci": [v / 2, 2 * v],
                                        "images_per_sec_ci_coverage": c})
              for n, (v, c) in ci.items()}
    rec = make(images_per_sec_ci=[50.0, 200.0], phases=phases)
    assert rec.interval_label == "50-75% interval"
    assert [rec.phase_coverage(n) for n in ci] == [0.75, 0.75, 0.5]
    assert rec.interval_coverage == 0.5  # the headline, e2e's
    rec.phases["e2e"].images_per_sec_ci_coverage = 0.75
    assert rec.interval_label == "75% interval" and rec.interval_coverage == 0.75
    # a coverage above CONFIDENCE is named a CONFIDENCE one; an older record without: CONFIDENCE
    rec.phases["e2e"].images_per_sec_ci_coverage = 0.97
    rec.phases["loader"].images_per_sec_ci_coverage = None
    assert rec.interval_label == "75-95% interval" and rec.interval_coverage == 0.95


def test_the_verdict_is_an_enum_written_as_its_word():
    rec = RunRecord.from_dict({"status": "ok", "bottleneck": "data"})
    assert rec.bottleneck is Bottleneck.data and json.loads(json.dumps(rec.to_dict()))[
        "bottleneck"] == "data"
    assert f"{rec.bottleneck}-bound" == "data-bound"
    # none recorded stays none; a word another version wrote reads as unknown
    assert RunRecord.from_dict({}).bottleneck is None
    assert RunRecord.from_dict({"bottleneck": "balanced"}).bottleneck is Bottleneck.unknown


def plan(steps, repeats, **bench) -> RunRecord:
    """A record of a run planned as bench.steps/bench.repeats (and any other bench keys)."""
    return RunRecord(config={"bench": {"steps": steps, "repeats": repeats, **bench}})


def test_measure_longer_is_one_rule():
    """Every "measure longer" (the report's rerun line, the remedies of a disturbed run, the
    verdict's fallback) is at least 10 windows, each at least twice as long, four times the steps
    at least: each plan it gives has more and longer windows."""
    assert str(longer(plan(6, 6))) == "bench.steps=24 bench.repeats=10"
    assert str(longer(plan(50, 20))) == "bench.steps=200 bench.repeats=20"
    # a plan of one-step windows: 4x the steps over 10 windows (8) was still one step a window
    assert str(longer(plan(2, 6))) == "bench.steps=20 bench.repeats=10"
    for steps in range(1, 120):
        for repeats in (1, 3, 6, 10, 20, 100):
            new = longer_plan(steps, repeats)
            (w0, p0), (w1, p1) = window_plan(steps, repeats), window_plan(*new)
            assert w1 >= max(w0, min(10, new[0])) and p1 >= 2 * p0, (steps, repeats, new)
    # not a record's config
    assert str(longer(plan(None, 6))) == str(longer(None)) == "bench.steps=... bench.repeats=..."


def test_measure_longer_lifts_the_cap_that_cut_a_run_short():
    """More steps alone are cut at the same bench.max_seconds: the one "measure longer" raises it
    to what the new steps need at the pace measured, the most cut phase's (124 of 600 steps in
    0.3 s: 2400 need 5.8 s; 4x the cap, 1.2 s, cut them again), for its own plan and any other
    (the verdict's `would decide`)."""
    rec = plan(600, 6, max_seconds=0.3)
    rec.phases = {"e2e": PhaseRecord(phase="e2e", steps=124, truncated=False)}
    assert str(longer(rec)) == "bench.steps=2400 bench.repeats=10"
    rec.phases["e2e"].truncated = True
    # with CAP_HEADROOM (1.5) to spare: 5.8 s at the pace measured
    assert str(longer(rec)) == "bench.steps=2400 bench.repeats=10 bench.max_seconds=8.8"
    assert longer(rec).max_seconds == 8.8
    # every window ran 1 of its 100 steps: 2400 steps need 400x the cap
    rec.phases["compute"] = PhaseRecord(phase="compute", steps=6, truncated=True)
    assert str(longer(rec)) == "bench.steps=2400 bench.repeats=10 bench.max_seconds=180"
    assert str(longer(rec, (1500, 15))) == "bench.steps=1500 bench.repeats=15 bench.max_seconds=113"
    # a loader's windows of 24 steps (2 workers, prefetch 4: 3x the 8 batches in flight), 32 of
    # its 144 run: its share, not 32 of the 72 compute plans (advised 0.3 s, cut again at 75);
    # its new plan 10 windows of 24 (240 steps), at 32 steps a 0.15 s: 1.2 s
    rec = plan(12, 6, max_seconds=0.15)
    rec.config["loader"] = {"num_workers": 2, "prefetch_factor": 4}
    rec.phases = {"loader": PhaseRecord(phase="loader", steps=32, truncated=True)}
    assert longer(rec).max_seconds == math.ceil(10 * 0.15 * 240 / 32 * 1.5) / 10 == 1.7


def test_measure_longer_lifts_a_cap_the_longer_plan_would_reach():
    """A run inside its cap: bench.steps=20 in 6 windows, e2e 20 steps in 30 s of the default
    60 s cap. Its "measure longer" (80 steps in 10 windows) takes 120 s at that pace: as
    advised it was cut short at 60 s. The cap it needs, with CAP_HEADROOM: 180 s."""
    rec = plan(20, 6, max_seconds=60.0)
    rec.phases = {"e2e": PhaseRecord(phase="e2e", steps=20, seconds=30.0),
                  "compute": PhaseRecord(phase="compute", steps=20, seconds=6.0)}
    assert str(longer(rec)) == "bench.steps=80 bench.repeats=10 bench.max_seconds=180"
    rec.phases["e2e"].seconds = 6.0  # 24 s at that pace, 36 s spared: inside the cap
    assert longer(rec).max_seconds is None
    # windows of at least 2 s (bench.min_window_s): 40 of them need 80 s, whatever the pace
    # (settings refuses min_window_s above max_seconds / repeats: the command as advised was)
    rec.config["bench"]["min_window_s"] = 2.0
    assert str(longer(rec, (80, 40))) == ("bench.steps=80 bench.repeats=40 "
                                           "bench.max_seconds=80")


def test_a_loader_window_gpubench_sizes_never_times_the_queue():
    """README example 3 with 8 workers: bench.steps=50 in 6 windows is 9 steps a window, and 16
    batches are in flight. gpubench sizes each loader window to a few times that, so the
    queue check (analysis.noise.queue_checks) never flags a window it chose."""
    from gpubench.analysis.noise import queue_checks
    from gpubench.core.pipe import QUEUE_WINDOWS, batches_in_flight, loader_window_steps

    assert loader_window_steps(9, 8, 2) == QUEUE_WINDOWS * 16 >= 3 * 16
    assert loader_window_steps(9, 0, None) == 9  # no workers: nothing in flight
    assert loader_window_steps(60, 2, 2) == 60  # bench.steps' share when it is more
    for workers in range(17):
        for prefetch in (None, 1, 2, 4):
            for steps, repeats in ((12, 6), (50, 6), (6, 6), (1, 1)):
                per = window_plan(steps, repeats)[1]
                window = {"steps": loader_window_steps(per, workers, prefetch)}
                assert queue_checks("loader", [window] * 6,
                                    batches_in_flight(workers, prefetch)) == []
    # a window of fewer batches than in flight (cut short, or an older run) still is flagged
    assert queue_checks("loader", [{"steps": 9}], 16)


@pytest.mark.parametrize("source, whole", [("host_rss", "host RAM"),
                                           ("torch_cuda_reserved", "the device")])
def test_a_peak_is_worded_as_a_fraction_of_what_it_was_read_against(source, whole):
    """A CPU run's peak is summed RSS against host RAM: its over-ceiling error, a search's
    trial line and the max-batch answer called it `of the device`."""
    from gpubench.search.maxbatch import summary_lines

    rec = RunRecord(peak_memory_fraction=0.9, memory_ceiling=0.8, memory_source=source)
    rec.finish(Status.ok, None)
    assert rec.status is Status.over_ceiling
    assert rec.error == f"peak memory 90.0% of {whole} > memory.ceiling 80%"
    line = summary_lines({"max_batch": 16, "memory_ceiling": 0.8, "reserve": 0.05,
                          "limit_reached": False, "memory_of": rec.memory_of})[0]
    assert line == f"max batch under 80% x (1 - 5%) of {whole}: 16"
