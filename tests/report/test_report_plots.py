"""Sweep report pictures: what each plot draws (points with their intervals, lines of runs
that differ in the plotted knob alone, bounds of the same runs, flagged and short runs apart,
labels, ticks), read from the pure data functions on constructed runs; the PNGs written with
few trials; and `python -m gpubench.report` speaking when its report is up to date."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from gpubench.analysis import recommend
from gpubench.core.record import Flaw, PhaseRecord, Reason, RunRecord, Status
from gpubench.report import cli as report_cli
from gpubench.report import plot_rules
from gpubench.report import plots as report_plots
from gpubench.report.plot_data import curve_data, memory_data, pareto_data
from gpubench.report.plot_rules import (
    FRONT_LABEL,
    MAX_LINES,
    MIN_IMPORTANCE_TRIALS,
    Apart,
    flag_reasons,
    headline_phase,
    importance_params,
    importance_title,
    inert_knobs,
)

QUEUE = Reason(Flaw.queue, "loader: windows 1, 2 of fewer batches than the workers hold in "
               "flight (16 = loader.num_workers x loader.prefetch_factor): timed batches made "
               "before the window began (bench.steps >= 16 x bench.repeats)")
BUSY = Reason(Flaw.disturbed, "other processes used CPU")


def run(batch=16, workers=2, prec="fp32", e2e=100.0, loader=150.0, compute=120.0, peak=0.5,
        status=Status.ok, ceiling=0.9, channels_last=False, ci=None, noise=(), device="cuda",
        source=None, **more) -> RunRecord:
    """A run; `ci` maps a phase to its interval (e2e's is the row's interval)."""
    ci = ci or {}
    phases = {n: PhaseRecord(n, batch, images_per_sec=v, images_per_sec_ci=ci.get(n))
              for n, v in (("loader", loader), ("compute", compute), ("e2e", e2e)) if v}
    return RunRecord(status=status, images_per_sec=e2e, images_per_sec_ci=ci.get("e2e"),
                     loader_images_per_sec=loader, loader_images_per_sec_ci=ci.get("loader"),
                     compute_images_per_sec=compute, compute_images_per_sec_ci=ci.get("compute"),
                     peak_memory_fraction=peak, memory_ceiling=ceiling, phases=phases,
                     noise_reasons=list(noise), measurement_stable=not noise,
                     memory_source=source or ("host_rss" if device == "cpu" else
                                              "torch_cuda_reserved"),
                     env={"device": device},
                     config={"loader": {"batch_size": batch, "num_workers": workers},
                             "precision": {"name": prec}, "memory": {"ceiling": ceiling},
                             "channels_last": channels_last, **more})


def row(rec: RunRecord, label="0", rung="run"):
    rec.rung = rung
    return recommend.Row(label, rec)


def rows_of(*recs, rung="run"):
    return [row(r, str(i), rung) for i, r in enumerate(recs)]


def xs(pts):
    return [p["x"] for p in pts]


def ys(pts):
    return [p["y"] for p in pts]


def test_curve_draws_loader_and_compute_of_the_same_best_runs():
    rows = rows_of(
        run(batch=16, e2e=100, loader=150, compute=110),
        run(batch=16, e2e=90, loader=999, compute=999),  # a slower repeat at 16: a lone point
        run(batch=32, e2e=130, loader=140, compute=200),
        run(batch=32, prec="amp_bf16", e2e=135, loader=141, compute=400),
        run(batch=64, prec="amp_bf16", e2e=139, loader=142, compute=700),
    )
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    bf16, fp32 = d["lines"]  # the fastest group first: it carries the bounds
    assert bf16["label"] == "precision=amp_bf16" and fp32["label"] == "precision=fp32"
    assert xs(fp32["points"]) == [16, 32] and ys(fp32["points"]) == [100, 130]
    assert ys(bf16["bounds"]["compute"]) == [400, 700] and ys(bf16["bounds"]["loader"]) == [141, 142]
    assert fp32["bounds"] == {}
    assert ys(d["rest"]) == [90]
    # the axis holds e2e and the loader-only and compute-only bounds: it names no one phase
    assert d["phase"] == "e2e" and d["ylabel"].startswith("images/sec (whiskers")
    assert d["xticks"] == [16, 32, 64]
    assert d["ymax"] > 700  # the tallest bound fits under the top
    assert not d["log_y"] and d["ymin"] == 0.0
    # with a recommendation, its group is the one with the bounds
    rec = recommend.Recommendation(best=rows[4], chosen=rows[0], reasons=[])
    first = curve_data(rows, "batch_size", "batch size", rec, log2=True)["lines"][0]
    assert first["label"] == "precision=fp32"
    assert ys(first["bounds"]["compute"]) == [110, 200]


def test_whiskers_are_the_rows_interval_and_each_bounds_phase_interval():
    rows = rows_of(run(batch=16, e2e=100, ci={"e2e": [90, 104], "loader": [140, 170],
                                                "compute": [100, 125]}),
                   run(batch=32, e2e=130, ci={"e2e": [125, 160]}))
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    (ln,) = d["lines"]
    assert [(p["lo"], p["hi"]) for p in ln["points"]] == [(90, 104), (125, 160)]
    assert [(p["lo"], p["hi"]) for p in ln["bounds"]["loader"]] == [(140, 170), (150, 150)]
    assert [(p["lo"], p["hi"]) for p in ln["bounds"]["compute"]] == [(100, 125), (120, 120)]
    assert "whiskers: 95% interval" in d["ylabel"]
    assert d["ymax"] >= 1.1 * 170  # the top whisker fits too
    p = pareto_data(rows)
    assert [(q["lo"], q["hi"]) for q in p["feasible"]] == [(90, 104), (125, 160)]
    # a confirmed row's whisker is the interval over its re-measurements (Row.interval)
    r = rows[1]
    r.confirms = [run(batch=32, e2e=v, ci={"e2e": [105, 165]}) for v in (110, 120, 140, 150, 160)]
    lo, hi = r.interval
    assert (lo, hi) != (125, 160)
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    assert (d["lines"][0]["points"][1]["lo"], d["lines"][0]["points"][1]["hi"]) == (lo, hi)
    # re-measurements that disagree (intervals with no common figure) flag the row
    r.confirms = [run(batch=32, e2e=v) for v in (60, 200)]
    assert flag_reasons(r) and "unconfirmed" in curve_data(
        rows, "batch_size", "batch size", log2=True)["flagged_label"]


def test_lines_join_only_runs_that_differ_in_the_plotted_knob():
    """Today's zig-zag: the best run per batch size came from other workers and channels_last."""
    auto = {"bench": {"cudnn_benchmark": None}}  # a record holds every key
    rows = rows_of(
        run(batch=16, workers=0, e2e=100, **auto), run(batch=32, workers=0, e2e=150, **auto),
        run(batch=16, workers=2, channels_last=True, e2e=160, **auto),
        run(batch=32, workers=2, channels_last=True, e2e=120, **auto),
        run(batch=16, workers=2, e2e=110, **auto),  # none at batch 32 so set: a lone point
        run(batch=32, workers=0, e2e=140, bench={"cudnn_benchmark": True}),  # measured knob
    )
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    by_label = {ln["label"]: ys(ln["points"]) for ln in d["lines"]}
    # labelled by what each line holds fixed: every other knob that varied, measured ones too,
    # as the ranking names them (config.knobs.knob_name: a key without a short name in full)
    assert by_label == {
        "bench.cudnn_benchmark=null, channels_last=false, num_workers=0": [100, 150],
        "bench.cudnn_benchmark=null, channels_last=true, num_workers=2": [160, 120]}
    assert sorted(ys(d["rest"])) == [110, 140]
    assert sum(bool(ln["bounds"]) for ln in d["lines"]) == 1  # one group carries the bounds
    assert "differ in batch size alone" in d["title"]


