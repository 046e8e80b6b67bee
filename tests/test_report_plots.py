"""Sweep report pictures: what each plot draws (points, bounds of the same runs, labels, ticks,
short screens apart), read from the pure data functions on constructed runs; the PNGs written
with few trials; and `python -m gpubench.report` speaking when its report is up to date."""

from __future__ import annotations

import json

import pytest

from gpubench.analysis import recommend
from gpubench.core.record import PhaseRecord, RunRecord, Status
from gpubench.report import cli as report_cli
from gpubench.report import plots as report_plots
from gpubench.report.plots import curve_data, headline_phase, memory_data, pareto_data


def run(batch=16, workers=2, prec="fp32", e2e=100.0, loader=150.0, compute=120.0, peak=0.5,
        status=Status.ok, ceiling=0.9) -> RunRecord:
    phases = {n: PhaseRecord(n, batch, images_per_sec=v)
              for n, v in (("loader", loader), ("compute", compute), ("e2e", e2e)) if v}
    return RunRecord(status=status, images_per_sec=e2e, loader_images_per_sec=loader,
                     compute_images_per_sec=compute, peak_memory_fraction=peak,
                     memory_ceiling=ceiling, phases=phases,
                     config={"loader": {"batch_size": batch, "num_workers": workers},
                             "precision": {"name": prec}, "memory": {"ceiling": ceiling}})


def row(rec: RunRecord, label="0", rung="run"):
    rec.rung = rung
    return recommend.Row(label, rec)


def rows_of(*recs, rung="run"):
    return [row(r, str(i), rung) for i, r in enumerate(recs)]


def test_curve_draws_loader_and_compute_of_the_same_best_runs():
    rows = rows_of(
        run(batch=16, e2e=100, loader=150, compute=110),
        run(batch=16, e2e=90, loader=999, compute=999),  # slower at 16: not the point drawn
        run(batch=32, e2e=130, loader=140, compute=200),
        run(batch=32, prec="amp_bf16", e2e=135, loader=141, compute=400),
        run(batch=64, prec="amp_bf16", e2e=139, loader=142, compute=700),
    )
    d = curve_data(rows, "batch_size", "batch size", log2=True)
    fp32, bf16 = (next(ln for ln in d["lines"] if ln["precision"] == p)
                  for p in ("fp32", "amp_bf16"))
    assert fp32["xs"] == [16, 32] and fp32["ys"] == [100, 130]
    assert fp32["bounds"] == {"loader": [150, 140], "compute": [110, 200]}
    assert bf16["bounds"]["compute"] == [400, 700]
    assert d["phase"] == "e2e" and d["ylabel"].startswith("e2e images/sec")
    assert d["xticks"] == [16, 32, 64]
    assert d["ymax"] > 700  # the tallest bound fits under the top
    assert not d["log_y"] and d["ymin"] == 0.0


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
    assert d["lines"][0]["ys"] == [50.0, 100.0, 150.0]


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
    assert d["lines"][0]["xs"] == [16, 32]
    assert d["short"] == {"xs": [64, 128], "ys": [500, 50]}
    assert d["xticks"] == [16, 32, 64, 128]
    p = pareto_data(rows)
    assert p["front"]["ys"] == [100, 120]  # the screen's 500 img/s is no front point
    assert p["short"]["ys"] == [500, 50]
    assert sorted(p["feasible"]["ys"]) == [100, 120]
    m = memory_data(rows)
    assert m["short"]["xs"] == [64, 128] and sorted(m["groups"]["fp32"]["xs"]) == [16, 32]


def test_star_and_top_point_fit_under_the_axis_top():
    rows = rows_of(run(batch=16, e2e=100, peak=0.3, loader=None, compute=None),
                   run(batch=32, e2e=101, peak=0.5, loader=None, compute=None))
    rec = recommend.recommend(rows)
    d = curve_data(rows, "batch_size", "batch size", rec, log2=True)
    assert d["star"] == {"x": 16, "y": 100}
    assert d["ymax"] >= 1.1 * 101
    p = pareto_data(rows, rec)
    assert p["star"] == {"x": 30.0, "y": 100} and p["ymax"] >= 1.1 * 101


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


def test_report_prints_its_summary_also_when_up_to_date(tmp_path, capsys):
    sweep = _sweep_dir(tmp_path / "sweep")
    assert report_cli.main([str(sweep)]) == 0
    first = capsys.readouterr().out
    assert "recommended:" in first
    mtime = (sweep / "report" / "summary.json").stat().st_mtime_ns
    assert report_cli.main([str(sweep)]) == 0
    second = capsys.readouterr().out
    assert (sweep / "report" / "summary.json").stat().st_mtime_ns == mtime  # cached
    assert "recommended:" in second and "up to date" in second
    assert "101.0" in second  # the ranking table too
    assert json.loads((sweep / "report" / "summary.json").read_text())["lines"]


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


class RecordRow:
    """A row that is only a view of its RunRecord, knobs by config key (as the report's Row
    moves onto RunRecord): the plots must read it the same as today's Row."""

    def __init__(self, rec: RunRecord, rung: str = "run"):
        rec.rung = self.rung = rung
        self.record = rec

    throughput = property(lambda self: self.record.throughput)
    feasible = property(lambda self: self.record.feasible)
    full = property(lambda self: self.record.full)

    def knob(self, name):
        return self.record.knob(name)


def test_rows_backed_by_run_records_plot_the_same():
    recs = [run(batch=16, e2e=100, peak=0.3), run(batch=32, e2e=120, peak=0.6),
            run(batch=64, e2e=None, status=Status.oom, peak=None),
            run(batch=32, prec="amp_bf16", e2e=150, peak=0.5)]
    old, new = rows_of(*recs), [RecordRow(r) for r in recs]
    for f in (lambda rs: curve_data(rs, "batch_size", "batch size", log2=True),
              memory_data, pareto_data):
        assert f(new) == f(old)
    assert curve_data(new, "batch_size", "batch size")["lines"][1]["xs"] == [16, 32]
