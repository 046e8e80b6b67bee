"""The per-run picture: what it draws (bars, intervals, bound, title, traces), read from the data
that draws it; one real PNG written and checked to be an image of the expected size."""

from __future__ import annotations

import pytest

from gpubench.core.record import PhaseRecord, RunRecord, Status, load
from gpubench.report.runplot import PICTURE_FILE, plot_run, run_picture_data


def make_record(tmp_path=None, loader=120.0, compute=300.0, e2e=110.0, ci=True, bound=None,
                bottleneck="data", margin=0.6, stable=True, noise=(), status=Status.ok,
                batch=16, warmup=(0.5, 0.3), steps=(0.14, 0.15, 0.13)) -> RunRecord:
    phases, series = {}, {}
    for name, v in (("loader", loader), ("compute", compute), ("e2e", e2e)):
        if v is None:
            continue
        phases[name] = PhaseRecord(name, batch, images_per_sec=v,
                                   images_per_sec_ci=[0.9 * v, 1.05 * v] if ci else None)
        series[name] = {"warmup_step_times_s": list(warmup), "step_times_s": list(steps)}
    extra = {} if bound is None else {"e2e_bound_images_per_sec": bound}
    r = RunRecord(status=status, images_per_sec=e2e, loader_images_per_sec=loader,
                  compute_images_per_sec=compute, bottleneck=bottleneck, verdict_margin=margin,
                  measurement_stable=stable, noise_reasons=list(noise), phases=phases,
                  series=series, extra=extra,
                  config={"loader": {"batch_size": batch, "num_workers": 2},
                          "model": {"name": "resnet18"}, "dataset": {"name": "synthetic"},
                          "precision": {"name": "fp32"}},
                  env={"device_name": "NVIDIA T4"}, dir=tmp_path)
    return r


def test_bars_carry_each_phase_and_its_interval_in_pipe_order():
    d = run_picture_data(make_record(bound=118.0))
    assert [b["phase"] for b in d["bars"]] == ["loader", "compute", "e2e"]
    assert [b["images_per_sec"] for b in d["bars"]] == [120.0, 300.0, 110.0]
    assert d["bars"][1]["ci"] == pytest.approx([270.0, 315.0])
    assert d["bound"]["images_per_sec"] == 118.0


def test_no_interval_and_no_bound_when_the_record_has_none():
    d = run_picture_data(make_record(ci=False))
    assert all(b["ci"] is None for b in d["bars"]) and not d["intervals"]
    assert d["bound"] is None


def test_missing_phase_is_not_drawn_and_old_records_fall_back_to_headline_keys():
    d = run_picture_data(make_record(compute=None))
    assert [b["phase"] for b in d["bars"]] == ["loader", "e2e"]
    old = RunRecord(status=Status.ok, images_per_sec=50.0, loader_images_per_sec=80.0,
                    compute_images_per_sec=None, images_per_sec_ci=[45.0, 55.0])
    d = run_picture_data(old)
    assert [(b["phase"], b["images_per_sec"], b["ci"]) for b in d["bars"]] == [
        ("loader", 80.0, None), ("e2e", 50.0, [45.0, 55.0])]
    assert d["traces"] == {}


def test_title_asks_its_question_and_answers_in_words_with_every_reason_listed():
    from gpubench.core.record import Flaw, Reason

    t = run_picture_data(make_record(margin=0.62))["title"]
    assert t.startswith("Which pipe limits training? the data side") and "threshold" not in t
    reasons = [Reason(Flaw.queue, "loader: windows 1, 2 timed the queue"),
               Reason(Flaw.disturbed, "compute step times vary"),
               Reason(Flaw.disturbed, "other processes used CPU"),
               Reason(Flaw.too_short, "e2e: 1 of 12 steps took over 3x the median")]
    d = run_picture_data(make_record(bottleneck="inconclusive", margin=None, stable=False,
                                     noise=reasons))
    assert "inconclusive" in d["title"] and "4 reasons, listed below" in d["title"]
    assert "results.json" not in d["title"]
    # the title counts them; every one is drawn under the picture
    assert [r.splitlines()[0] for r in d["reasons"]] == [f"- {r.text}" for r in reasons]
    assert d["flagged"]
    assert not run_picture_data(make_record())["reasons"]
    # a reason past two lines under the picture is cut there, and says so
    long = run_picture_data(make_record(stable=False, noise=[Reason(Flaw.disturbed, "x " * 200)]))
    [cut] = long["reasons"]
    assert len(cut.splitlines()) == 2 and cut.endswith("...")
    t = run_picture_data(make_record(status=Status.over_ceiling, bottleneck="compute"))["title"]
    assert t.startswith("[over_ceiling] Which pipe limits training? compute")


def test_a_hundredfold_span_turns_the_axis_logarithmic():
    # a loader at 9,300 img/s beside compute at 30: on a linear axis compute and e2e are slivers
    assert run_picture_data(make_record(loader=9300.0, compute=29.8, e2e=28.0))["log_x"]
    assert not run_picture_data(make_record(loader=120.0, compute=150.0, e2e=110.0))["log_x"]