def test_flagged_runs_are_hollow_never_joined_never_a_bound_nor_the_scale():
    """A queue-timed loader run read 17,945 img/s among ~500: it must not read as data."""
    rows = rows_of(*(run(workers=w, e2e=None, compute=None, loader=v, device="cpu")
                     for w, v in ((0, 300.0), (1, 450.0), (2, 520.0))),
                   run(workers=8, e2e=None, compute=None, loader=17945.0, noise=[QUEUE],
                       device="cpu"))
    assert flag_reasons(rows[3]) == [QUEUE] and flag_reasons(rows[0]) == []
    d = curve_data(rows, "num_workers", "loader workers")
    (ln,) = d["lines"]
    assert xs(ln["points"]) == [0, 1, 2]
    assert d["flagged"][0]["y"] == 17945.0 and d["flagged"][0]["off_scale"]
    assert d["ymax"] < 1000 and not d["log_y"]
    assert "queue-timed" in d["flagged_label"] and "not a bound" in d["flagged_label"]
    assert d["xticks"] == [0, 1, 2, 8]  # still on the axis
    # in an e2e sweep the flagged run's loader figure is no bound either
    rows = rows_of(run(batch=16, loader=150), run(batch=32, loader=160),
                   run(batch=64, e2e=140, loader=99999, noise=[BUSY]))
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    assert xs(d["lines"][0]["bounds"]["loader"]) == [16, 32]
    assert "disturbed" in d["flagged_label"]
    assert not d["flagged"][0]["off_scale"]  # 140 is inside the scale: drawn where it is
    p = pareto_data(rows)
    # the two unflagged runs peak alike: no front, the fastest answers
    assert ys(p["front"]) == [] and ys(p["best"]) == [100] and ys(p["flagged"]) == [140]


def test_every_run_flagged_draws_no_line_and_no_front_and_says_why():
    rows = rows_of(*(run(batch=b, e2e=v, noise=[BUSY], device="cpu",
                         peak=p, ci={"e2e": [v / 2, 2 * v]})
                     for b, v, p in ((16, 40, 0.034), (32, 110, 0.074), (32, 75, 0.036))))
    rec = recommend.recommend(rows)
    d = curve_data(rows, "batch_size", "batch size", rec, log2=True)
    assert d["lines"] == [] and len(d["flagged"]) == 3
    assert d["title"].startswith("How does e2e throughput change with the batch size?\n")
    assert "no line: every full run flagged" in d["title"]
    # drawn with its point, which is moved aside from its neighbour, and labelled unconfirmed
    assert d["star"]["lone"] and d["star"]["flagged"]
    assert d["ymax"] >= 220  # with nothing else measured, the flagged runs set the scale
    p = pareto_data(rows, rec)
    assert p["front"] == [] and "\nno front: every full run flagged" in p["title"]
    # a ceiling (0.9) 12x the largest peak would squeeze the runs to the left edge: named only
    assert not p["ceiling_in_view"] and "memory.ceiling (90%)" in p["note"]


