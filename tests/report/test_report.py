"""The sweep report: the recommendation rule on constructed results, and the files it writes for
real runs (a grid multirun with Hydra's basic sweeper), including a recommended config that
composes back into the configuration it was measured with."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, sqlite_store
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gpubench.analysis.recommend import RERUN_KEYS, Row, ranked, recommend, varying
from gpubench.config.paths import CONFIG_DIR
from gpubench.core.files import flatten
from gpubench.core.record import Flaw, Reason, Rung, RunRecord, Status
from gpubench.report.write import print_table, sweep_report, table_rows
from gpubench.search.rows import load_dir


def _plain(cfg) -> dict:
    """A config as results.json holds it (Enums by name)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def row(batch, workers, precision="fp32", ips=100.0, peak=0.3, status="ok", pin=True,
        device="cuda", rung="run", ci=None, stable=None) -> Row:
    config = {"loader": {"batch_size": batch, "num_workers": workers, "pin_memory": pin},
              "precision": {"name": precision}}
    rec = RunRecord(status=Status(status), images_per_sec=ips, images_per_sec_ci=ci,
                    peak_memory_fraction=peak, memory_ceiling=0.8, config=config,
                    env={"device": device}, measurement_stable=stable, rung=rung)
    return Row(f"b{batch}w{workers}{precision}{pin}{rung}", rec)


def grid(speed, precisions=("fp32", "amp_bf16"), peak=lambda b: b / 512) -> list[Row]:
    return [row(b, w, p, speed(b, w, p), peak(b))
            for b in (16, 32, 64, 128, 256) for w in (0, 1, 2, 4) for p in precisions]


def gpu_like(b, w, p):
    """Article 003's shape: throughput saturates with batch size, 2 workers unblock the GPU,
    AMP is ~1.7x faster."""
    compute = (1.7 if p == "amp_bf16" else 1.0) * 260 * b / (b + 8)
    loader = {0: 90, 1: 180, 2: 440, 4: 450}[w]
    return min(compute, loader)


def test_knee_picks_smallest_batch_and_fewest_workers_near_the_best():
    rec = recommend(grid(gpu_like), tolerance=0.05)
    assert rec.best.knob("precision") == "amp_bf16"
    floor = 0.95 * rec.best.throughput
    assert rec.chosen.throughput >= floor
    assert rec.chosen.knob("precision") == "amp_bf16"  # AMP measured faster: on
    # nothing with a smaller batch, or the same batch and fewer workers, is within 5%
    for r in grid(gpu_like):
        if r.knob("precision") == "amp_bf16" and r.throughput >= floor:
            assert (r.knob("batch_size"), r.knob("num_workers")) >= (
                rec.chosen.knob("batch_size"), rec.chosen.knob("num_workers"))
    # 256 is fastest, 128 within 5% of it; 2 workers is where the loader out-runs compute
    assert (rec.best.knob("batch_size"), rec.chosen.knob("batch_size")) == (256, 128)
    assert rec.chosen.knob("num_workers") == 2


def test_amp_stays_off_when_it_is_slower():
    # a CPU: bf16 autocast costs time
    rec = recommend(grid(lambda b, w, p: (0.6 if p == "amp_bf16" else 1.0) * 100 * b / (b + 8)))
    assert rec.chosen.knob("precision") == "fp32"
    assert any(x.startswith("AMP off") for x in rec.reasons)


def test_infeasible_configs_are_never_recommended():
    rows = [row(16, 2, ips=100), row(32, 2, ips=150), row(64, 2, ips=300, peak=0.9,
            status="over_ceiling"), row(128, 2, ips=0.0, status="oom")]
    rec = recommend(rows)
    assert rec.best.knob("batch_size") == 32 and rec.chosen.knob("batch_size") == 32
    assert recommend([r for r in rows if not r.feasible]) is None


def test_tolerance_and_pin_memory():
    rows = [row(32, 2, ips=96.0, pin=False), row(32, 2, ips=95.5, pin=True),
            row(64, 2, ips=100.0, pin=True)]
    rec = recommend(rows, tolerance=0.05)
    assert rec.chosen.knob("batch_size") == 32 and rec.chosen.knob("pin_memory") is True
    assert recommend(rows, tolerance=0.01).chosen.knob("batch_size") == 64
    # on a CPU-only run pinning is no knob: the faster of the two batch-32 runs is kept
    cpu = [row(32, 2, ips=96.0, pin=False, device="cpu"), row(32, 2, ips=95.5, device="cpu")]
    rec = recommend(cpu, tolerance=0.05)
    assert rec.chosen.knob("pin_memory") is False
    assert not any("pin_memory" in r for r in rec.reasons)


def test_short_measurements_are_ranked_but_not_recommended():
    # a pruned trial's screen (a few steps) and a max-batch probe may read faster than any
    # full-length measurement: they are no basis for the fastest or the recommended setup
    rows = [row(16, 2, ips=100), row(32, 2, ips=102, rung="full"),
            row(8, 2, ips=150, rung="screen"), row(4, 2, ips=160, rung="probe")]
    rec = recommend(rows)
    assert rec.best.knob("batch_size") == 32 and rec.chosen.knob("batch_size") == 16
    assert [r.rung for r in ranked(rows)] == ["full", "run", "probe", "screen"]
    assert recommend([r for r in rows if r.rung in ("screen", "probe")]) is None


def test_missing_knobs_are_not_reported_as_none():
    def one(label, ips, model):
        return Row(label, RunRecord(status=Status.ok, images_per_sec=ips,
                                    peak_memory_fraction=0.1, memory_ceiling=0.8,
                                    config={"model": {"name": model}}))

    r = one("a", 10.0, "tiny")
    rec = recommend([r, one("b", 9.0, "tiny2")])
    assert rec.chosen is r and not any("None" in x for x in rec.reasons)


def test_sweep_dir_without_its_study_has_one_row_per_trial(tmp_path):
    # the study's database is gone: rows come from the job folders and the manifest's rungs
    jobs = []
    for num, trial, rung, ips in [(0, 0, "screen", 50.0), (1, 0, "full", 40.0),
                                  (2, 1, "screen", 10.0)]:
        d = tmp_path / str(num)
        d.mkdir()
        (d / "results.json").write_text(json.dumps({
            "status": "ok", "images_per_sec": ips, "peak_memory_fraction": 0.1,
            "memory_ceiling": 0.8, "config": {"loader": {"batch_size": 4 + trial}}}))
        jobs.append({"num": num, "dir": str(d), "trial": trial, "rung": rung})
    (tmp_path / "sweep.json").write_text(json.dumps({"mode": "optuna", "jobs": jobs}))
    rows, study = load_dir(tmp_path)
    assert study is None
    assert sorted((r.label, r.rung) for r in rows) == [("1", "full"), ("2", "screen")]


def test_where_the_loader_check_names_fewer_workers_one_line_says_the_training_run_decides():
    """The team sweep: 0 workers load 16,819.9 img/s in the loader phase alone, far above
    compute, while training with 0 workers (the main process loads between steps) is slow; the
    recommendation picks 1. One line says which answer decides and why."""
    def run(workers, e2e, loader):
        r = row(16, workers, ips=e2e, ci=[0.99 * e2e, 1.01 * e2e], stable=True, device="cpu")
        r.record.loader_images_per_sec, r.record.compute_images_per_sec = loader, 5000.0
        return r

    rows = [run(0, 2500.0, 16819.9), run(1, 4900.0, 17000.0), run(2, 5000.0, 17100.0)]
    rec = recommend(rows)
    assert rec.chosen.knob("num_workers") == 1
    (check,) = [x for x in rec.reasons if x.startswith("loader check")]
    assert "0 workers out-run compute" in check and "16819.9" in check
    assert check.endswith("the training measurement decides, 1 worker")
    assert "main process loads each batch between steps" in check
    # where they agree, the loader check says so in its own words, once
    same = [run(1, 4900.0, 17000.0), run(2, 5000.0, 17100.0)]
    (check,) = [x for x in recommend(same).reasons if x.startswith("loader check")]
    assert "decides" not in check and check.startswith("loader check: 1 worker loads 17000.0")


def test_a_loader_far_above_compute_is_said_in_times_not_thousands_of_percent():
    from gpubench.analysis.workers import clears_by
    from gpubench.core.stats import Est

    assert clears_by(Est(0.5, 0.42, 0.62)) == "by 50% [42%-62%]"
    # 6192% [149%-209139%]: a percentage that large is no figure a reader takes in
    assert clears_by(Est(61.92, 1.49, 2091.39)) == "62.9 [2.5-2092] times over"


def test_a_parent_of_sweeps_of_two_workloads_never_recommends_a_workload_change(tmp_path,
                                                                               capsys):
    """`python -m gpubench.report outputs/multirun` over sweeps of 10 and 1000 classes: the
    faster 10-class runs are no speed of the 1000-class setup. The report ranks the newest
    run's workload only, its recommendation changes knobs only, each run is named by its folder
    under the one reported, and the report says it wrote a new folder."""
    from gpubench.config.keys import Role
    from gpubench.config.knobs import role

    for sweep, classes, started in (("10-00-00", 10, 1), ("11-00-00", 1000, 5)):
        for job, (batch, ips) in enumerate([(16, 900.0 if classes == 10 else 300.0),
                                            (32, 950.0 if classes == 10 else 320.0)]):
            d = tmp_path / "multirun" / sweep / str(job)
            d.mkdir(parents=True)
            RunRecord(status=Status.ok, images_per_sec=ips, images_per_sec_ci=[ips, ips],
                      peak_memory_fraction=0.1, memory_ceiling=0.8, measurement_stable=True,
                      config={"model": {"name": "tiny", "num_classes": classes},
                              "dataset": {"name": "synthetic", "image_size": 32,
                                          "num_classes": classes},
                              "loader": {"batch_size": batch, "num_workers": 0},
                              "precision": {"name": "fp32"},
                              "bench": {"steps": 24, "repeats": 6}},
                      env={"device": "cpu"}, started_at=f"2026-11-21T{started + job:02d}:00:00",
                      dir=d).save()
    parent = tmp_path / "multirun"
    sweep_report(parent)
    printed = capsys.readouterr().out
    summary = json.loads((parent / "report" / "summary.json").read_text())
    assert summary["rows"] == 2  # the 1000-class runs, the newest
    for pick in (summary["best"], summary["recommended"]):
        keys = [o.partition("=")[0] for o in pick["overrides"]]
        assert keys and all(role(k) is Role.knob for k in keys), pick["overrides"]
        assert pick["label"].startswith("11-00-00/")  # the run's folder, as found on disk
    assert "ranked only" in printed and "dataset.num_classes=10" in printed  # --where hint
    assert f"report: {parent / 'report'} (a new folder)" in printed
    sweep_report(parent)  # up to date: no new folder, the table printed again
    again = capsys.readouterr().out
    assert "(a new folder)" not in again and "11-00-00/1" in again