def test_traces_are_step_times_with_warmup_apart():
    d = run_picture_data(make_record(warmup=(0.5, 0.0), steps=(0.2, 0.25)))
    tr = d["traces"]["e2e"]
    assert tr["warmup_ms"] == [pytest.approx(500.0), None]  # an unresolved (0 s) step
    assert tr["steps_ms"] == [pytest.approx(200.0), pytest.approx(250.0)]
    assert set(d["traces"]) == {"loader", "compute", "e2e"}
    assert not d["trace_log_y"]
    # a first step 100x the others (compile, autotune) switches to a log axis
    assert run_picture_data(make_record(warmup=(10.0, 0.1), steps=(0.1, 0.1)))["trace_log_y"]


def test_plot_run_writes_run_png_beside_results(tmp_path):
    r = make_record(tmp_path, bound=118.0, stable=False, noise=["step times spread 0.5"])
    r.save()
    back = load(tmp_path)  # through results.json, as the runner and the report read it
    path = plot_run(back, tmp_path)
    assert path == tmp_path / PICTURE_FILE
    from matplotlib import image

    img = image.imread(path)
    assert img.shape[0] > 600 and img.shape[1] > 600
    # a record with nothing measured still draws (a failed run): no exception, a file
    failed = RunRecord(status=Status.failed, error="boom")
    assert plot_run(failed, tmp_path / "failed.png").is_file()


def test_each_phase_is_shaded_to_its_own_warm_up():
    """The loader warmed up 25 steps, compute and e2e 9: the one grey span to the longest made
    16 of their measured steps read as warm-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpubench.report.runplot import _draw_traces

    traces = {"loader": {"warmup_ms": [1.0] * 25, "steps_ms": [1.0] * 30},
              "compute": {"warmup_ms": [9.0] * 9, "steps_ms": [9.0] * 30}}
    fig, ax = plt.subplots()
    _draw_traces(ax, {"traces": traces, "trace_log_y": False})
    ends = sorted(ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":"
                  and len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == ln.get_xdata()[1])
    assert ends == [8.5, 24.5] and not ax.patches  # no span over measured steps
    measured = {ln.get_label(): ln.get_xdata()[0] for ln in ax.get_lines()
                if ln.get_linestyle() == "-"}
    assert sorted(measured.values()) == [9, 25]
    plt.close(fig)


def test_each_whisker_is_named_by_its_own_phases_coverage():
    """loader and compute with 3 windows (75%), e2e with 2 (50%): the axis said `whiskers: 50%
    interval` over the 75% whiskers too; each pipe's coverage now stands under its name, and one
    shared by every pipe is said once, on the axis."""
    rec = make_record()
    for name, c in (("loader", 0.75), ("compute", 0.75), ("e2e", 0.5)):
        rec.phases[name].images_per_sec_ci_coverage = c
    d = run_picture_data(rec)
    assert [b["coverage"] for b in d["bars"]] == [0.75, 0.75, 0.5]
    assert d["per_phase"] and d["interval_label"] == "50-75% interval"
    rec.phases["e2e"].images_per_sec_ci_coverage = 0.75
    d = run_picture_data(rec)
    assert not d["per_phase"] and d["interval_label"] == "75% interval"


@pytest.mark.parametrize("figures", [(900.0, 30000.0, 850.0), (3324.0, 3114.0, 600.0),
                                     (1000.0, 2500.0, 700.0), (95.0, 9000.0, 90.0)])
def test_no_two_labels_of_a_log_axis_meet(tmp_path, monkeypatch, figures):
    """1-2-5 steps over two decades on run.png's narrow throughput axis wrote `5,000` and
    `10,000` into one another (`5,00010,000`): the steps thin until every label stands apart,
    as drawn after the layout (plots._FittedLog)."""
    from gpubench.report import runplot

    drawn = []

    def save(fig, path, dpi):
        drawn.append(fig)
        return path

    monkeypatch.setattr(runplot, "save", save)
    loader, compute, e2e = figures
    plot_run(make_record(loader=loader, compute=compute, e2e=e2e, warmup=(2.5, 0.3),
                         steps=(0.01, 0.011, 0.0105)), tmp_path)
    fig = drawn[0]
    fig.tight_layout()  # as plots.save lays it out
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax, which in ((fig.axes[0], "x"), (fig.axes[1], "y")):
        axis = getattr(ax, f"{which}axis")
        assert axis.get_scale() == "log"
        lo, hi = sorted(getattr(ax, f"get_{which}lim")())
        labels = [t for t, v in zip(axis.get_ticklabels(), axis.get_ticklocs(), strict=True)
                  if lo <= v <= hi and t.get_text()]
        boxes = sorted((t.get_window_extent(renderer) for t in labels),
                       key=lambda b: b.x0 if which == "x" else b.y0)
        assert len(boxes) >= 2, which
        for a, b in zip(boxes, boxes[1:], strict=False):
            assert (b.x0 > a.x1) if which == "x" else (b.y0 > a.y1), \
                [t.get_text() for t in labels]


def test_a_figure_and_its_interval_read_in_one_precision():
    """run.png wrote the figure with a decimal and its interval without: a CPU loader at
    12.3 [12.1-12.4] read `12.3 [12-12]`, a figure outside its own shown interval."""
    from gpubench.report.runplot import _figure

    assert _figure({"images_per_sec": 12.3, "ci": [12.1, 12.4]}) == "12.3 [12.1-12.4]"
    assert _figure({"images_per_sec": 0.8, "ci": [0.6, 0.9]}) == "0.8 [0.6-0.9]"
    assert _figure({"images_per_sec": 2930.4, "ci": [2181.1, 4169.7]}) == "2,930 [2,181-4,170]"
    assert _figure({"images_per_sec": 41.5, "ci": None}) == "41.5"