def test_pareto_legend_says_what_the_front_is_made_of():
    rows = rows_of(run(batch=16, e2e=100, peak=0.3), run(batch=32, e2e=120, peak=0.5),
                   run(batch=64, e2e=110, peak=0.6))
    p = pareto_data(rows)
    assert p["front_label"] == FRONT_LABEL
    assert "no other full run is both faster and smaller in peak memory" in FRONT_LABEL
    assert ys(p["front"]) == [100, 120]


def test_a_pareto_chart_draws_a_trade_off_only_where_there_is_one():
    # two runs alike in memory (4.99% and 5.04% of host RAM): no front through the noise
    alike = rows_of(run(batch=16, e2e=100, peak=0.0499, device="cpu"),
                    run(batch=32, e2e=120, peak=0.0504, device="cpu"))
    p = pareto_data(alike)
    assert p["front"] == [] and "no trade-off" in p["title"] and "4.99-5.04%" in p["title"]
    assert p["title"].startswith("How much peak memory does more speed cost?")
    assert [b["run"] for b in p["best"]] == ["1"]  # the answer, named as on disk
    # the fastest is also the smallest: one run, no line, no legend entry for one
    p = pareto_data(rows_of(run(batch=16, e2e=130, peak=0.3), run(batch=32, e2e=120, peak=0.6)))
    assert p["front"] == [] and "run 0 is both the fastest and the smallest" in p["title"]
    # a real trade-off: the front, its runs labelled
    p = pareto_data(rows_of(run(batch=16, e2e=100, peak=0.3), run(batch=32, e2e=120, peak=0.6)))
    assert [q["run"] for q in p["front"]] == ["0", "1"] and p["best"] == []


def test_zero_workers_join_every_line_of_their_setup():
    """README example 3: process and thread workers, and 0 workers, where the kind of worker
    (and prefetching) does nothing: the 0-worker run starts both lines, labelled by the
    workers' kind, not drawn apart as 'other settings'."""
    rows = rows_of(*(run(workers=w, e2e=None, compute=None, loader=100.0 * (w + 1) + k,
                         device="cpu", loader_more={"worker_type": kind})
                     for w in (1, 2) for k, kind in enumerate(("process", "thread"))),
                   run(workers=0, e2e=None, compute=None, loader=90.0, device="cpu"))
    for r in rows:
        r.record.config["loader"].update(r.record.config.pop("loader_more", {}))
        if r.knob("num_workers") == 0:  # as the run records it: inert without workers
            r.record.config["loader"].update(worker_type="process", prefetch_factor=None)
        else:
            r.record.config["loader"]["prefetch_factor"] = 2
        r.flat = {}
        r.__post_init__()
    d = curve_data(rows, "num_workers", "loader workers")
    assert {ln["label"]: xs(ln["points"]) for ln in d["lines"]} == {
        "worker_type=process": [0, 1, 2], "worker_type=thread": [0, 1, 2]}
    assert d["rest"] == []
    assert d["title"].startswith("How many loader workers does the data side need?")


def test_a_zero_worker_thread_run_is_a_second_run_of_the_zero_worker_setting(tmp_path):
    """`loader.worker_type=thread loader.num_workers=0` starts no thread: the main process loads,
    as with process workers, and it is recorded as process with 0 workers. Beside a process run
    of 0 workers it is the same setting run again: the slower of the two is drawn as that, not
    as 'other settings (no line: not comparable)'."""
    def loader_run(w, kind, ips):
        r = run(workers=w, e2e=None, compute=None, loader=ips, device="cpu")
        r.config["loader"].update(worker_type="process" if w == 0 else kind,
                                  prefetch_factor=None if w == 0 else 2)
        return r

    rows = rows_of(*(loader_run(w, kind, 100.0 * (w + 1) + k)
                     for w in (0, 1, 2) for k, kind in enumerate(("process", "thread"))))
    d = curve_data(rows, "num_workers", "loader workers")
    assert {ln["label"]: ys(ln["points"]) for ln in d["lines"]} == {
        "worker_type=process": [101, 200, 300], "worker_type=thread": [101, 201, 301]}
    assert [(p["x"], p["y"], p["apart"]) for p in d["rest"]] == [(0, 100, Apart.repeat)]
    legend = _legend_of(report_plots, d, tmp_path)
    assert any(x.startswith("loader, the settings of a line's point again:\na slower run (a "
                            "line takes the fastest)") for x in legend), legend
    assert not any("not comparable" in x for x in legend), legend


def test_a_run_on_no_line_says_why_in_its_legend_entry(tmp_path):
    # batch 16 alone at 4 workers; at 0 workers one line per precision, more than MAX_LINES
    rows = rows_of(run(batch=16, workers=4, e2e=90.0),
                   *(run(batch=b, workers=0, e2e=100.0 + i + b, prec=f"p{i}")
                     for i in range(MAX_LINES + 1) for b in (32, 64)))
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    assert len(d["lines"]) == MAX_LINES
    assert sorted((p["apart"].name, p["x"]) for p in d["rest"]) == [
        ("alone", 16), ("beyond", 32), ("beyond", 64)]
    legend = _legend_of(report_plots, d, tmp_path)
    for entry in ("e2e, other settings (no line: no run\ndiffers from it in batch size alone)",
                  f"e2e, other settings (no line: at most\n{MAX_LINES} lines are drawn)"):
        assert any(x.startswith(entry) for x in legend), legend