@pytest.mark.slow
def test_grid_multirun_report_and_recommended_config_composes_back(tmp_path):
    sweep = tmp_path / "grid"
    p = run_cli("-m", "model=tiny", "dataset.image_size=16", "dataset.num_classes=10",
                "dataset.num_samples=32", "loader.num_workers=0", "bench.device=cpu",
                "bench.warmup_steps=1", "bench.steps=2", "tracking=none",
                "loader.batch_size=2,4,8", "precision=fp32,amp_bf16", "fault.oom_above_batch=4",
                f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]  # OOM jobs do not stop Hydra's basic sweeper
    files = sweep_report(sweep, quiet=True)
    report = sweep / "report"
    names = {f.relative_to(report).as_posix() for f in files}
    assert {"ranking.csv", "ranking.txt", "summary.json", "experiment/recommended.yaml",
            "throughput_vs_batch.png", "memory_vs_batch.png", "pareto.png"} <= names
    assert all(f.stat().st_size > 0 for f in files)
    ranking = (report / "ranking.csv").read_text().splitlines()
    assert len(ranking) == 1 + 6
    assert sum(",oom," in line for line in ranking) == 2  # batch 8, both precisions

    summary = json.loads((report / "summary.json").read_text())
    chosen = Path(summary["recommended"]["dir"])
    assert summary["recommended"]["yaml"].endswith("recommended.yaml")
    assert summary["command"] == (
        f"python -m gpubench -cd {report.resolve()} experiment=recommended")
    measured = json.loads((chosen / "results.json").read_text())
    assert measured["status"] == "ok" and measured["config"]["loader"]["batch_size"] <= 4

    # the YAML composes back into the setup that was measured
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose("bench", overrides=["experiment=recommended",
                                          f"hydra.searchpath=[file://{report}]"])
    composed = _plain(cfg)
    for key in RERUN_KEYS:
        assert composed[key] == measured["config"][key], key

    # a second call (the MLflow callback after the sweeper) reuses the files
    mtime = (report / "pareto.png").stat().st_mtime_ns
    assert sweep_report(sweep, quiet=True) and (report / "pareto.png").stat().st_mtime_ns == mtime


def test_the_report_names_each_refused_job_under_the_ranking(tmp_path, capsys):
    """A multirun's job refused as bad input writes no results.json: the ranking had no row for
    it and the report never said it was run. One line each, right under the ranking, with the
    overrides that set it apart and the line it printed; in summary.json too."""
    from gpubench.core.exits import Refusal
    from gpubench.report.write import RANK_ORDER, write_report

    why = "loader.batch_size=-1 is not allowed: it must be null or an integer in [1, 65536]"
    refused = [Refusal(("loader.batch_size=-1",), why),
               Refusal(("loader.batch_size=2", "precision=amp_fp16"), "precision='amp_fp16' is "
                       "not allowed: it must be torch_default, fp32, tf32 or amp_bf16 on CPU")]
    write_report([row(16, 0, ips=100.0), row(32, 0, ips=120.0)], tmp_path / "rep", "x",
                 refused=refused)
    out = capsys.readouterr().out.splitlines()
    at = out.index(RANK_ORDER)
    assert out[at + 1:at + 3] == [
        f"refused: loader.batch_size=-1: {why}",
        "refused: loader.batch_size=2 precision=amp_fp16: precision='amp_fp16' is not allowed: "
        "it must be torch_default, fp32, tf32 or amp_bf16 on CPU"]
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["refused"][0] == {"overrides": ["loader.batch_size=-1"], "error": why}
    assert summary["lines"][:2] == out[at + 1:at + 3]  # printed again when up to date
    write_report([row(16, 0), row(32, 0)], tmp_path / "none", "x", quiet=True)
    summary = json.loads((tmp_path / "none" / "summary.json").read_text())
    assert "refused" not in summary and not any(x.startswith("refused:") for x in summary["lines"])