def _legend_of(plots, d, tmp_path) -> list[str]:
    """A curve picture's legend entries (drawn again, kept open to read them)."""
    import matplotlib.pyplot as plt

    close = plt.close
    figs = []
    plt.close = lambda fig=None: figs.append(fig)
    try:
        plots._draw_curve(d, tmp_path / "legend.png")
    finally:
        plt.close = close
    return [t.get_text() for t in figs[0].axes[0].get_legend().get_texts()]


def test_cpu_memory_says_summed_rss_not_device_memory():
    rows = rows_of(run(batch=16, device="cpu"), run(batch=32, device="cpu", peak=0.6))
    m = memory_data(rows)
    assert "RSS" in m["ylabel"] and "summed" in m["ylabel"] and "host RAM" in m["ylabel"]
    assert "upper bound" in m["note"] and "device" not in m["ylabel"]
    assert "RSS" in pareto_data(rows)["xlabel"]
    gpu = memory_data(rows_of(run(batch=16), run(batch=32, peak=0.6)))
    assert gpu["ylabel"] == "peak memory, % of the device" and gpu["note"] is None


def test_importance_needs_enough_trials_and_knobs_that_act_on_the_device():
    trials = [{"loader.batch_size": b, "loader.pin_memory": p, "bench.cudnn_benchmark": c,
               "precision": prec, "channels_last": cl}
              for b, p, c, prec, cl in ((16, True, False, "fp32", False),
                                        (32, False, True, "tf32", True)) * 4]
    assert len(trials) == MIN_IMPORTANCE_TRIALS >= 8
    used, why = importance_params(trials[:-1], {"cpu"})
    assert used == [] and "7 complete trials, 8 needed" == why
    used, why = importance_params(trials, {"cpu"})
    # pinning and cuDNN do nothing on a CPU; fp32 and tf32 run the same math there
    assert why is None and used == ["channels_last", "loader.batch_size"]
    assert importance_params(trials, {"cuda"})[0] == [
        "bench.cudnn_benchmark", "channels_last", "loader.batch_size", "loader.pin_memory",
        "precision"]
    bf16 = [{**t, "precision": "amp_bf16"} if i % 2 else t for i, t in enumerate(trials)]
    assert "precision" in importance_params(bf16, {"cpu"})[0]  # bf16 autocast acts on a CPU
    only_inert = [{"loader.pin_memory": i % 2 == 0, "loader.batch_size": 16 * (1 + i % 2)}
                  for i in range(8)]
    assert importance_params(only_inert, {"cuda"})[0] == ["loader.batch_size", "loader.pin_memory"]
    # on a CPU one knob is left, and one knob alone always gets all the importance
    assert importance_params(only_inert, {"cpu"}) == ([], "1 parameter varied and can act "
                                                      "on this device, 2 needed")
    title = importance_title(8, used, sorted(trials[0]), inert_knobs(trials, {"cpu"}))
    assert title == ("Which knobs moved e2e throughput most?\nfrom the study's 8 complete "
                     "trials; left out, no effect on a CPU: bench.cudnn_benchmark, "
                     "loader.pin_memory, precision")
    # a resumed study of disturbed runs: its count is said against the ranking's, and their
    # noise is ranked too
    assert ("from the study's 9 complete trials (the ranking holds 6 runs), 6 of them flagged "
            "their own measurement") in importance_title(9, used, sorted(trials[0]), flagged=6,
                                                         ranked=6)


def _study(n):
    study = optuna.create_study(direction="maximize")
    dists = {"loader.batch_size": optuna.distributions.CategoricalDistribution([16, 32]),
             "loader.num_workers": optuna.distributions.CategoricalDistribution([0, 2]),
             "loader.pin_memory": optuna.distributions.CategoricalDistribution([True, False])}
    for i in range(n):
        params = {"loader.batch_size": (16, 32)[i % 2], "loader.pin_memory": i % 3 == 0,
                  "loader.num_workers": (0, 2)[i // 2 % 2]}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists,
                                                  value=100.0 + 10 * (i % 2) + i))
    return study


def test_importance_png_only_with_enough_trials(tmp_path):
    rows = rows_of(run(device="cpu"))
    assert report_plots.importance(_study(7), tmp_path / "a.png", rows) is None
    made = report_plots.importance(_study(8), tmp_path / "b.png", rows)
    assert made is not None and made.is_file()


def test_importance_counts_each_configuration_once_and_ranks_no_inert_knob(tmp_path):
    """A search's duplicates (copied values) made 11 "complete trials" of 8 runs, and
    persistent_workers, which never acts with thread workers, got the top bar."""
    study = _study(7)
    for t in study.trials[:3]:  # the sampler proposed them again: copied, never run
        study.add_trial(optuna.trial.create_trial(
            params=t.params, distributions=t.distributions, value=t.value,
            user_attrs={"duplicate_of": t.number}))
    rows = rows_of(run(device="cpu"))
    assert report_plots.importance(study, tmp_path / "a.png", rows) is None  # 7 runs, not 10
    # a key that acts in none of the runs: left out like a CUDA-only one on a CPU
    thread = rows_of(run(device="cuda"))
    thread[0].record.config["loader"]["worker_type"] = "thread"
    thread[0].flat["loader.worker_type"] = "thread"
    params = [{"loader.persistent_workers": i % 2 == 0, "loader.batch_size": 16 * (1 + i % 3)}
              for i in range(8)]
    assert plot_rules.inert_knobs(params, {"cuda"}, thread) == ["loader.persistent_workers"]
    assert plot_rules.inert_knobs(params, {"cuda"}, rows_of(run(device="cuda"))) == []


def test_bounds_far_above_e2e_switch_to_a_log_axis():
    rows = rows_of(run(batch=2, e2e=20, loader=4700, compute=300),
                   run(batch=4, e2e=25, loader=6000, compute=30))
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    assert d["log_y"] and "log scale" in d["ylabel"]
    assert 0 < d["ymin"] < 20 and d["ymax"] > 6000


def test_loader_only_sweep_says_loader_with_integer_worker_ticks():
    rows = rows_of(*(run(workers=w, e2e=None, compute=None, loader=50.0 * (w + 1))
                     for w in (0, 1, 2)))
    assert headline_phase(rows) == "loader"
    d = curve_data(rows, "num_workers", "loader workers")
    assert d["ylabel"].startswith("loader images/sec")
    assert all(ln["bounds"] == {} for ln in d["lines"])  # no other pipe measured
    assert d["xticks"] == [0, 1, 2] and d["integer_x"]
    assert ys(d["lines"][0]["points"]) == [50.0, 100.0, 150.0]


def test_plots_only_for_knobs_that_varied():
    rows = rows_of(run(workers=0), run(workers=2, e2e=120))
    assert curve_data(rows, "batch_size", "batch size", log2=True) is None
    assert memory_data(rows) is None  # the batch size never changed
    assert curve_data(rows, "num_workers", "loader workers") is not None
    # a knob that varied only among infeasible runs has no curve either
    rows = rows_of(run(batch=16), run(batch=32, status=Status.oom, e2e=None))
    assert curve_data(rows, "batch_size", "batch size", log2=True) is None
    assert memory_data(rows)["oom"] == {"xs": [32], "ys": [100.0]}


def test_screens_and_probes_are_apart_from_full_measurements():
    full = rows_of(run(batch=16, e2e=100, peak=0.3), run(batch=32, e2e=120, peak=0.5))
    short = [row(run(batch=64, e2e=500, peak=0.4), "s", "screen"),
             row(run(batch=128, e2e=50, peak=0.6), "p", "probe")]
    rows = full + short
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    assert xs(d["lines"][0]["points"]) == [16, 32]
    assert (xs(d["short"]), ys(d["short"])) == ([64, 128], [500, 50])
    assert d["xticks"] == [16, 32, 64, 128]
    p = pareto_data(rows)
    assert ys(p["front"]) == [100, 120]  # the screen's 500 img/s is no front point
    assert ys(p["short"]) == [500, 50]
    assert sorted(ys(p["feasible"])) == [100, 120]
    m = memory_data(rows)
    assert m["short"]["xs"] == [64, 128] and sorted(m["groups"]["fp32"]["xs"]) == [16, 32]


def test_star_and_top_point_fit_under_the_axis_top():
    rows = rows_of(run(batch=16, e2e=100, peak=0.3, loader=None, compute=None),
                   run(batch=32, e2e=101, peak=0.5, loader=None, compute=None))
    rec = recommend.recommend(rows)
    d = curve_data(rows, "batch_size", "batch size", rec, log2=True)
    assert d["star"] == {"x": 16, "y": 100, "lone": False, "flagged": False}
    assert d["ymax"] >= 1.1 * 101
    p = pareto_data(rows, rec)
    assert p["star"] == {"x": 30.0, "y": 100, "lone": False, "flagged": False} and p["ymax"] >= 1.1 * 101


def test_a_flagged_run_under_a_log_axis_floor_is_drawn_at_the_floor(tmp_path):
    rows = rows_of(run(batch=64, e2e=300, loader=8000), run(batch=128, e2e=350, loader=8100),
                   run(batch=256, e2e=5, noise=[BUSY]))
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    assert d["log_y"] and d["ymin"] > 5 and d["flagged"][0]["off_scale"] == "below"
    drawn = report_plots._draw_curve(d, tmp_path / "t.png")
    texts = [t.get_text() for t in _texts_of(report_plots, d, tmp_path)]
    assert drawn.exists() and any("5\noff scale" in t for t in texts), texts


def _texts_of(plots, d, tmp_path):
    """The annotations a curve picture holds (drawn again, kept open to read them)."""
    import matplotlib.pyplot as plt

    close = plt.close
    figs = []
    plt.close = lambda fig=None: figs.append(fig)  # keep the figure for reading
    try:
        plots._draw_curve(d, tmp_path / "again.png")
    finally:
        plt.close = close
    return [t for ax in figs[0].axes for t in ax.texts]


def test_png_files_with_few_trials(tmp_path):
    rows = rows_of(run(batch=16, e2e=100, peak=0.3), run(batch=32, e2e=120, peak=0.6),
                   run(batch=48, e2e=125, peak=0.95, status=Status.over_ceiling),
                   run(batch=64, e2e=None, status=Status.oom, peak=None))
    rows.append(row(run(batch=8, e2e=60, peak=0.2), "s", "screen"))
    made = report_plots.plot_all(rows, tmp_path, recommend.recommend(rows))
    assert {p.name for p in made} == {"throughput_vs_batch.png", "memory_vs_batch.png",
                                      "pareto.png"}
    from matplotlib import image

    for p in made:
        h, w = image.imread(p).shape[:2]
        assert w > 1.5 * h  # the legend got its own room right of the axes