@pytest.mark.slow
def test_a_grid_multiruns_report_names_the_jobs_it_refused(tmp_path):
    """Through the command: fp16 autocast is refused on a CPU when its job resolves (the sweep's
    values pass the checks before it starts), the fp32 job measures; the sweep's report names
    the refused one by its swept override, not the overrides every job got."""
    p = run_cli("-m", "model=tiny", "dataset.image_size=16", "dataset.num_classes=10",
                "dataset.num_samples=32", "loader.batch_size=4", "loader.num_workers=0",
                "bench.device=cpu", "bench.warmup_steps=1", "bench.warmup_max_steps=1",
                "bench.steps=2", "tracking=none", "precision=fp32,amp_fp16",
                f"hydra.sweep.dir={tmp_path / 'grid'}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]  # one job measured: the sweep did not fail
    refused = [ln for ln in p.stdout.splitlines() if ln.startswith("refused:")]
    assert refused == ["refused: precision=amp_fp16: precision='amp_fp16' is not allowed: it "
                       "must be torch_default, fp32, tf32 or amp_bf16 on CPU (fp16 autocast "
                       "needs CUDA)"], p.stdout[-3000:]
    assert p.stdout.index("ranked: feasible first") < p.stdout.index("refused:")


def test_recommended_config_reruns_the_measurement_the_sweep_made(tmp_path):
    # the golden sweep measured 6 windows of 6 steps after 1 warm-up step: not the defaults,
    # so a recommended.yaml without `bench` reruns another measurement
    sweep = tmp_path / "sweep"
    shutil.copytree(ROOT / "tests" / "golden" / "fixtures" / "sweep", sweep)
    sweep_report(sweep, quiet=True)
    report = sweep / "report"
    summary = json.loads((report / "summary.json").read_text())
    measured = json.loads((Path(summary["recommended"]["dir"]) / "results.json").read_text())
    # what `python -m gpubench -cd <report dir> experiment=recommended` composes
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        default = _plain(compose("bench"))
        rerun = _plain(compose("bench", overrides=[
            "experiment=recommended", f"hydra.searchpath=[file://{report}]"]))
    assert default["bench"] != measured["config"]["bench"]  # else this test would prove nothing

    def what_ran(cfg: dict) -> dict:
        return {k: v for k, v in flatten(cfg).items() if not k.startswith(("tracking.", "fault."))}

    # keys added since the fixture's sweep was recorded compose as their defaults
    newer = {"bench.min_window_s": None, "loader.worker_type": "process", "loader.in_order": True,
             "step.name": "classification", "step._target_": None, "step.takes": "output"}
    assert what_ran(rerun) == {**newer, **what_ran(measured["config"])}
    yml = (report / "experiment" / "recommended.yaml").read_text()
    # bench.steps=6 over bench.repeats=6: one step per window, not the phase's six
    assert "# bench: the sweep's own measurement (6 windows of 1 step on each of" in yml
    assert "bench.steps=24 bench.repeats=10" in yml  # how to measure longer
    assert any(line.startswith("  (it measures as the sweep did: 6 windows of 1 step on")
               for line in summary["lines"])


def test_recommended_config_keeps_the_runs_own_interpolations(tmp_path):
    """A pinned `model.num_classes: 10` reran 10 classes with dataset.num_classes=7; an
    interpolation the overlay cannot resolve (a team's root key) stays the recorded value."""
    sweep = tmp_path / "sweep"
    shutil.copytree(ROOT / "tests" / "golden" / "fixtures" / "sweep", sweep)
    for results in sweep.glob("*/results.json"):
        cfg = json.loads(results.read_text())["config"]
        cfg["model"]["num_classes"] = "${dataset.num_classes}"
        cfg["dataset"]["root"] = "${my_data_root}"  # composed where the overlay is not
        (results.parent / ".hydra").mkdir()
        (results.parent / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    sweep_report(sweep, quiet=True)
    report = sweep / "report"
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        rerun = _plain(compose("bench", overrides=[
            "experiment=recommended", f"hydra.searchpath=[file://{report}]",
            "dataset.num_classes=7"]))
    assert rerun["model"]["num_classes"] == 7
    assert rerun["dataset"]["root"] is None  # as recorded: null


def test_a_report_of_one_run_speaks_of_the_run(tmp_path):
    """A report of one run said `it measures as the sweep did` of a run no sweep made."""
    one = tmp_path / "run"
    shutil.copytree(next((ROOT / "tests" / "golden" / "fixtures" / "sweep").glob("*/")), one)
    sweep_report(one, quiet=True)
    summary = json.loads((one / "report" / "summary.json").read_text())
    yml = (one / "report" / "experiment" / "recommended.yaml").read_text()
    said = "\n".join([*summary["lines"], yml, (one / "report" / "ranking.txt").read_text()])
    assert "as the run did" in said and "the run's own measurement" in said, said
    assert "gpubench run:" in said and "sweep" not in said.replace(str(one), ""), said


def test_the_measurement_is_said_as_the_runner_made_it():
    from gpubench.report.write import measurement_text

    cfg = {"bench": {"steps": 50, "repeats": 6, "phases": ["loader", "e2e"]},
           "loader": {"num_workers": 8, "prefetch_factor": 2}}
    # each phase's windows said once ("on each of loader, e2e, the loader's of 48" had read as
    # two lengths of the loader's)
    assert measurement_text(cfg) == ("6 windows of 9 steps on e2e, and of 48 steps on loader "
                                     "(3x the batches its workers hold in flight)")
    cfg["bench"]["min_window_s"] = 0.05  # the loader's run on past their steps too
    assert measurement_text(cfg) == ("6 windows of at least 9 steps and 0.05 s on e2e, and of at "
                                     "least 48 steps and 0.05 s on loader (3x the batches its "
                                     "workers hold in flight)")
    cfg["bench"]["phases"] = ["loader"]
    assert measurement_text(cfg) == ("6 windows of at least 48 steps and 0.05 s on loader (3x "
                                     "the batches its workers hold in flight)")
    cfg["bench"]["phases"] = ["loader", "e2e"]
    del cfg["bench"]["min_window_s"]
    cfg["loader"]["num_workers"] = 0
    assert measurement_text(cfg) == "6 windows of 9 steps on each of loader, e2e"
    # windows lengthened to a least duration (bench.min_window_s: 2 s on CUDA by default) hold
    # more steps than the plan's share: the text said "6 windows of 9 steps" on every GPU run
    cfg["bench"].update(min_window_s=2.0, max_seconds=60.0)
    assert measurement_text(cfg) == "6 windows of at least 9 steps and 2 s on each of loader, e2e"
    cfg["bench"]["min_window_s"] = 0.0
    assert measurement_text(cfg, cut_short=True) == (
        "6 windows of 9 steps on each of loader, e2e, cut short by bench.max_seconds=60.0")
    cfg["bench"]["phases"] = ["e2e"]  # one phase: not "on each of e2e"
    assert measurement_text(cfg) == "6 windows of 9 steps on e2e"


def test_a_report_into_a_relative_folder_names_its_files_as_its_rerun_line_does(
        tmp_path, monkeypatch, capsys):
    """An MLflow report goes to outputs/reports/<experiment> by default, a relative folder: the
    `recommended config:` and `report:` lines read relative beside the rerun line's absolute
    `-cd`; all three name the folder alike now, from wherever the user runs them."""
    from gpubench.report.write import write_report

    monkeypatch.chdir(tmp_path)
    write_report([row(16, 0, ips=100.0), row(32, 0, ips=120.0)], Path("rep"), "x")
    out = capsys.readouterr().out.splitlines()
    rep = tmp_path.resolve() / "rep"
    assert f"recommended config: {rep / 'experiment' / 'recommended.yaml'}" in out
    assert f"rerun it: python -m gpubench -cd {rep} experiment=recommended" in out
    assert f"report: {rep} (a new folder)" in out


def test_a_knob_that_does_not_act_in_a_run_is_no_setting_of_it():
    """persistent_workers with 0 workers or thread workers does nothing: the ranking showed the
    recorded false, and the recommended line told `loader.persistent_workers=false
    loader.worker_type=thread`, an override that changes nothing. A cell reads `-` as a
    0-worker run's prefetch_factor does, and the overrides leave it out."""
    from gpubench.report.write import overrides_of, run_text

    def run(w, kind, persistent):
        r = row(16, w, ips=100.0 + w)
        r.record.config["loader"] |= {"worker_type": kind, "persistent_workers": persistent}
        r.flat = {}
        r.__post_init__()
        return r

    rows = [run(0, "process", False), run(2, "thread", False), run(2, "process", True),
            run(4, "process", False)]
    keys = varying(rows)
    assert "loader.persistent_workers" in keys
    head, body = table_rows(rows, keys)
    col = head.index("loader.persistent_workers")
    by_workers = {(b[head.index("loader.num_workers")], b[head.index("loader.worker_type")]):
                  b[col] for b in body}
    assert by_workers == {("0", "-"): "-", ("2", "thread"): "-", ("2", "process"): "true",
                          ("4", "process"): "false"}
    assert overrides_of(rows[1], keys) == ["loader.num_workers=2", "loader.worker_type=thread"]
    assert "persistent" not in run_text(rows[0], keys)
    assert overrides_of(rows[2], keys)[-1] == "loader.persistent_workers=true"


def test_a_run_folders_own_report_names_it_and_writes_values_as_overrides(tmp_path, capsys):
    """A single run's folder reported: its row is named by the folder (it read `(run run)`),
    and a knob's value reads as its override and legends write it (`true`, not `True`)."""
    from gpubench.report.write import sweep_report

    r = row(16, 0, pin=True)
    r.record.dir = tmp_path / "my-run"
    r.record.dir.mkdir()
    r.record.save()
    other = row(16, 0, pin=False)
    other.record.dir = tmp_path / "my-run" / "again"
    other.record.dir.mkdir()
    other.record.save()
    sweep_report(tmp_path / "my-run")
    out = capsys.readouterr().out
    assert "(run my-run" in out and "(run run" not in out, out
    ranking = list(csv.DictReader((tmp_path / "my-run" / "report" / "ranking.csv").open()))
    assert sorted(x["loader.pin_memory"] for x in ranking) == ["false", "true"]


def test_a_run_is_named_by_its_label_with_the_knobs_that_set_it_apart():
    """The report's `(run 3: loader.batch_size=8)`; with no knob that varied (one setting
    ranked, as a sweep=pipes join can leave), the run alone, never `(run 0: )`."""
    from gpubench.report.write import run_text

    r = row(8, 2)
    assert run_text(r, ["loader.batch_size", "loader.num_workers"]) == (
        f"run {r.label}: loader.batch_size=8 loader.num_workers=2")
    assert run_text(r, []) == f"run {r.label}"


def test_within_tolerance_is_judged_on_intervals():
    best = row(256, 2, ips=100.0, ci=[98.0, 102.0])
    tight = row(64, 2, ips=97.0, ci=[96.0, 98.0])  # surely within 5%
    noisy = row(16, 2, ips=97.0, ci=[60.0, 130.0])  # maybe, maybe far slower
    rec = recommend([best, tight, noisy])
    assert rec.chosen is tight  # the smaller, noisy batch does not win on a lucky median


def test_amp_difference_inside_the_intervals_is_no_difference_or_not_decided():
    amp = row(64, 2, "amp_bf16", ips=95.0, ci=[80.0, 150.0])
    plain = row(32, 2, "fp32", ips=93.5, ci=[85.0, 110.0])
    rec = recommend([amp, plain])
    assert any(x.startswith("AMP made no measurable difference") for x in rec.reasons)
    # medians 28% apart inside wide intervals: open, not "no difference" (it read so at +185%)
    rec = recommend([row(64, 2, "amp_bf16", ips=120.0, ci=[80.0, 150.0]), plain])
    [amp_line] = [x for x in rec.reasons if x.startswith("AMP")]
    assert amp_line.startswith("AMP's effect is not decided: with AMP 120.0 [80.0-150.0] img/s, "
                               "without 93.5 [85.0-110.0] (+28.3%, but the intervals overlap")
    # and beyond the intervals it decides
    rec = recommend([row(64, 2, "amp_bf16", ips=160.0, ci=[150.0, 170.0]), plain])
    assert any(x.startswith("AMP on") for x in rec.reasons)


def test_an_unstable_fastest_run_is_not_recommended_unconfirmed():
    lucky = row(128, 2, ips=7019.0, stable=False)
    steady = row(64, 2, ips=235.0, ci=[230.0, 240.0], stable=True)
    rec = recommend([lucky, steady])
    assert rec.best is steady and rec.chosen is steady
    assert any("measured unstable" in x and lucky.label in x for x in rec.reasons)
    assert ranked([lucky, steady])[0] is steady
    alone = recommend([lucky])  # nothing confirmed: a recommendation marked as such
    assert alone.chosen is lucky and any(x.startswith("UNCONFIRMED") for x in alone.reasons)


def test_setups_whose_repeats_all_disagree_are_unconfirmed_in_one_worded_line():
    """Every setup measured steadily each time, but its repeats' intervals disjoin (a grid run
    twice, pooled): no measurement flagged itself, so the UNCONFIRMED placeholder was never
    worded and a bare `UNCONFIRMED` line stood first. One line says it; a mix with a flagged
    setup does not call every measurement flagged."""
    def disagreeing(batch, ips):
        r = row(batch, 0, ips=ips, ci=[ips * 0.99, ips * 1.01], stable=True)
        again = row(batch, 0, ips=ips * 1.5, ci=[ips * 1.49, ips * 1.51], stable=True).record
        r.confirms = [again]
        return r

    rows = [disagreeing(16, 100.0), disagreeing(32, 120.0)]
    rec = recommend(rows)
    assert "UNCONFIRMED" not in rec.reasons
    assert [x for x in rec.reasons if x.startswith("UNCONFIRMED")] == [rec.unconfirmed]
    assert rec.unconfirmed.startswith("UNCONFIRMED: no setup measured alike in the runs "
                                      "repeating it") and "quiet machine" in rec.unconfirmed
    flagged = row(64, 0, ips=90.0, stable=False)
    flagged.record.noise_reasons = [Reason(Flaw.few_windows, "2 windows")]
    mixed = recommend([*rows, flagged])
    assert "every measurement flagged itself" not in mixed.unconfirmed
    assert "on a quiet machine" in mixed.unconfirmed and "measuring longer" in mixed.unconfirmed
    assert recommend([flagged]).unconfirmed.startswith(
        "UNCONFIRMED: every measurement flagged itself (too few windows")
    steady = row(16, 0, ips=100.0, ci=[99.0, 101.0], stable=True)
    assert recommend([steady]).unconfirmed is None


def test_the_fastest_figure_left_out_is_said_in_english():
    lucky = row(128, 2, ips=1718.0, ci=[1500.0, 1900.0], stable=False)
    steady = row(64, 2, ips=1711.0, ci=[1619.0, 1827.0], stable=True)
    (line,) = [x for x in recommend([lucky, steady]).reasons if x.startswith("the fastest")]
    # the report's reference line names it as the headline does: not the fastest figure
    from gpubench.analysis.recommend import fastest_of

    assert recommend([lucky, steady]).best is steady
    assert fastest_of(steady) == "fastest stable feasible" and fastest_of(lucky) == (
        "fastest feasible")
    assert line.endswith("; it is not recommended until a rerun on a quiet machine confirms it")
    assert "not recommended unconfirmed" not in line


def _wide_rows() -> list[Row]:
    """A GPU sweep's knobs at their widest: MLflow run ids and a folder path, an over-ceiling
    row, a confirmed row, six-figure intervals, long precision names."""
    def wide(label, ips, stable, batch, precision, workers=8, status="ok", kind="process"):
        config = {"loader": {"batch_size": batch, "num_workers": workers,
                             "pin_memory": workers > 4, "worker_type": kind,
                             "prefetch_factor": workers // 2 or None},
                  "precision": {"name": precision}, "channels_last": workers > 4,
                  "bench": {"optimizer": "adamw" if workers > 4 else "sgd"}}
        rec = RunRecord(status=Status(status), images_per_sec=ips,
                        images_per_sec_ci=[ips * 0.9, ips * 1.1], peak_memory_fraction=0.71,
                        memory_ceiling=0.8, config=config, env={"device": "cuda"},
                        measurement_stable=stable, rung="full", gpu_util_mean=97.5,
                        bottleneck="inconclusive")
        return Row(label, rec)

    disturbed = wide("2026-11-21/10-00-00/13", 5467.5, False, 256, "torch_default", 16)
    steady = wide("4e5f6a7b", 1711.0, True, 128, "amp_bf16", kind="thread")
    steady.confirms = [_again(steady, 1711.0, [1619.0, 1827.0], stable=True)]
    over = wide("8c9d0e1f", 123456.6, True, 1024, "amp_bf16", workers=2, status="over_ceiling")
    return [disturbed, steady, over]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("terminal", [True, False])
def test_the_ranking_never_splits_a_figure_or_a_value(width, terminal):
    """In a terminal or piped, at 80 or 120 columns: every figure and value of a row stays
    whole on the row's line, or moves below the table as key=value, or its column is named as
    left out; nothing is cut; a slower row ranks first and says why."""
    from rich.console import Console

    from gpubench.report.write import knob_header

    rows = _wide_rows()
    keys = varying(rows)
    head, body = table_rows(rows, keys, screen=True)
    buf = io.StringIO()
    print_table(head, body, "gpubench sweep: outputs/multirun/2026-11-23/10-00-00",
                Console(file=buf, width=width, force_terminal=terminal, color_system=None))
    text = buf.getvalue()
    assert "…" not in text
    lines = text.splitlines()
    table = lines[1:1 + next(i for i, ln in enumerate(lines[1:]) if not ln.strip()
                             or ln.startswith(("  1.", "(left out", "ranked:")))]
    assert table and max(len(ln.rstrip()) for ln in table) <= width, text
    left = next((ln for ln in lines if ln.startswith("(left out")), "")
    tokens = text.split()
    names = {c: knob_header(k).replace("\n", "_") for c, k in enumerate(keys, len(head) - len(keys))}
    for b in body:
        (line,) = [ln for ln in table if ln.split()[:2] == b[:2]]  # one line per row
        for c, value in enumerate(b):
            shown = value in line.split()
            moved = c in names and f"{names[c]}={value}" in tokens
            dropped = head[c].replace("\n", " ") in left
            assert shown or moved or dropped, (head[c], value, text)
    order = [ln.split()[1] for ln in table if ln[:1].isdigit()]
    assert order == ["4e5f6a7b", "2026-11-21/10-00-00/13", "8c9d0e1f"]  # 1711 above 5467
    status = {ln.split()[1]: ln.split()[2] for ln in table if ln[:1].isdigit()}
    assert status == {"4e5f6a7b": "confirmed", "2026-11-21/10-00-00/13": "disturbed",
                      "8c9d0e1f": "over_ceiling"}
    assert "stable or confirmed before" in " ".join(tokens)
    if width == 120:  # a log's width keeps the figures and the first knobs in the table
        # the confirmed row pools 2 figures, widened to their own ends: at least 50%
        assert "\u226550%" in table[0] and "batch" in table[0] and "workers" in table[1]


@pytest.mark.parametrize("width", [80, 120])
def test_a_knob_without_a_short_name_is_headed_by_its_whole_key(width):
    """A swept key with no short name was headed `bench.host` / `metrics` / `every`: words that
    are no knob's. Now its full key, broken only after the dot; a short name a word a line as
    before; either named below the table exactly as the command line writes it."""
    from rich.console import Console

    def swept(label, ips, batch, every, cudnn) -> Row:
        config = {"loader": {"batch_size": batch, "num_workers": 2},
                  "bench": {"host_metrics_every": every, "cudnn_benchmark": cudnn}}
        return Row(label, RunRecord(
            status=Status.ok, images_per_sec=ips, images_per_sec_ci=[ips * 0.9, ips * 1.1],
            peak_memory_fraction=0.5, memory_ceiling=0.8, config=config, env={"device": "cuda"},
            measurement_stable=True, rung="full", gpu_util_mean=97.5, bottleneck="inconclusive"))

    rows = [swept("2026-11-21/10-00-00/13", 5467.5, 256, 10, True),
            swept("2026-11-21/10-00-00/14", 123456.6, 1024, 100, False)]
    keys = varying(rows)
    assert keys == ["loader.batch_size", "bench.host_metrics_every", "bench.cudnn_benchmark"]
    head, body = table_rows(rows, keys, screen=True)
    buf = io.StringIO()
    print_table(head, body, "gpubench sweep: x",
                Console(file=buf, width=width, force_terminal=False, color_system=None))
    lines = buf.getvalue().splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith(("  1.", "(left out", "ranked:")))
    table = lines[1:end]
    words = " ".join(table).split()
    assert not {"bench.host", "metrics", "every", "bench.cudnn", "benchmark"} & set(words)
    names = {"loader.batch_size": ("batch_size", ["batch", "size"]),
             "bench.host_metrics_every": ("bench.host_metrics_every",
                                          ["bench.", "host_metrics_every"]),
             "bench.cudnn_benchmark": ("bench.cudnn_benchmark", ["bench.", "cudnn_benchmark"])}
    for c, k in enumerate(keys, len(head) - len(keys)):
        name, header = names[k]
        for b in body:
            below = [ln for ln in lines[end:] if ln.startswith(f"  {b[0]}. run {b[1]}: ")]
            in_table = all(w in words for w in header) and any(
                ln.split()[:2] == b[:2] and b[c] in ln.split() for ln in table)
            moved = bool(below) and f"{name}={b[c]}" in below[0].split()
            assert in_table != moved, (k, width, "\n".join(lines))
    if width == 80:  # the whole key is too wide for the table here: below it, named exactly
        assert lines[end:end + 2] == [
            "  1. run 2026-11-21/10-00-00/14: bench.host_metrics_every=100 "
            "bench.cudnn_benchmark=false",
            "  2. run 2026-11-21/10-00-00/13: bench.host_metrics_every=10 "
            "bench.cudnn_benchmark=true"]


@pytest.mark.parametrize("terminal", [True, False])
def test_the_reports_lines_fold_between_words_in_a_terminal(terminal):
    """At 80 columns a terminal broke the recommended line inside an override
    (`loader.num_workers=4 lo|ader...`): folded between words under their indent; piped, whole."""
    from rich.console import Console

    from gpubench.report.write import print_lines

    lines = ["recommended:      7608.1 [5214.8-7777.2] img/s  (run 3: loader.batch_size=512 "
             "loader.num_workers=4 precision=amp_bf16 bench.cudnn_benchmark=true "
             "channels_last=false)",
             "  - AMP's effect is not decided: with AMP 7608.1 [5214.8-7777.2] img/s, without "
             "2671.6 [1578.8-5460.1] (+184.8%, but the intervals overlap: measure longer)",
             "  (it measures as the sweep did: 6 windows of 1 step; add bench.steps=24 to measure "
             "longer)", "rerun it: python -m gpubench -cd /tmp/t1/outputs/multirun/2026-11-25/"
             "04-58-08/report experiment=recommended", "short"]
    buf = io.StringIO()
    print_lines(lines, Console(file=buf, width=80, force_terminal=terminal, color_system=None))
    out = buf.getvalue().splitlines()
    assert out[-1] == "short" and " ".join(" ".join(out).split()) == " ".join(
        " ".join(lines).split())  # every word whole, in order
    if not terminal:
        assert out == lines
        return
    assert lines[-2] in out  # a command stays one line: pasted, it runs as printed
    assert max(len(ln) for ln in out if ln != lines[-2]) <= 80 and len(out) > len(lines)
    assert out[1].startswith("  ") and out[1][2] != " "  # under "recommended:" + 2
    bullet = out.index(next(ln for ln in out if ln.startswith("  - AMP")))
    assert out[bullet + 1].startswith("    ") and not out[bullet + 1].startswith("     ")
    measures = out.index(next(ln for ln in out if ln.startswith("  (it")))
    assert out[measures + 1].startswith("    ") and not out[measures + 1][4] == " "


def _again(r: Row, ips, ci=None, stable=None, status="ok") -> RunRecord:
    """A confirm-step re-measurement of r's configuration."""
    return RunRecord(status=Status(status), images_per_sec=ips, images_per_sec_ci=ci,
                     peak_memory_fraction=r.peak, memory_ceiling=0.8, config=r.record.config,
                     env=r.record.env, measurement_stable=stable, rung="confirm")


def test_a_pooled_rows_interval_is_named_by_its_own_coverage():
    """A confirmed row's interval is [min, max] of its 3 measurements, 75% coverage: the
    ranking's column and the plots' whiskers said "95% interval" over it."""
    pooled = row(16, 2, ips=200.0, ci=[190.0, 210.0], stable=True)
    pooled.confirms = [_again(pooled, 196.0, [185.0, 205.0]), _again(pooled, 204.0)]
    once = row(32, 2, ips=150.0, ci=[140.0, 160.0], stable=True)
    single = row(64, 2, ips=120.0)  # no interval: it names none
    assert pooled.interval_coverage == 0.75 and once.interval_coverage == 0.95
    # widened past its figures' [min, max] (below): it covers at least 75%, by no figure known
    assert table_rows([pooled, single], [])[0][4] == "at least 75% interval"
    assert table_rows([pooled, once, single], [])[0][4] == "at least 75% interval"
    assert table_rows([once, single], [])[0][4] == "95% interval"
    far = row(16, 2, ips=100.0, ci=[95.0, 105.0], stable=True)  # [min, max] of three, as is
    far.confirms = [_again(far, 140.0, [136.0, 144.0]), _again(far, 120.0, [118.0, 122.0])]
    assert table_rows([far, single], [])[0][4] == "75% interval"
    assert table_rows([far, once, single], [])[0][4] == "75-95% interval"
    # an axis with the loader and compute bounds beside: those are each run's own phases, 95%
    from gpubench.analysis.recommend import interval_label

    assert interval_label([pooled]) == "at least 75% interval"
    assert interval_label([far], phases=True) == "75-95% interval"
    # the report's "fastest feasible:" and "recommended:" lines, which no header labels
    from gpubench.analysis.recommend import coverage_of, with_interval

    # [min, max] of the 3 figures, widened to the median of their own intervals' ends
    # (196-204): it covers at least the 75% of the three figures' [min, max], not 75% exactly
    assert (f"{with_interval(pooled)}{coverage_of(pooled)}"
            == "200.0 [187.5-207.5], at least 75% interval")
    assert coverage_of(once) == ", 95% interval" and coverage_of(single) == ""
    assert far.interval == (100.0, 140.0) and coverage_of(far) == ", 75% interval"


def test_two_close_repeats_pool_into_an_interval_no_narrower_than_their_own():
    """A setup measured twice at 100 [80-120] and 101 [85-118] read 100.5 [100.0-101.0]: the two
    figures' [min, max], narrower than either run's own windows allow. Pooled, the interval
    spans at least the median of its measurements' own ends; two far apart keep their span."""
    close = row(16, 2, ips=100.0, ci=[80.0, 120.0], stable=True)
    close.confirms = [_again(close, 101.0, [85.0, 118.0])]
    assert close.interval == (82.5, 119.0) and close.interval_coverage == 0.5
    far = row(16, 2, ips=100.0, ci=[95.0, 105.0], stable=True)
    far.confirms = [_again(far, 140.0, [136.0, 144.0])]
    assert far.interval == (100.0, 140.0)


def test_a_plot_names_a_rows_flagged_re_measurement_as_the_ranking_does():
    """A trial steady itself whose confirm round flagged too few windows read `too few windows`
    in the ranking and `flagged run (unconfirmed)` in the plots' legend."""
    from gpubench.report.plot_rules import flagged_label

    r = row(16, 2, ips=200.0, ci=[190.0, 210.0], stable=True)
    again = _again(r, 201.0, [185.0, 215.0], stable=False)
    again.noise_reasons = [Reason(Flaw.few_windows, "e2e: 2 windows")]
    r.confirms = [again]
    assert r.standing == "too few windows"
    assert flagged_label([r]).startswith("flagged run (too few windows):")
    r.confirms = [_again(r, 300.0, [295.0, 305.0], stable=True)]  # steady, but disagreeing
    assert r.standing == "disagreed" and "(unconfirmed)" in flagged_label([r])


def test_confirmations_pool_into_the_figure_interval_and_stability():
    r = row(16, 2, ips=200.0, ci=[190.0, 210.0], stable=True)
    assert (r.throughput, r.interval, r.stable, r.confirmed) == (200.0, (190.0, 210.0), True,
                                                                 False)
    # re-measured alike: the median of all three, an interval over them, confirmed
    r.confirms = [_again(r, 196.0, [185.0, 205.0]), _again(r, 204.0, [195.0, 215.0])]
    assert r.throughput == 200.0 and r.pooled == [200.0, 196.0, 204.0]
    # [min, max] of 3 (the most 3 values can say), no narrower than their own intervals' median
    assert r.interval == (190.0, 210.0)
    assert r.stable and r.confirmed
    # a lucky first figure: the re-measurements disagree beyond their intervals
    lucky = row(16, 2, ips=400.0, ci=[390.0, 410.0], stable=True)
    lucky.confirms = [_again(lucky, 200.0, [190.0, 210.0]), _again(lucky, 210.0, [200.0, 220.0])]
    assert lucky.throughput == 210.0 and not lucky.stable and not lucky.confirmed
    # agreeing figures, but one re-measurement found itself disturbed, or did not measure
    for bad in (_again(r, 200.0, [190.0, 210.0], stable=False),
                _again(r, 0.0, status="failed")):
        r.confirms = [_again(r, 200.0, [190.0, 210.0]), bad]
        assert not r.stable and not r.confirmed
    # single-window measurements with different figures share no common figure
    r1 = row(16, 2, ips=200.0)
    r1.confirms = [_again(r1, 200.0), _again(r1, 200.0)]
    assert r1.stable and r1.interval == (200.0, 200.0)
    r1.confirms = [_again(r1, 200.0), _again(r1, 201.0)]
    assert not r1.stable


def test_a_lucky_unconfirmed_trial_is_not_the_reference_once_confirmations_ran():
    lucky = row(64, 2, ips=400.0, ci=[390.0, 410.0], stable=True)
    lucky.confirms = [_again(lucky, 200.0, [190.0, 210.0]), _again(lucky, 205.0, [195.0, 215.0])]
    steady = row(32, 2, ips=300.0, ci=[290.0, 310.0], stable=True)
    steady.confirms = [_again(steady, 298.0, [290.0, 306.0]),
                       _again(steady, 303.0, [295.0, 310.0])]
    rec = recommend([lucky, steady, row(16, 2, ips=150.0, stable=True)])
    assert rec.best is steady and rec.chosen is steady
    assert [r.label for r in ranked([lucky, steady])] == [steady.label, lucky.label]
    # nothing confirmed: the report says so rather than trusting a single figure
    lucky2 = row(64, 2, ips=400.0, ci=[390.0, 410.0], stable=True)
    lucky2.confirms = [_again(lucky2, 200.0, [190.0, 210.0])]
    rec = recommend([lucky2, row(16, 2, ips=150.0, stable=True)])
    assert not rec.best.confirmed and any(x.startswith("UNCONFIRMED") for x in rec.reasons)


@pytest.mark.slow
def test_the_mlflow_report_pools_a_sweeps_confirm_runs(tmp_path):
    """`report --parent`: the confirm step's runs are in MLflow as children like any other; the
    report from MLflow must pool them into their trial's row as the report from the sweep dir
    does, not keep one of the measurements and drop the rest."""
    import statistics

    from conftest import TINY
    from mlflow.tracking import MlflowClient

    from gpubench.report.write import load_mlflow

    sqlite_store(tmp_path / "outputs" / "mlflow.db")  # the default store, already migrated
    p = run_cli("-m", "hydra/sweeper=gpubench", *[o for o in TINY if not o.startswith("tracking=")],
                "tracking=mlflow", "loader.batch_size=choice(2,4)", "hydra.sweeper.n_trials=2",
                "hydra.sweeper.screen.steps=null", "hydra.sweeper.confirm.top=1",
                "hydra.sweeper.confirm.rounds=2", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("gpubench").experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(runs) == 1 + 2 + 2  # the parent, two trials, two confirm runs
    from_dir = {r.record.knob("loader.batch_size"): r for r in load_dir(tmp_path / "sweep")[0]}
    from_mlflow = {r.record.knob("loader.batch_size"): r
                   for r in load_mlflow("gpubench", uri, parent=parent.info.run_id)}
    assert from_mlflow.keys() == from_dir.keys() == {2, 4}
    for batch, r in from_dir.items():
        m = from_mlflow[batch]
        assert len(m.confirms) == len(r.confirms)
        assert m.throughput == pytest.approx(r.throughput)
    [top] = [r for r in from_mlflow.values() if r.confirms]
    assert top.throughput == pytest.approx(statistics.median(x.throughput for x in top.measurements))
    assert len(top.measurements) == 3


def mlflow_run(ips, started, steps=200, device="NVIDIA H100", **bench) -> Row:
    """A full-length run as an MLflow experiment holds it: a setup, the train step's knobs, how
    long it measured and how it was tracked."""
    config = {"loader": {"batch_size": 64, "num_workers": 4}, "precision": {"name": "amp_bf16"},
              "bench": {"steps": steps, "seed": 0, "warmup_steps": 5, "monitor": True,
                        "optimizer": "sgd", "grad_accum_steps": 1, "lr": 0.01, **bench},
              "tracking": {"backend": "mlflow", "run_name": f"r{started}"},
              "fault": {"oom_above_batch": None, "stall_every": None, "stall_s": 1.0}}
    rec = RunRecord(status=Status.ok, images_per_sec=ips, peak_memory_fraction=0.4,
                    memory_ceiling=0.8, config=config, env={"device_name": device},
                    started_at=f"2026-11-21T10:0{started}:00")
    return Row(f"run{started}", rec)


def test_an_experiments_repeats_are_pooled_only_when_they_measured_the_same_thing():
    from gpubench.analysis.recommend import latest_per_setup

    sgd = [mlflow_run(980.0, 1), mlflow_run(600.0, 2, seed=3, warmup_steps=9, monitor=False)]
    adamw = mlflow_run(1000.0, 3, optimizer="adamw", grad_accum_steps=4)
    # one row per setup, the newest of the longest; the train step's knobs (bench.optimizer,
    # bench.grad_accum_steps) set a setup apart as the ranking's columns do: a grid over them
    # kept its newest run alone (before: adamw's, sgd's hidden)
    sgd_row, adamw_row = latest_per_setup([*sgd, adamw])
    assert adamw_row.record is adamw.record and adamw_row.confirms == []
    assert sgd_row.record is sgd[1].record and sgd_row.confirms == [sgd[0].record]

    (out,) = latest_per_setup(sgd)  # only seed, warm-up, monitoring and tracking differ
    assert out.record is sgd[1].record and out.confirms == [sgd[0].record]
    assert sorted(out.pooled) == [600.0, 980.0]
    # a search's trial and its newer confirm runs: the trial's record stands for the row, as in
    # the sweep folder's report (the loader check, cpu %, the rung read it); the rounds pooled
    rounds = [mlflow_run(700.0, 8), mlflow_run(720.0, 9)]
    for r in rounds:
        r.record.rung = Rung.confirm
    trial = mlflow_run(710.0, 7)
    trial.record.rung = Rung.full
    (out,) = latest_per_setup([trial, *rounds])
    assert out.record is trial.record and {id(m) for m in out.confirms} == {
        id(r.record) for r in rounds}

    knobs = [mlflow_run(700.0, 4, lr=0.1), mlflow_run(700.0, 5, cudnn_benchmark=True)]
    assert [r.record for r in latest_per_setup([sgd[0], *knobs])] == [
        sgd[0].record, *(r.record for r in knobs)]
    others = [mlflow_run(700.0, 6, device="NVIDIA A100"), mlflow_run(9.0, 7, steps=20)]
    # another device: not pooled, the newest stands; a shorter run: a row of its own (its
    # bench.steps a column), never hiding nor hidden by the others
    a100, short = latest_per_setup([sgd[0], *others])
    assert a100.record is others[0].record and a100.confirms == []
    assert short.record is others[1].record and short.confirms == []

    # measured another way (another window plan, a cap that cut one short): a row each (a
    # stable full run vanished behind a newer one cut short)
    for other in ({"repeats": 2}, {"max_seconds": 0.3}, {"min_window_s": 0.5}):
        rows = latest_per_setup([sgd[0], mlflow_run(500.0, 9, **other)])
        assert sorted(r.record.images_per_sec for r in rows) == [500.0, 980.0], other
        assert all(r.confirms == [] for r in rows)

    # a fault injected ran another thing: a row of its own, never pooled nor hiding the run
    stalled = mlflow_run(300.0, 8)
    stalled.record.config["fault"]["stall_every"] = 5
    older_stalled = mlflow_run(300.0, 0)
    older_stalled.record.config["fault"]["stall_every"] = 5
    for runs in ([sgd[0], stalled], [older_stalled, sgd[0]]):
        assert [(r.record, r.confirms) for r in latest_per_setup(runs)] == [
            (r.record, []) for r in runs]


def test_a_grid_folders_repeats_are_one_row_as_in_an_mlflow_experiment(tmp_path):
    """A folder holding a grid twice (two sweeps reported from their parent) ranked each repeat
    as a row of its own while the same runs in MLflow were one row, the repeat pooled: both
    sources rank one row per setup now, with the same pooled figure."""
    from gpubench.analysis.recommend import latest_per_setup
    from gpubench.report.write import sweep_report

    runs = {"a/0": mlflow_run(980.0, 1), "a/1": mlflow_run(500.0, 2, optimizer="adamw"),
            "b/0": mlflow_run(900.0, 3), "b/1": mlflow_run(520.0, 4, optimizer="adamw")}
    for name, r in runs.items():
        r.record.dir = tmp_path / name
        r.record.dir.mkdir(parents=True)
        r.record.save()
    sweep_report(tmp_path, quiet=True)
    ranking = list(csv.DictReader((tmp_path / "report" / "ranking.csv").open()))
    assert [(x["run"], x["img/s"], x["rung"]) for x in ranking] == [
        ("b/0", "940.0", "run+1 confirm"), ("b/1", "510.0", "run+1 confirm")]
    from_mlflow = sorted(latest_per_setup(list(runs.values())), key=lambda r: -r.throughput)
    assert [r.throughput for r in from_mlflow] == [940.0, 510.0]


# --------------------------------------------------------------------------- like with like


def trained(model, ips, started, batch=64, rung="run", phases=None, stable=None, ci=None,
            precision="fp32", image_size=64) -> Row:
    """A run of one training setup (model, dataset, image size) as an experiment holds it; a
    loader-only run (`phases=["loader"]`) measured its loader's figure and no e2e one."""
    bench = {"steps": 50, **({"phases": phases} if phases else {})}
    e2e = phases is None or "e2e" in phases
    rec = RunRecord(status=Status.ok, images_per_sec=ips if e2e else None,
                    loader_images_per_sec=None if e2e else ips, images_per_sec_ci=ci,
                    peak_memory_fraction=0.3, memory_ceiling=0.8, measurement_stable=stable,
                    config={"model": {"name": model},
                            "dataset": {"name": "synthetic", "image_size": image_size},
                            "loader": {"batch_size": batch, "num_workers": 2},
                            "precision": {"name": precision}, "bench": bench},
                    env={"device": "cuda"}, started_at=f"2026-11-21T10:{started:02d}:00",
                    rung=rung)
    return Row(f"{model}-{started}", rec)


def test_only_full_training_measurements_of_one_setup_are_ranked_and_recommended():
    from gpubench.analysis.select import training_rows

    tiny = [trained("tiny", 3959.3, 1), trained("tiny", 3500.0, 2, batch=32)]
    loader_only = trained("tiny", 8333.7, 3, phases=["loader"])
    probe = trained("tiny", 22276.3, 4, batch=512, rung="probe", precision="amp_bf16")
    screen = trained("tiny", 9000.0, 5, rung="screen")
    rows = [*tiny, loader_only, probe, screen]
    kept, notes = training_rows(rows)
    assert kept == tiny
    assert notes == ["left out 3 runs that are no full training measurement: 1 run without "
                     "an e2e phase (loader-only or compute-only), 1 max-batch probe, 1 screen"]
    rec = recommend(rows)  # the rule itself never picks a loader figure or a probe
    assert rec.best is tiny[0] and rec.chosen in tiny
    # (the loader check may quote a loader-only run: it is the loader phase's view)
    assert not any("22276" in x or "8333" in x for x in rec.reasons
                   if not x.startswith("loader check"))
    assert not any("AMP" in x for x in rec.reasons)  # the only AMP run was a probe
    # a run that crashed before its e2e phase is a failed training measurement: still ranked
    crashed = trained("tiny", 0.0, 6)
    crashed.record.status, crashed.record.images_per_sec = Status.oom, None
    assert training_rows([*tiny, crashed])[0] == [*tiny, crashed]

    # setups are never ranked against each other: the newest run's, the others named
    r50 = [trained("resnet50", 410.0, 7), trained("resnet50", 400.0, 8, image_size=224)]
    kept, notes = training_rows([*tiny, *r50])
    assert kept == [r50[1]]
    assert len(notes) == 1 and "model.name=resnet50" in notes[0] and "224" in notes[0]
    assert "model.name=tiny dataset.name=synthetic dataset.image_size=64 (2 runs)" in notes[0]
    assert "--where" in notes[0]
    # the newest run failed: the newest that measured names the setup ranked (a failed job's
    # setup alone read "no feasible full-length measurement" beside runs that measured)
    failed = trained("resnet50", 0.0, 9, image_size=224)
    failed.record.status, failed.record.images_per_sec = Status.failed, None
    kept, notes = training_rows([*tiny, failed])
    assert kept == tiny and "(the newest measured run's setup)" in notes[0]
    older = trained("tiny", 0.0, 8)
    older.record.status, older.record.images_per_sec = Status.failed, None
    kept, notes = training_rows([older, failed])  # none measured: the newest run's
    assert kept == [failed] and "(the newest run's setup)" in notes[0]


def test_a_custom_models_class_is_its_setup_everywhere():
    """`model=custom` names every team model `custom`: its class tells two apart, in the
    report's ranking, the machine comparison, the console title and the MLflow run name."""
    from gpubench.analysis.select import setup_text, training_rows, workload_text
    from gpubench.report.compare import compare_rows
    from gpubench.tracking.translate import run_name

    mine, theirs = trained("custom", 300.0, 1), trained("custom", 900.0, 2)
    mine.record.config["model"]["_target_"] = "team.nets.Small"
    theirs.record.config["model"]["_target_"] = "team.nets.Large"
    for r in (mine, theirs):
        r.flat = {}
        r.__post_init__()
    kept, notes = training_rows([mine, theirs])
    assert kept == [theirs]  # the newest setup only: never ranked against the other class
    assert "model._target_=team.nets.Small" in notes[0] and "--where model._target_=" in notes[0]
    assert workload_text(mine.record) == "model team.nets.Small, dataset synthetic, 64 px"
    assert set(compare_rows([mine.record, theirs.record], {})) == {
        workload_text(mine.record), workload_text(theirs.record)}
    assert setup_text(mine.record).startswith("team.nets.Small on synthetic 64px, batch 64")
    assert run_name(mine.record).startswith("Small-bs64-w2-fp32 ")


def test_where_filters_rows_before_anything_else():
    from gpubench.analysis.select import WhereError, parse_where, where

    rows = [trained("tiny", 100.0, 1), trained("resnet50", 50.0, 2, batch=32),
            trained("resnet50", 60.0, 3, precision="amp_bf16")]
    cond = parse_where(["model.name=resnet50", "loader.batch_size=64"])
    assert cond == {"model.name": "resnet50", "loader.batch_size": "64"}
    assert where(rows, cond) == [rows[2]]
    assert where(rows, {}) == rows
    for bad in (["model.name"], ["=x"]):
        with pytest.raises(WhereError) as e:
            parse_where(bad)
        assert bad[0] in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(WhereError) as e:  # a typo: one line naming it and the close keys
        where(rows, {"model.nme": "tiny"})
    assert "model.nme" in str(e.value) and "model.name" in str(e.value)


@pytest.mark.parametrize("where, code", [("model.name", 2), ("model.nme=tiny", 2),
                                         ("loader.in_order=true", 1)])
def test_a_bad_where_is_one_line_from_the_command(where, code, tmp_path, capsys):
    """analysis.select raises its typed error; the report's command line prints its one line
    and exits 2 where it is malformed or names a key gpubench never declares (bad input, as
    every other bad flag), 1 where the runs lack a declared key (recorded before it existed),
    as for a folder with nothing to report."""
    from gpubench.report.cli import main

    sweep = tmp_path / "sweep"
    shutil.copytree(ROOT / "tests" / "golden" / "fixtures" / "sweep", sweep)
    assert main([str(sweep), "--where", where]) == code
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gpubench.report: --where ") and where.partition("=")[0] in line


def test_a_key_given_twice_to_where_is_refused_not_the_last_kept(tmp_path, capsys):
    from gpubench.report.cli import main

    sweep = tmp_path / "sweep"
    shutil.copytree(ROOT / "tests" / "golden" / "fixtures" / "sweep", sweep)
    args = [str(sweep), "--where", "loader.batch_size=4", "--where", "loader.batch_size=8"]
    assert main(args) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "loader.batch_size is given twice (4 and 8)" in line


def test_the_fastest_figures_true_reason_is_given():
    # stable on its own measurement, but the confirm step re-measured another trial
    once = row(128, 2, ips=4483.4, ci=[4400.0, 4560.0], stable=True)
    steady = row(64, 2, ips=4000.0, ci=[3950.0, 4050.0], stable=True)
    steady.confirms = [_again(steady, 4010.0, [3960.0, 4060.0])]
    rec = recommend([once, steady])
    assert rec.best is steady
    [why] = [x for x in rec.reasons if once.label in x]
    assert "unconfirmed" in why and "unstable" not in why
    # disturbed on its own measurement: unstable, with its noise reasons
    noisy = row(128, 2, ips=4483.4, stable=False)
    noisy.record.noise_reasons = [Reason(Flaw.disturbed, "host CPU busy 97%")]
    [why] = [x for x in recommend([noisy, steady]).reasons if noisy.label in x]
    assert "measured unstable (host CPU busy 97%)" in why
    # re-measured and found to disagree
    lucky = row(128, 2, ips=4483.4, ci=[4400.0, 4560.0], stable=True)
    lucky.confirms = [_again(lucky, 4300.0, [4290.0, 4310.0])]
    [why] = [x for x in recommend([lucky, steady]).reasons if lucky.label in x]
    assert "disagreed" in why and "unstable" not in why


def test_a_mistyped_folder_is_one_line(tmp_path, capsys, monkeypatch):
    from gpubench.report.cli import main

    for source in (f"{tmp_path}/multirun/nope", "./nope", "~/no-such-gpubench-dir"):
        assert main([source]) == 1
        err = capsys.readouterr().err.strip()
        assert err == f"gpubench.report: no such folder: {source}"
    # a bare name that is a folder without runs (the package in the project's root) is the
    # MLflow experiment of that name
    (tmp_path / "gpubench").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["gpubench", "--tracking-uri", sqlite_store(tmp_path / "mlflow.db")]) == 1
    assert "no MLflow experiment 'gpubench'" in capsys.readouterr().err.strip().splitlines()[-1]
    # a bare name with no store to read it from: what the name is not, both ways
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["nope"]) == 1 and capsys.readouterr().err.startswith(
        "gpubench.report: 'nope' is neither a folder nor an experiment: no MLflow store at ")
    assert main(["gpubench"]) == 1 and capsys.readouterr().err.startswith(
        "gpubench.report: 'gpubench' holds no runs (no results.json under it) and is no "
        "experiment: no MLflow store at ")


def test_part_of_an_experiment_is_reported_beside_the_whole(tmp_path, monkeypatch):
    """`--parent X` / `--study S` write their own folder, never over the experiment's."""
    from mlflow.tracking import MlflowClient

    from gpubench.report.cli import main

    uri = sqlite_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("exp", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(exp).info.run_id
    for i, r in enumerate([trained("tiny", 100.0, 1), trained("tiny", 90.0, 2, batch=32),
                           trained("resnet50", 40.0, 3),
                           trained("resnet50", 9000.0, 4, phases=["loader"])]):
        tags = {"study": "s1"} | ({"mlflow.parentRunId": parent} if i == 1 else {})
        run = client.create_run(exp, tags=tags, start_time=1000 + i)
        r.record.dir = tmp_path / f"run{i}"
        r.record.dir.mkdir()
        client.log_artifact(run.info.run_id, str(r.record.save()))
        client.set_terminated(run.info.run_id)
    monkeypatch.chdir(tmp_path)
    reports = tmp_path / "outputs" / "reports"
    assert main(["exp", "--tracking-uri", uri]) == 0
    assert main(["exp", "--tracking-uri", uri, "--parent", parent]) == 0
    assert main(["exp", "--tracking-uri", uri, "--study", "s1"]) == 0
    assert main(["exp", "--tracking-uri", uri, "--where", "model.name=tiny"]) == 0
    whole = json.loads((reports / "exp" / "summary.json").read_text())
    tiny = json.loads((reports / "exp-model.name=tiny" / "summary.json").read_text())
    assert tiny["rows"] == 2  # beside the whole experiment's, which it no longer overwrites
    part = json.loads((reports / f"exp-parent-{parent[:8]}" / "summary.json").read_text())
    study = json.loads((reports / "exp-study-s1" / "summary.json").read_text())
    assert part["rows"] == 1 and study["rows"] == 1  # ranked rows: one setup, e2e only
    assert tiny["best"]["images_per_sec"] == 100.0 and whole["best"]["images_per_sec"] == 40.0
    # the study's report ranks the newest run's setup (resnet50) without its loader-only run
    assert study["best"]["images_per_sec"] == 40.0
    assert any("left out 1 run that is" in x for x in study["lines"])
    assert any("model.name=tiny" in x and "--where" in x for x in study["lines"])


@pytest.mark.slow
def test_an_experiments_report_leaves_max_batch_probes_out(tmp_path, capsys):
    """A max-batch search logged to the same MLflow experiment as a training run: its probes are
    tagged with their rung and the experiment's report ranks the training run only."""
    from conftest import TINY
    from mlflow.tracking import MlflowClient

    from gpubench.report.cli import main

    tiny = [o for o in TINY if not o.startswith("tracking=")]
    sqlite_store(tmp_path / "outputs" / "mlflow.db")  # the default store, already migrated
    p = run_cli(*tiny, "tracking=mlflow", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    p = run_cli("sweep=max_batch", *tiny, "tracking=mlflow", "loader.batch_size=4",
                "fault.oom_above_batch=4", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                "hydra.sweeper.report=false", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("gpubench").experiment_id])
    probes = [r for r in runs if r.data.tags.get("rung") == "probe"]
    assert len(probes) >= 2 and len(runs) == 1 + 1 + len(probes)  # a run, a parent, probes
    capsys.readouterr()
    assert main(["gpubench", "--tracking-uri", uri, "--out", str(tmp_path / "rep")]) == 0
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["rows"] == 1
    assert f"{len(probes)} max-batch probes" in summary["lines"][0]


@pytest.mark.parametrize("value", ["nan", "inf", "-0.1", "1", "abc"])
def test_a_meaningless_tolerance_is_one_line_and_exit_2(value, capsys):
    from gpubench.report.cli import main

    with pytest.raises(SystemExit) as e:
        main(["some/dir", "--tolerance", value])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert err.count("\n") == 0 and f"--tolerance={value} is not allowed: it must be a number in [0, 1)" in err


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("terminal", [True, False])
def test_the_run_table_never_splits_a_figure_and_a_log_folds_no_line(width, terminal):
    from rich.console import Console

    from gpubench.report.console import print_result

    rec = RunRecord.from_dict(json.loads((ROOT / "tests" / "golden" / "fixtures" / "run.json")
                                         .read_text()), run_dir=Path("RUN"))
    buf = io.StringIO()  # a terminal, or not: `python -m gpubench > log.txt`
    print_result(rec, Console(file=buf, width=width, force_terminal=terminal, highlight=False,
                              color_system=None))
    text = buf.getvalue()
    out = text.splitlines()
    table = [ln for ln in out if ln[:1] in "┏┃┡│└"]
    assert len(table) == 7 and max(len(ln) for ln in table) <= width  # one header line
    assert "…" not in text
    for figure in ("1,265.3", "1,173-1,945", "1,456.8", "184.4-828.7", "646.8"):
        assert sum(figure in ln for ln in table) == 1, figure
    left = [ln for ln in out if ln.startswith("(p")]
    if width == 80:  # what gave way is named
        assert left and "p95 ms" in left[0]
    else:
        assert not left and "steps (windows)" in table[1]
    if not terminal:
        (verdict,) = [i for i, ln in enumerate(out) if ln.startswith("narrowest pipe:")]
        assert out[verdict].endswith("instead of overlapping")  # one line, however long
        assert out[verdict + 1].startswith("  1. loader.num_workers=2")


@pytest.mark.parametrize("width", [60, 160])
def test_the_cut_short_footnote_goes_with_the_column_that_holds_its_star(width):
    """A narrow terminal drops `steps (windows)`, where a cut window's count has its `*`: the
    footnote `* window closed by ...` went on alone, pointing at nothing."""
    from rich.console import Console

    from gpubench.report.console import CUT_NOTE, print_result

    d = json.loads((ROOT / "tests" / "golden" / "fixtures" / "run.json").read_text())
    d["phases"]["e2e"]["truncated"] = True
    buf = io.StringIO()
    print_result(RunRecord.from_dict(d, run_dir=Path("RUN")),
                 Console(file=buf, width=width, highlight=False, color_system=None))
    out = buf.getvalue()
    star = any("*" in ln for ln in out.splitlines() if ln[:1] == "│")
    assert star == (width == 160) and (CUT_NOTE.strip() in out) == star


def test_a_run_too_short_for_its_cpu_share_says_so_and_keeps_its_peak_rss():
    """Windows of a few ms give no CPU figure (CPU time counts 10 ms ticks): the line says
    why and what lengthens them, and the peak RSS, measured all the same, stays."""
    from gpubench.report.console import _device_lines

    d = json.loads((ROOT / "tests" / "golden" / "fixtures" / "run.json").read_text())
    (shown,) = [ln for ln in _device_lines(d) if "peak RSS" in ln]
    assert shown.startswith("host CPU during e2e: 71% of 2 cores")  # the headline phase's
    d |= dict.fromkeys(("host_cpu_util_mean", "process_cpu_util_mean", "main_cpu_util_mean",
                        "workers_cpu_util_mean"))
    (shown,) = [ln for ln in _device_lines(d) if "peak RSS" in ln]
    assert shown.startswith("host CPU not read: the windows cover under 0.2 s")
    assert "bench.min_window_s" in shown and shown.endswith(
        "peak RSS 0.83 GiB over the run (main + workers)")


def test_a_row_is_named_by_its_folder_as_seen_from_the_sweep_dir(tmp_path):
    """A study two workers share holds jobs of both sweep dirs: the other worker's `0` must not
    read as this dir's `0` (both showed as run 0 in one ranking)."""
    from gpubench.report.write import on_disk

    def at(d: Path) -> Row:
        return Row("0", RunRecord(run_uid="", status=Status.ok, dir=d))

    root = tmp_path / "a"
    assert on_disk(at(root / "0"), root) == "0"
    assert on_disk(at(root / "10-00-00" / "3"), root) == "10-00-00/3"
    assert on_disk(at(tmp_path / "b" / "0"), root) == "../b/0"
    assert on_disk(at(root), root) is None


def test_a_cpu_run_over_the_ceiling_is_not_told_of_a_cuda_only_precision():
    from gpubench.report.console import verdict

    rec = RunRecord(status=Status.over_ceiling, env={"device": "cpu"},
                    config={"loader": {"batch_size": 8}, "model": {"name": "tiny"},
                            "precision": {"name": "fp32"}})
    text = "\n".join(verdict(rec))
    assert "precision=amp_bf16: mixed precision halves the activations" in text
    assert "amp_fp16" not in text  # refused on a CPU
    rec.env["device"] = "cuda"
    assert "precision=amp_bf16 (or amp_fp16)" in "\n".join(verdict(rec))


def test_the_utilization_lines_name_the_phase_they_were_read_in():
    """GPU and host CPU figures are the headline phase's (run.summary.HEADLINE_TELEMETRY), not
    the run's: the line says which; the peak RSS is the whole run's and says so."""
    from gpubench.report.console import _device_lines

    d = json.loads((ROOT / "tests" / "golden" / "fixtures" / "run.json").read_text())
    d.update(gpu_util_mean=31.0, gpu_util_max=97.0, gpu_mem_util_mean=12.0, power_mean_w=240.0,
             energy_per_image_j=0.05)
    gpu, cpu = [ln for ln in _device_lines(d) if ln.startswith(("GPU", "host CPU"))]
    assert gpu.startswith("GPU during e2e: util mean 31% (max 97%), memory util 12%, power 240 W")
    assert cpu.startswith("host CPU during e2e: ") and "peak RSS 0.83 GiB over the run" in cpu
    del d["phases"]["e2e"]
    assert _device_lines(d)[0].startswith("GPU during compute: ")


def _flagged(batch, ips, reasons, bench=None, phases=None, tmp=None) -> RunRecord:
    """A CPU run of a batch size that flagged its own measurement (`reasons`), leaning overlap."""
    return RunRecord(status=Status.ok, images_per_sec=ips, images_per_sec_ci=[0.5 * ips, 1.5 * ips],
                     peak_memory_fraction=0.03, memory_ceiling=0.8, measurement_stable=False,
                     noise_reasons=list(reasons), bottleneck="inconclusive",
                     extra={"verdict_leaning": "overlap"}, phases=phases or {},
                     config={"loader": {"batch_size": batch, "num_workers": 0},
                             "precision": {"name": "fp32"},
                             "bench": bench or {"steps": 6, "repeats": 6, "max_seconds": 60.0,
                                                "phases": ["loader", "compute", "e2e"]}},
                     env={"device": "cpu"}, dir=tmp)


def test_every_measure_longer_of_a_cut_short_run_is_the_one_rule(tmp_path):
    """`-m bench.steps=600 bench.repeats=6 bench.max_seconds=0.3`: every compute window ran 1 of
    its 100 steps. The console's and results.json's advice said `bench.steps=2400
    bench.repeats=10` (cut short again at the same cap), the report and recommended.yaml added
    `bench.max_seconds=120`: every reader now gives core.record.longer's, the verdict's `would
    decide` too (its own steps, the cap they need)."""
    from gpubench.analysis.noise import remedies
    from gpubench.analysis.verdict import Knobs, judge
    from gpubench.core.record import PhaseRecord, longer
    from gpubench.report.write import experiment_yaml, write_report

    cut = Reason(Flaw.cut_short, "compute: windows 1, 2, 3, 4, 5, 6 cut short by "
                                 "bench.max_seconds before bench.steps")
    bench = {"steps": 600, "repeats": 6, "max_seconds": 0.3, "phases": ["compute", "e2e"]}
    phases = {n: PhaseRecord(n, 4, steps=6, truncated=True) for n in ("compute", "e2e")}
    rec = _flagged(4, 50.0, [cut], bench, phases, tmp_path / "0")
    # 120 s at the pace measured, with core.record.CAP_HEADROOM (1.5x) to spare
    want = "bench.steps=2400 bench.repeats=10 bench.max_seconds=180"
    assert str(longer(rec)) == want
    knobs = Knobs(device="cpu", num_workers=0, cpu_count=2, pin_memory=False, preload=False,
                  augment_on="cpu", precision="fp32", channels_last=False, compile="off",
                  batch_size=4, dataset="synthetic", memory_fraction=0.03, ceiling=0.8)
    # the console's and results.json's advice (run.summary: the remedies of its reasons)
    advice = judge(400, 60, 50, 0.1, knobs, noise_reasons=[cut],
                   remedies=remedies([cut], [], rec), record=rec).advice
    assert any(a.startswith(f"{want}: more and longer windows") for a in advice), advice
    assert judge(400, 60, 50, 0.1, knobs, noise_reasons=[cut], record=rec).advice[0].startswith(
        want)  # no remedies given: the same
    # a question the intervals leave open: the windows that would decide it, and their cap
    open_ = judge(2232, 56.7, 52.7, None, knobs, intervals={
        "loader": [1905, 3125], "compute": [51.7, 58.7], "e2e": [48.0, 56.0]}, record=rec)
    assert any(a.startswith("bench.steps=1500 bench.repeats=15 bench.max_seconds=113: about 15 "
                            "windows of 100 steps would decide") for a in open_.advice), open_.advice
    # the report's rerun line and recommended.yaml's bench comment
    rows = [Row("0", rec)]
    assert f"to measure longer, add {want} to the rerun command" in experiment_yaml(
        rows[0], "src", recommend(rows))
    write_report(rows, tmp_path / "report", "src", quiet=True)
    lines = json.loads((tmp_path / "report" / "summary.json").read_text())["lines"]
    assert any(f"add {want} to measure longer)" in ln for ln in lines), lines


@pytest.mark.parametrize("kind, word, rerun", [
    (Flaw.few_windows, "too few windows", "measuring longer"),
    (Flaw.cut_short, "cut short", "measuring longer"),
    (Flaw.too_short, "too short", "measuring longer"),
    (Flaw.warmup, "warm-up unsettled", "measuring longer"),
    (Flaw.disturbed, "disturbed", "on a quiet machine"),
    (Flaw.gpu, "disturbed", "on a quiet machine"),
])
def test_a_flawed_runs_kinds_word_its_standing_and_remedy_alike_everywhere(kind, word, rerun):
    """Runs flagged only with too few windows (or cut short) were `disturbed` in the ranking,
    on the console (`but the run was disturbed`) and in the recommendation (`rerun ... on a quiet
    machine`), `too few windows` in the plots' legend: their remedy is a longer measurement.
    Every reader words a flaw and its remedy from one mapping (analysis.labels.FLAWS)."""
    from gpubench.report.console import verdict
    from gpubench.report.plot_data import curve_data, pareto_data

    reason = Reason(kind, "e2e: words that name no kind")
    rows = [Row(str(i), _flagged(b, ips, [reason])) for i, (b, ips) in enumerate(((4, 100.0),
                                                                                  (8, 150.0)))]
    wrong = {"measuring longer": "on a quiet machine", "on a quiet machine": "measuring longer"}
    head, body = table_rows(rows, ["loader.batch_size"], screen=True)
    assert [b[2] for b in body] == [word, word]  # the ranking's status
    assert [b[8] for b in table_rows(rows, ["loader.batch_size"])[1]] == [word, word]  # csv
    caveat = recommend(rows).reasons[0]
    assert caveat.startswith(f"UNCONFIRMED: every measurement flagged itself ({word}; "
                             f"results.json noise_reasons); rerun the recommended config {rerun}")
    assert wrong[rerun] not in caveat
    if rerun == "measuring longer":  # with the chosen run's own "measure longer": windows
        # too brief to judge get a least duration too, as the console's advice says
        brief = " bench.min_window_s=0.5" if kind is Flaw.too_short else ""
        assert caveat.endswith(f"measuring longer (bench.steps=24 bench.repeats=10{brief}) "
                               "before trusting it")
    line = next(ln for ln in verdict(rows[0].record) if "narrowest pipe" in ln)
    assert f"(the figures lean to overlap, but the run was flagged: {word}; rerun {rerun})" in line
    curve = curve_data(rows, "batch_size", "batch size", log2=True)
    assert curve["title"].endswith(f"every full run flagged its own measurement (rerun {rerun})")
    assert curve["flagged_label"].startswith(f"flagged run ({word}):")
    assert f"(rerun {rerun})" in " ".join(pareto_data(rows)["title"].split())


def test_the_run_table_heads_its_phases_intervals_with_their_coverages():
    """In a job that failed after 8 windows loader and compute kept 3 windows (75% intervals),
    e2e 2 (50%): the console's column read `50% interval` over all three, as did MLflow's
    description; it is their span, `50-75% interval`."""
    from rich.console import Console

    from gpubench.report.console import print_result
    from gpubench.tracking.translate import describe

    d = json.loads((ROOT / "tests" / "golden" / "fixtures" / "run.json").read_text())
    for name, c in (("loader", 0.75), ("compute", 0.75), ("e2e", 0.5)):
        d["phases"][name]["images_per_sec_ci_coverage"] = c
    rec = RunRecord.from_dict(d, run_dir=Path("RUN"))
    buf = io.StringIO()
    print_result(rec, Console(file=buf, width=200, highlight=False, color_system=None))
    assert "50-75% interval" in buf.getvalue() and "┃ 50% interval" not in buf.getvalue()
    assert "| phase | images/sec | 50-75% interval | data wait |" in describe(rec)
    for name in ("loader", "compute"):
        d["phases"][name]["images_per_sec_ci_coverage"] = 0.5
    assert "| 50% interval |" in describe(RunRecord.from_dict(d))


def test_the_to_answer_command_of_an_mlflow_report_names_its_store():
    """Run as printed, the workers answer's command failed: it dropped --tracking-uri."""
    from gpubench.report.write import Source

    src = Source("my exp", mlflow=True, uri="postgresql://u:secret@db/mlflow")
    assert src.args == "'my exp' --tracking-uri 'postgresql://u:***@db/mlflow'"
    assert str(src) == "mlflow experiment my exp" and Source("runs/a").args == "runs/a"