def _sweep_dir(tmp_path, n=2):
    for i in range(n):
        d = tmp_path / str(i)
        d.mkdir(parents=True)
        r = run(batch=16 * (i + 1), e2e=100.0 + i)
        r.dir = d
        r.save()
    return tmp_path


# a --where condition is part of what the report was made from: it must read back as written
@pytest.mark.parametrize("where", [[], ["--where", "loader.num_workers=2"]])
def test_report_prints_its_summary_also_when_up_to_date(tmp_path, capsys, where):
    sweep = _sweep_dir(tmp_path / "sweep")
    assert report_cli.main([str(sweep), *where]) == 0
    first = capsys.readouterr().out
    assert "recommended:" in first
    # a report of part of the runs goes beside the whole one's, never over it
    report = sweep / ("report" + "".join(f"-{w}" for w in where[1:]))
    mtime = (report / "summary.json").stat().st_mtime_ns
    assert report_cli.main([str(sweep), *where]) == 0
    second = capsys.readouterr().out
    assert (report / "summary.json").stat().st_mtime_ns == mtime  # cached
    assert "recommended:" in second and "up to date" in second
    assert "101.0" in second  # the ranking table too
    assert json.loads((report / "summary.json").read_text())["lines"]
    assert (sweep / "report").is_dir() is not bool(where)


def test_a_report_written_elsewhere_is_the_sweeps_own_report(tmp_path, capsys):
    sweep = _sweep_dir(tmp_path / "sweep")
    (sweep / "pipes.json").write_text(json.dumps({"wall_s": {"compute": 3.0}}))
    assert report_cli.main([str(sweep)]) == 0
    assert report_cli.main([str(sweep), "--out", str(tmp_path / "elsewhere")]) == 0
    own, there = (json.loads((d / "summary.json").read_text().replace(str(d), "OUT"))
                  for d in (sweep / "report", tmp_path / "elsewhere"))
    assert there["lines"] == own["lines"] and there["table"] == own["table"]
    assert "  time: compute 3 s" in there["lines"]  # the pipes path, read for --out too
    assert sorted(Path(f).name for f in there["files"]) == sorted(
        Path(f).name for f in own["files"])


@pytest.mark.parametrize("layout", ["empty", "running_only"])
def test_nothing_to_report_is_one_line_and_nonzero(tmp_path, capsys, layout):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    if layout == "running_only":
        r = run()
        r.status, r.dir = Status.running, sweep / "0"
        r.dir.mkdir()
        r.save()
    assert report_cli.main([str(sweep)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing to report" in err and str(sweep) in err
    assert not (sweep / "report").exists()


def test_lines_are_ordered_fastest_group_first():
    recs = [run(batch=16, e2e=100, peak=0.3), run(batch=32, e2e=120, peak=0.6),
            run(batch=64, e2e=None, status=Status.oom, peak=None),
            run(batch=32, prec="amp_bf16", e2e=150, peak=0.5)]
    lines = curve_data(rows_of(*recs), "batch_size", "batch size")["lines"]
    assert [xs(ln["points"]) for ln in lines] == [[32], [16, 32]]


def test_pipes_pictures_name_memory_as_the_others_and_keep_one_point_a_setting_readable(
        tmp_path):
    """sweep=pipes on a CPU: compute_pipe.png names memory as % of host RAM, as every other
    picture does; a data walk that stopped at its first setting left one point per kept
    compute setting, drawn as columns of one picture rather than a panel per point."""
    from gpubench.report.plot_data import compute_data, data_panels

    def stage(trial, rec, label):  # as search.rows reads a pipes study's trial
        r = row(rec, label)
        r.trial, r.stage = trial, trial.rsplit("-", 1)[0]
        return r

    rows = [stage(f"compute-{i}", run(batch=b, e2e=None, loader=None, compute=c, device="cpu",
                                      peak=0.05, ci={"compute": [0.9 * c, 1.1 * c]}), str(i))
            for i, (b, c) in enumerate(((16, 480.0), (32, 730.0), (64, 770.0)))]
    result = {"compute": {"kept": [{"params": {"loader.batch_size": b}, "rate": [c, lo, hi]}
                                   for b, c, lo, hi in ((64, 770, 693, 847), (32, 730, 657, 803))]},
              "data": []}
    for k, (b, ips) in enumerate(((64, 8168.0), (32, 7919.0))):
        result["data"].append({"for": {"loader.batch_size": b}, "study": f"s-data-{k}",
                               "params": {"loader.num_workers": 0}, "clears": True})
        rows.append(stage(f"data-{k}-0", run(batch=b, workers=0, e2e=None, compute=None,
                                             loader=ips, device="cpu",
                                             ci={"loader": [0.9 * ips, 1.1 * ips]}), str(3 + k)))
    for r in rows:  # a compute run of 3 windows, a loader run of 6 (their own intervals)
        for ph in r.record.phases.values():
            ph.images_per_sec_ci_coverage = 0.75 if ph.phase == "compute" else 0.96875
    c = compute_data(rows, result)
    assert c["memory_label"].endswith("% of host RAM")
    assert c["ylabel"] == "compute-only images/sec (whiskers: 75% interval)"
    assert {p["ylabel"] for p in data_panels(rows, result)} == {
        "loader-only images/sec (whiskers: 95% interval)"}  # 6 windows: named CONFIDENCE
    assert sum(q["kept"] for pts in c["series"].values() for q in pts) == 2
    panels = data_panels(rows, result)
    assert [sum(len(v) for v in p["series"].values()) for p in panels] == [1, 1]
    # a study named like a stage (`imagenet-data-v2`) still finds its data trials (before: its
    # data panels were none and data_pipe.png was not drawn)
    named = [{**d, "study": f"imagenet-data-v2-data-{k}"} for k, d in enumerate(result["data"])]
    assert data_panels(rows, {**result, "data": named}) == panels
    made = report_plots.plot_pipes(rows, result, tmp_path, 0.05)
    assert {p.name for p in made} == {"compute_pipe.png", "data_pipe.png"}


def test_each_compute_band_sits_over_its_own_column(monkeypatch, tmp_path):
    """data_pipe.png: the band of kept setting i spans i - 0.42 to i + 0.42 on the x-axis,
    whatever the number of columns (a band given in axes fractions of another width drifts
    off its column, and past the axes' edge)."""
    drawn = {}
    monkeypatch.setattr(report_plots, "save",
                        lambda fig, path, *a, **k: drawn.update(ax=fig.axes[0]))
    for n in (1, 3):
        panels = [{"bound": (100.0, 90.0, 110.0), "series": {}, "clears": False,
                   "title": f"batch {i}", "ylabel": "loader-only images/sec"}
                  for i in range(n)]
        report_plots._draw_data(panels, 0.05, tmp_path / "data_pipe.png", True)
        ax = drawn["ax"]
        left, right = ax.get_xlim()
        # axhspan's rectangles: x in axes fractions, read back as data coordinates
        spans = sorted((round(left + r.get_x() * (right - left), 6),
                        round(left + (r.get_x() + r.get_width()) * (right - left), 6))
                       for r in ax.patches)
        assert spans == [(round(i - 0.42, 6), round(i + 0.42, 6)) for i in range(n)], spans


def test_memory_series_split_by_every_knob_that_acts_on_the_memory_read():
    """Issue 28, finding 1: the memory plot split its series by precision alone, so an sgd and
    an adamw sweep (two more optimizer states per weight) shared one. Device memory: the compute
    knobs, not the loader's workers; host RSS (a CPU run): the workers too."""
    def r(batch, optimizer, **kw):
        rec = run(batch=batch, **kw)
        rec.config["bench"] = {"optimizer": optimizer}
        return rec

    rows = rows_of(r(16, "sgd"), r(32, "sgd", peak=0.6), r(16, "adamw", peak=0.7),
                   r(32, "adamw", peak=0.9), r(16, "sgd", workers=4))
    assert memory_data(rows)["groups"] == {  # the precision, which did not vary, unsaid
        "optimizer=adamw": {"xs": [16, 32], "ys": [70.0, 90.0]},
        "optimizer=sgd": {"xs": [16, 32, 16], "ys": [50.0, 60.0, 50.0]}}
    assert set(memory_data(rows + rows_of(r(16, "sgd", prec="amp_bf16")))["groups"]) == {
        "fp32, optimizer=adamw", "fp32, optimizer=sgd", "amp_bf16, optimizer=sgd"}
    cpu = rows_of(r(16, "sgd", device="cpu"), r(32, "sgd", peak=0.6, device="cpu"),
                  r(16, "sgd", workers=4, device="cpu"))
    assert set(memory_data(cpu)["groups"]) == {"num_workers=2", "num_workers=4"}
    # 0 workers against 1: the worker-only knobs, inert at 0, set nothing apart (the legend
    # read `prefetch_factor=null, persistent_workers=null`, values no run had)
    def loader(batch, workers, peak):
        rec = run(batch=batch, workers=workers, peak=peak, device="cpu")
        rec.config["loader"].update(prefetch_factor=2 if workers else None,
                                    persistent_workers=bool(workers), worker_type="process")
        return rec

    both = rows_of(*(loader(b, w, 0.1 * (1 + w) + b / 1000) for b in (8, 16) for w in (0, 1)))
    assert set(memory_data(both)["groups"]) == {"num_workers=0", "num_workers=1"}


def _drawn(draw, d, tmp_path):
    """The axes a picture was drawn on (drawn again, its PNG written, kept open to read)."""
    import matplotlib.pyplot as plt

    close = plt.close
    figs = []
    plt.close = lambda fig=None: figs.append(fig)  # keep the figure for reading
    try:
        draw(d, tmp_path / "again.png")
    finally:
        plt.close = close
    return figs[0].axes[0]


def _red_markers(ax) -> list[tuple[float, float]]:
    """Where the hollow red (flagged) markers are drawn, read back in data coordinates."""
    back = ax.transData.inverted()
    return sorted(tuple(back.transform(ln.get_transform().transform(ln.get_xydata()))[0])
                  for ln in ax.lines if ln.get_markeredgecolor() == "tab:red"
                  and ln.get_markerfacecolor() == "none")


def test_near_equal_flagged_peaks_are_drawn_at_the_peaks_they_measured(tmp_path):
    """pareto.png: two flagged runs a hair apart in peak memory were moved sideways, 12 points
    apart: each drawn at a memory it did not use. On the continuous memory axis the points stay
    at their peaks and only their labels stand side by side; on the batch-size axis (a few
    values) runs at one size still stand side by side, around their tick."""
    rows = rows_of(run(batch=16, e2e=100, peak=0.3), run(batch=64, e2e=140, peak=0.9),
                   run(batch=32, e2e=120, peak=0.600, noise=[BUSY]),
                   run(batch=32, e2e=121, peak=0.605, noise=[BUSY]))
    p = pareto_data(rows)
    assert sorted(xs(p["flagged"])) == [60.0, 60.5]
    ax = _drawn(report_plots._draw_pareto, p, tmp_path)
    assert [pytest.approx(xy) for xy in _red_markers(ax)] == [(60.0, 120), (60.5, 121)]
    labels = {t.get_text(): t for t in ax.texts if t.get_text() in ("2", "3")}
    left, right = (labels[n].get_window_extent(ax.figure.canvas.get_renderer())
                   for n in ("2", "3"))
    assert left.x1 <= right.x0 or right.x1 <= left.x0  # the labels still read apart
    # the batch axis: the two flagged runs at 32 side by side, one each side of the tick
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    (a, _), (b, _) = _red_markers(_drawn(report_plots._draw_curve, d, tmp_path))
    assert a < 32 < b and a * b == pytest.approx(32 * 32)


def test_a_flagged_runs_label_stands_above_its_whisker(tmp_path):
    """throughput_vs_workers.png: a run's number sat 11 points over its marker, where its own
    whisker crossed it (`2` read as `:2`); it stands above the whisker's cap."""
    rows = rows_of(*(run(batch=16, workers=w, e2e=v, noise=[BUSY],
                         ci={"e2e": [v - 400, v + 400]}) for w, v in ((1, 600), (2, 540))))
    ax = _drawn(report_plots._draw_curve, curve_data(rows, "num_workers", "loader workers"),
                tmp_path)
    renderer = ax.figure.canvas.get_renderer()
    labels = {t.get_text(): t for t in ax.texts if t.get_text() in ("0", "1")}
    for name, hi in (("0", 1000), ("1", 940)):
        cap = ax.transData.transform((0, hi))[1]
        assert labels[name].get_window_extent(renderer).y0 >= cap, name


def test_runs_moved_aside_past_the_last_tick_stay_inside_the_axes(tmp_path):
    """throughput_vs_workers.png: two slower repeats and two flagged runs at the most workers
    stand right of that tick, 12 points apart; the axis ended 8% of its span past the tick and
    the flagged runs were drawn past it (cut off). The limits now hold every point drawn."""
    def loader(w, v, noise=()):
        return run(workers=w, e2e=None, compute=None, loader=v, device="cpu", noise=noise,
                   ci={"loader": [0.95 * v, 1.05 * v]})

    rows = rows_of(*(loader(w, v) for w, v in ((0, 300.0), (1, 450.0), (2, 520.0), (4, 540.0),
                                               (4, 530.0), (4, 525.0))),
                   loader(4, 600.0, [BUSY]), loader(4, 610.0, [BUSY]))
    d = curve_data(rows, "num_workers", "loader workers")
    assert len(d["rest"]) == 2 and not any(p["off_scale"] for p in d["flagged"])
    ax = _drawn(report_plots._draw_curve, d, tmp_path)
    lo, hi = ax.get_xlim()
    red = _red_markers(ax)
    assert len(red) == 2 and all(lo < x < hi for x, _ in red), (red, hi)
    # each whole marker inside: its edge, 4 points past its centre, left of the axes' edge
    right = ax.transData.transform((hi, 0.0))[0]
    edge = ax.transData.transform((max(x for x, _ in red), 0.0))[0] + 4 * ax.figure.dpi / 72
    assert edge <= right
    assert lo == pytest.approx(-0.32)  # the left end, where nothing is moved, as before


def test_a_loader_only_sweep_draws_no_pareto_and_names_its_runs_as_loader_runs():
    """A loader-only sweep wrote pareto.png (docs/report.md: two or more full training
    measurements) titled `every full run flagged`: its runs trained nothing."""
    def loader(workers, ips):
        rec = run(workers=workers, e2e=None, compute=None, loader=ips, noise=[BUSY],
                  bench={"phases": ["loader"]})
        rec.phases["loader"].windows = [{}] * 6  # a full run of its plan
        return rec

    rows = rows_of(loader(0, 2700.0), loader(1, 2100.0))
    assert pareto_data(rows) is None
    assert plot_rules.all_flagged(rows).startswith("every loader-only run flagged")
    full = rows_of(run(batch=16, e2e=100, noise=[BUSY]), run(batch=32, e2e=120, noise=[BUSY]))
    assert plot_rules.all_flagged(full).startswith("every full run flagged")
    assert pareto_data(full) is not None


def test_flaws_are_named_in_one_order_in_the_legend_and_the_workers_answer():
    """The legend sorted the words, the workers answer kept their first appearance: one setup's
    flaws read in two orders."""
    from gpubench.analysis.labels import flaw_words
    from gpubench.report.loader_answer import _kinds

    reasons = [Reason(Flaw.queue, "q"), Reason(Flaw.cut_short, "c"), Reason(Flaw.disturbed, "d")]
    words = flaw_words(r.kind for r in reasons)
    assert words != sorted(words)  # Flaw's order, which an alphabetical one would not keep
    legend = plot_rules.flagged_label([row(run(noise=reasons))])
    assert legend == f"flagged run ({', '.join(words)}): not joined, not a bound"
    assert _kinds(reasons) == ", ".join(words)
