"""sweep=pipes (gpubench.search.pipes): the rules on constructed records, then the whole search
through the CLI: compute pipe, data pipe, join, report, resume after kill -9, two workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from conftest import TINY, run_cli, sqlite_store, start_process

from gpubench.analysis.recommend import Row
from gpubench.analysis.workers import Feeds, fewest_workers
from gpubench.config.errors import ConfigError
from gpubench.core.record import RunRecord, Status
from gpubench.core.stats import Est
from gpubench.search.pipes import (
    check_space,
    choose_data,
    confirm_top,
    contends,
    cost,
    data_walk,
    effective,
    grid,
    join_bound,
    keep_compute,
    lines,
)
from gpubench.search.space import parse_search_space
from gpubench.search.study import measured_trials

DATA_KEYS = ("loader.num_workers", "loader.pin_memory", "loader.prefetch_factor",
             "dataset.preload")


def compute_row(batch: int, ips: float, ci, status=Status.ok, peak=0.3) -> tuple[dict, Row]:
    rec = RunRecord(status=status, compute_images_per_sec=ips, compute_images_per_sec_ci=ci,
                    peak_memory_fraction=peak, memory_ceiling=0.8,
                    config={"loader": {"batch_size": batch}, "bench": {"phases": ["compute"]}})
    return {"loader.batch_size": batch}, Row(str(batch), rec)


def loader_row(params: dict, ips: float, ci) -> tuple[dict, Row]:
    rec = RunRecord(status=Status.ok, loader_images_per_sec=ips, loader_images_per_sec_ci=ci,
                    config={"bench": {"phases": ["loader"]}})
    return params, Row("x", rec)


def e2e_row(ips: float, ci, stable: bool = True) -> Row:
    rec = RunRecord(status=Status.ok, images_per_sec=ips, images_per_sec_ci=ci,
                    measurement_stable=stable, config={"bench": {"phases": ["e2e"]}})
    return Row(str(ips), rec)


# ------------------------------------------------------------------ the rules


def test_the_join_confirms_only_pairings_one_measurement_leaves_open():
    # overlapping but within 5% of each other: either is an accepted answer, no rounds
    assert confirm_top([e2e_row(100.0, [95, 105]), e2e_row(97.0, [93, 101])], 0.05) == 0
    # more than 5% apart but the intervals part: ordered by one measurement each
    assert confirm_top([e2e_row(100.0, [98, 102]), e2e_row(80.0, [78, 82])], 0.05) == 0
    # more than 5% apart and overlapping: both re-measured
    assert confirm_top([e2e_row(80.0, [70, 95]), e2e_row(100.0, [90, 110])], 0.05) == 2
    # the leader down to the last open one, a settled one between them included
    rows = [e2e_row(100.0, [90, 110]), e2e_row(98.0, [97, 99]), e2e_row(50.0, [49, 51]),
            e2e_row(85.0, [75, 91])]
    assert confirm_top(rows, 0.05) == 3
    # one pairing: re-measured only when its own run was disturbed; nothing measured: none
    assert confirm_top([e2e_row(100.0, [98, 102])], 0.05) == 0
    assert confirm_top([e2e_row(100.0, [98, 102], stable=False)], 0.05) == 1
    assert confirm_top([], 0.05) == 0


def test_split_puts_data_keys_on_the_data_pipe_and_the_rest_on_compute():
    space = parse_search_space(["loader.batch_size=choice(32,64)", "precision=choice(fp32,amp_bf16)",
                                "loader.num_workers=choice(0,2)", "dataset.preload=choice(false,true)",
                                "model=resnet18"])
    compute, data = check_space(space, DATA_KEYS)
    assert [p.name for p in compute.params] == ["loader.batch_size", "precision"]
    assert [p.name for p in data.params] == ["loader.num_workers", "dataset.preload"]
    assert compute.fixed == data.fixed == ["model=resnet18"]
    assert len(grid(compute.params)) == 4 and len(grid(data.params)) == 4
    assert grid(parse_search_space(["bench.max_seconds=interval(1,2)"]).params) is None


def test_a_pipes_space_needs_a_knob_of_each_pipe_and_a_data_grid():
    with pytest.raises(ConfigError, match="none is a data knob"):
        check_space(parse_search_space(["loader.batch_size=choice(32,64)"]), DATA_KEYS)
    with pytest.raises(ConfigError, match="none is a compute knob"):
        check_space(parse_search_space(["loader.num_workers=choice(0,2)"]), DATA_KEYS)
    continuous = parse_search_space(["loader.batch_size=choice(32,64)",
                                     "bench.max_seconds=interval(1,2)"])
    with pytest.raises(ConfigError, match=r"data keys as choice\(...\)"):
        check_space(continuous, ("bench.max_seconds",))
    compute, data = check_space(parse_search_space(["loader.batch_size=choice(32,64)",
                                                    "loader.num_workers=choice(0,2)"]), DATA_KEYS)
    assert ([p.name for p in compute.params], [p.name for p in data.params]) == (
        ["loader.batch_size"], ["loader.num_workers"])


def test_data_settings_are_ordered_cheapest_first():
    space = parse_search_space(["loader.num_workers=choice(4,0,2)",
                                "dataset.preload=choice(true,false)",
                                "loader.prefetch_factor=choice(4,2)"])
    points = sorted(effective(grid(space.params)), key=lambda p: cost(p, space.params))
    # fewer workers first; at equal workers no preload first, then the smaller prefetch
    assert [(p["loader.num_workers"], p["dataset.preload"]) for p in points[:2]] == [
        (0, False), (0, True)]
    assert [(p["loader.num_workers"], p["dataset.preload"], p["loader.prefetch_factor"])
            for p in points[2:4]] == [(2, False, 2), (2, False, 4)]
    # with 0 workers prefetch is inert: one 0-worker point per preload value, not two
    assert len(points) == 2 + 2 * 2 * 2
    assert sum(p["loader.num_workers"] == 0 for p in points) == 2
    # on a CPU (bench.device=cpu on the command line) pin_memory does nothing: one point, not a
    # trial spent on each setting
    cpu = parse_search_space(["loader.num_workers=choice(0,2)", "bench.device=cpu",
                              "loader.pin_memory=choice(true,false)"])
    assert len(effective(grid(cpu.params))) == 4
    assert len(effective(grid(cpu.params), cpu.fixed_values)) == 2


def test_keep_compute_takes_the_fastest_and_the_smallest_batch_near_it():
    rows = [compute_row(32, 900.0, [880, 920]), compute_row(64, 1000.0, [980, 1020]),
            compute_row(128, 1010.0, [990, 1030]), compute_row(256, 0.0, None, Status.oom)]
    kept = keep_compute(rows, "loader.batch_size", 0.05, 2)
    assert [k.params["loader.batch_size"] for k in kept] == [128, 64]
    assert kept[0].why == "the fastest compute setting" and "smallest batch" in kept[1].why
    assert (kept[0].rate.lo, kept[0].rate.hi) == (990, 1030)
    # keep=1: the fastest alone; an OOM or over-ceiling setting is never kept
    assert [k.params["loader.batch_size"] for k in keep_compute(rows, "loader.batch_size", 0.05, 1)] == [128]
    over = [compute_row(512, 5000.0, [4900, 5100], Status.over_ceiling, peak=0.95), *rows]
    assert keep_compute(over, "loader.batch_size", 0.05, 3)[0].params["loader.batch_size"] == 128
    # "within 5%" as the report's recommendation judges it, at the low end of the interval: a
    # median 4% below whose interval reaches 10% below is not the knee (it was, on medians)
    wide = [compute_row(128, 1000.0, [990, 1010]), compute_row(64, 960.0, [900, 1000])]
    kept = keep_compute(wide, "loader.batch_size", 0.05, 2)
    assert [k.why for k in kept] == ["the fastest compute setting", "the next fastest"]


def test_choose_data_takes_the_cheapest_setting_whose_interval_clears():
    space = parse_search_space(["loader.num_workers=choice(0,1,2,4)"]).params
    bound = Est(500.0, 480.0, 520.0)  # to clear: a low end above 520 x 1.05 = 546
    rows = [loader_row({"loader.num_workers": 0}, 300.0, [290, 310]),
            # above the bound on its figure, not on its interval: not cleared
            loader_row({"loader.num_workers": 1}, 560.0, [500, 600]),
            loader_row({"loader.num_workers": 2}, 700.0, [660, 740]),
            loader_row({"loader.num_workers": 4}, 900.0, [860, 940])]
    fed = choose_data(rows, space, bound, 0.05)
    assert fed.params == {"loader.num_workers": 2} and fed.clears
    m = fed.summary()["margin"]
    assert m[0] == pytest.approx(0.4) and m[1] == pytest.approx(660 / 520 - 1)
    # the next setting that clears, past the chosen one (the join's next try)
    nxt = choose_data(rows, space, bound, 0.05, after=cost(fed.params, space))
    assert nxt.params == {"loader.num_workers": 4}
    # none clears: the fastest, and clears False
    slow = choose_data(rows[:2], space, bound, 0.05)
    assert slow.params == {"loader.num_workers": 1} and not slow.clears


def test_a_short_data_pipe_at_its_most_workers_is_told_to_try_more_as_the_workers_answer_is():
    """The workers answer leads its next steps with more workers where the most tried loaded
    fastest; the pipes path gave no such step. The rule within one data setting: the runs alike
    in every other data key (a pin_memory=true setting tried at 1 worker only is at its most)."""
    space = parse_search_space(["loader.num_workers=choice(0,1,2)",
                                "loader.pin_memory=choice(false,true)"]).params
    bound = Est(5000.0, 4900.0, 5100.0)  # nothing clears it

    def run(w, pin, ips):
        rec = RunRecord(status=Status.ok, loader_images_per_sec=ips,
                        loader_images_per_sec_ci=[ips * 0.98, ips * 1.02],
                        config={"bench": {"phases": ["loader"]},
                                "loader": {"num_workers": w, "pin_memory": pin}})
        return {"loader.num_workers": w, "loader.pin_memory": pin}, Row("x", rec)

    kept = {"trials": 1, "kept": []}
    for rows, more in (([run(0, False, 300.0), run(1, False, 600.0), run(2, False, 900.0)], 2),
                       ([run(0, False, 300.0), run(2, False, 500.0), run(1, True, 900.0)], 1),
                       ([run(0, False, 300.0), run(1, False, 900.0), run(2, False, 800.0)], None)):
        fed = choose_data(rows, space, bound, 0.05)
        assert fed.feeds is Feeds.short and fed.more_from == more
        d = {"for": {}, "trials": len(rows), "device": "cuda", "tried": [], **fed.summary()}
        text = "\n".join(lines({"compute": kept, "data": [d]}))
        lead = f"(next: loader.num_workers={2 * more}, " if more else "(next: dataset.preload"
        assert lead in text, text


def test_the_path_names_no_knob_that_does_not_act_in_its_setting():
    """`num_workers=0 persistent_workers=false` read as a setting of two knobs: with no workers
    persistent_workers does nothing, and the path names what acts (a setting that fixes
    workers elsewhere keeps it: its workers are not known here)."""
    d = {"for": {"loader.batch_size": 4}, "trials": 2, "rate": [900, 880, 920],
         "clears": True, "feeds": "clears", "margin": [0.5, 0.4, 0.6],
         "params": {"loader.num_workers": 0, "loader.persistent_workers": False}}
    text = "\n".join(lines({"compute": {"trials": 1, "kept": []}, "data": [d]}))
    assert "num_workers=0: 900" in text and "persistent_workers" not in text, text
    d["params"] = {"loader.persistent_workers": True}
    assert "persistent_workers=true: 900" in "\n".join(lines({"data": [d]}))


def test_the_data_walk_raises_workers_then_turns_one_key_at_a_worker_fewer():
    space = parse_search_space(["loader.num_workers=choice(0,1,2,4)",
                                "loader.pin_memory=choice(false,true)",
                                "loader.prefetch_factor=choice(2,4)"]).params
    points = sorted(effective(grid(space)), key=lambda p: cost(p, space))
    bound = Est(500.0, 490.0, 510.0)  # to clear: a low end above 535.5
    # the loader's rate: 200 per worker, +150 with pinned memory (a made-up host)

    def rate(p):
        v = 100 + 200 * p["loader.num_workers"] + 150 * p["loader.pin_memory"]
        return v, [v - 10, v + 10]

    measured = []
    order = []
    while todo := data_walk(points, space, measured, bound, 0.05):
        for p in todo:
            order.append((p["loader.num_workers"], p["loader.pin_memory"],
                          p["loader.prefetch_factor"]))
            measured.append(loader_row(p, *rate(p)))
            if not data_walk(points, space, measured, bound, 0.05):
                break
    # the workers walk at the cheapest other keys: 2 workers load 500 [490-510], short of
    # 535.5; 4 load 900 and clear. Then one key turned at 2 workers, cheapest first: pinned
    # memory (650 [640-660]) clears, so prefetch 4 is never measured
    assert order[:4] == [(0, False, 2), (1, False, 2), (2, False, 2), (4, False, 2)]
    assert order[4] == (2, True, 2) and len(order) == 5
    fed = choose_data(measured, space, bound, 0.05)
    assert (fed.params["loader.num_workers"], fed.params["loader.pin_memory"]) == (2, True)
    # the whole data space has 1 + 3 x 2 x 2 = 13 settings: the walk measured 5


def test_a_zero_worker_join_is_bounded_by_load_then_step():
    compute, loader = Est(230.0, 228.0, 232.0), Est(2500.0, 2450.0, 2550.0)
    name, b = join_bound(compute, loader, 0)
    assert name == "serial" and b.value == pytest.approx(1 / (1 / 230 + 1 / 2500))
    # 209 img/s with 0 workers is what loading then stepping allows: no contention
    assert not contends(Est(209.0, 207.0, 210.0), b, 0.05)
    # with a worker the pipes overlap: the narrower pipe is the bound, and 190 falls short
    name, b = join_bound(compute, loader, 1)
    assert (name, b) == ("compute", compute)
    assert contends(Est(190.0, 188.0, 192.0), b, 0.05)


def test_a_join_that_falls_short_of_both_pipes_is_contention():
    narrower = Est(500.0, 490.0, 510.0)
    assert contends(Est(400.0, 390.0, 410.0), narrower, 0.05)
    # within the hand-over's tolerance, or an interval reaching the bound: no contention
    assert not contends(Est(470.0, 460.0, 480.0), narrower, 0.05)
    assert not contends(Est(400.0, 300.0, 500.0), narrower, 0.05)


def test_the_path_is_told_in_a_few_lines():
    result = {
        "compute": {"trials": 4, "exhaustive": True, "kept": [
            {"params": {"loader.batch_size": 64}, "rate": [1000, 980, 1020],
             "why": "the fastest compute setting", "peak_memory_fraction": 0.41}]},
        "data": [{"for": {"loader.batch_size": 64}, "trials": 3, "study": "s-data-1",
                  "params": {"loader.num_workers": 2}, "rate": [1200, 1150, 1250],
                  "clears": True, "margin": [0.2, 0.127, 0.276]}],
        "join": {"pairings": [{"compute": {"loader.batch_size": 64},
                               "data": {"loader.num_workers": 2}, "e2e": [700, 680, 720],
                               "narrower": "compute", "bound": [1000, 980, 1020],
                               "contends": True}]},
        "wall_s": {"compute": 40.2, "data": 20.0, "join": 61.0}}
    text = "\n".join(lines(result))
    assert "compute pipe: 4 compute-only trials, every setting" in text
    assert "kept batch_size=64: 1000 [980-1020] img/s, peak memory 41%" in text
    assert "num_workers=2: 1200 [1150-1250] img/s clears compute by 20% [13%-28%]" in text
    assert "e2e 700 [680-720] img/s, 70% of the narrower pipe (compute 1000 [980-1020])" in text
    assert "the pipes contend" in text and "time: compute 40 s, data 20 s, join 61 s" in text
    # a data side that clears no bound is told what acts on the sweep's device (workers.next_steps)
    for device, told, not_told in (("cpu", "more CPU cores)", "augment_on=device"),
                                   ("cuda", "augment_on=device, more CPU cores per GPU)", None)):
        short = {**result["data"][0], "clears": False, "feeds": "short", "rate": [600, 580, 620],
                 "margin": [-0.4, 580 / 1020 - 1, 620 / 980 - 1], "device": device}
        text = "\n".join(lines({**result, "data": [short]}))
        assert "stays the narrower pipe (next: dataset.preload=true, " in text
        assert told in text and (not_told is None or not_told not in text), text


def test_the_path_judges_a_data_setting_as_the_workers_answer_does():
    """The path said `stays the narrower pipe` of any setting that did not clear: of 3324
    [3031-3807] against compute 3114 [2866-3285] too, where the workers answer on the same
    screen said `the intervals overlap, so it is not decided`. One comparison (workers.feeds)
    for both: clears, stays narrower (its whole interval below), or undecided (overlap)."""
    space = parse_search_space(["loader.num_workers=choice(0,1)"]).params
    bound = Est(3114.0, 2866.0, 3285.0)
    kept = [{"params": {"loader.batch_size": 4}, "rate": [3114.0, 2866.0, 3285.0],
             "why": "the fastest compute setting"}]
    for ips, ci, path, answer in (
            (3324.0, [3031.0, 3807.0], "= 107% [92%-133%] of compute: the intervals overlap, so "
             "it is not decided", "the intervals overlap, so it is not decided"),
            (1500.0, [1400.0, 1600.0], "= 48% [43%-56%] of compute: the data side stays the "
             "narrower pipe (next: ", "the data side stays the bottleneck (next: "),
            (4000.0, [3900.0, 4100.0], "clears compute by 28% [19%-43%], the cheapest setting",
             "workers: 0 (loader 4000 [3900-4100] img/s clears compute")):
        fed = choose_data([loader_row({"loader.num_workers": 0}, ips, ci)], space, bound, 0.05)
        d = {"for": {"loader.batch_size": 4}, "trials": 1, **fed.summary()}
        text = "\n".join(lines({"compute": {"trials": 1, "kept": kept}, "data": [d]}))
        assert f"num_workers=0: {Est(ips, *ci)} img/s {path}" in text, text
        assert answer in fewest_workers([(0, ips, ci)], bound).answer()
        # a pipes.json from before the judgement was kept: read from its clears and margin
        old = {k: v for k, v in d.items() if k != "feeds"}
        assert "\n".join(lines({"compute": {"trials": 1, "kept": kept}, "data": [old]})) == text


def test_the_path_advises_no_setting_its_trials_already_ran():
    """`(next: dataset.preload=true, ...)` of a data pipe whose trials all preloaded: a next step
    that sets a knob to a value its trials ran is dropped (pipes.json keeps what they ran)."""
    d = {"for": {"loader.batch_size": 4}, "trials": 2, "params": {"loader.num_workers": 1},
         "rate": [600, 580, 620], "clears": False, "feeds": "short", "device": "cuda",
         "margin": [-0.4, 580 / 1020 - 1, 620 / 980 - 1]}
    kept = {"trials": 1, "kept": []}
    for tried, said in (([{"dataset.preload": True}], "(next: dataset.augment_on=device, more"),
                        ([{"dataset.preload": False, "dataset.augment_on": "device"}],
                         "(next: dataset.preload=true, more CPU cores per GPU)"),
                        ([], "(next: dataset.preload=true, dataset.augment_on=device, more")):
        assert said in "\n".join(lines({"compute": kept, "data": [{**d, "tried": tried}]}))


# ------------------------------------------------------------------ the search, through the CLI

SPACE = ["loader.batch_size=choice(4,8)", "precision=fp32", "channels_last=false",
         "bench.cudnn_benchmark=false", "loader.num_workers=choice(0,1)",
         "loader.pin_memory=false", "loader.prefetch_factor=2"]
PIPES = [*[o for o in TINY if not o.startswith(("bench.steps", "tracking="))],
         "bench.steps=4", "hydra.sweeper.confirm.rounds=1"]


def _cmd(tmp: Path, *extra: str) -> list[str]:
    return ["sweep=pipes", *PIPES, *SPACE,
            f"hydra.sweep.dir={tmp / 'sweep'}",
            f"hydra.sweeper.storage=sqlite:///{tmp / 'optuna.db'}", *extra]


def _jobs(sweep: Path) -> list[dict]:
    return json.loads((sweep / "sweep.json").read_text())["jobs"]


def _studies(tmp: Path) -> dict[str, optuna.Study]:
    m = json.loads((tmp / "sweep" / "sweep.json").read_text())
    return {n.rsplit("-", 1)[-1] if "-data-" not in n else "data-" + n.rsplit("-", 1)[-1]:
            optuna.load_study(study_name=n, storage=m["storage"]) for n in m["studies"]}


@pytest.mark.slow
def test_pipes_measures_each_pipe_then_joins_and_reports(tmp_path):
    p = run_cli(*_cmd(tmp_path, "tracking=mlflow",
                      f"tracking.uri={sqlite_store(tmp_path / 'mlflow.db')}"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    sweep = tmp_path / "sweep"
    jobs = _jobs(sweep)
    by_stage = {s: [j for j in jobs if j.get("stage") == s] for s in ("compute", "data", "join")}
    # every compute setting once (2 batch sizes), compute-only
    assert len(by_stage["compute"]) == 2
    for j in by_stage["compute"]:
        cfg = json.loads((Path(j["dir"]) / "results.json").read_text())["config"]
        assert cfg["bench"]["phases"] == ["compute"]
    # loader-only trials at the kept settings' batch sizes, at most the 2 data points each
    result = json.loads((sweep / "pipes.json").read_text())
    kept = [k["params"]["loader.batch_size"] for k in result["compute"]["kept"]]
    data_batches = set()
    for j in by_stage["data"]:
        cfg = json.loads((Path(j["dir"]) / "results.json").read_text())["config"]
        assert cfg["bench"]["phases"] == ["loader"]
        data_batches.add(cfg["loader"]["batch_size"])
    assert data_batches == set(kept) and len(by_stage["data"]) <= 2 * len(kept)
    # each pairing end to end once; the confirm round (rounds=1) re-measures the top pairings
    # that those runs leave open, by the rule on their first measurements
    full = [j for j in by_stage["join"] if j["rung"] == "full"]
    assert len(full) == len(result["join"]["pairings"])
    firsts = [Row(j["dir"], RunRecord.from_dict(
        json.loads((Path(j["dir"]) / "results.json").read_text()))) for j in full]
    top = confirm_top(firsts, 0.05)
    assert len(by_stage["join"]) - len(full) == top
    assert not (sweep / "compute").exists()  # the compute pipe's runs are the bounds
    # the report tells the path and draws both pipes; its recommendation is a joined run
    report = sweep / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["lines"][0].startswith("search path (sweep=pipes")
    assert any("compute pipe: 2 compute-only trials, every setting" in x
               for x in summary["lines"])
    assert "search path (sweep=pipes" in p.stdout
    for png in ("compute_pipe.png", "data_pipe.png"):
        assert (report / png).stat().st_size > 0
    rec = summary["recommended"]
    assert rec["dir"] in {j["dir"] for j in by_stage["join"]}
    # sweep.json's best is an end-to-end run of the join, never a one-pipe stage's trial
    best = json.loads((sweep / "sweep.json").read_text())["best"]
    assert best["dir"] in {j["dir"] for j in by_stage["join"]}, best
    assert best["dir"] == rec["dir"]  # the run the report recommends
    assert (report / "experiment" / "recommended.yaml").is_file()
    # MLflow: one parent, every job a child of it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 1 + len(jobs)


@pytest.mark.slow
def test_pipes_without_a_data_knob_is_one_line_before_any_job(tmp_path):
    fixed = [o.replace("choice(0,1)", "0") for o in SPACE]
    p = run_cli("sweep=pipes", *PIPES, *fixed, "tracking=none",
                f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    [line] = [x for x in p.stderr.splitlines() if x.strip()]
    assert line.startswith("gpubench: error: hydra.sweeper.params") and "none is a data knob" in line
    assert "watch the study" not in p.stdout  # refused before any study is opened
    assert not [d for d in (tmp_path / "sweep").iterdir() if d.name.isdigit()]


def _wait_for(pred, proc, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_each_stages_seconds_are_written_when_it_ends():
    """pipes.json's wall_s was written with the result at the end: a kill in the join lost the
    data stage's minutes, and the resume's path read `data 0 s`."""
    import copy

    from gpubench.search.pipes import Pipes

    written: list[dict] = []
    p = Pipes(None, None, "s", None, None, None, lambda r: written.append(copy.deepcopy(r)),
              earlier={"compute": 8.0})
    p._spent("compute", time.monotonic() - 1.0)
    assert written[-1]["wall_s"]["compute"] >= 9.0  # this invocation's and the earlier ones'


@pytest.mark.slow
def test_pipes_resumes_after_kill_9_and_shares_its_studies_with_a_second_worker(tmp_path):
    def stage_started(stage: str) -> bool:
        try:
            return any(j.get("stage") == stage for j in _jobs(tmp_path / "sweep"))
        except (OSError, ValueError, KeyError):
            return False

    # beats every 2 s, stale after 10: a kill between Optuna's ask and gpubench's naming (a trial
    # that never beat) is failed at once on sqlite (study.fail_stale), any other after 10 s
    cmd = _cmd(tmp_path, "tracking=none", "hydra.sweeper.report=false",
               "hydra.sweeper.heartbeat_interval=2", "hydra.sweeper.grace_period=10")
    a = start_process(*cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                  start_new_session=True)
    try:
        _wait_for(lambda: stage_started("data"), a)
    finally:
        os.killpg(a.pid, signal.SIGKILL)  # as `kill -9`: nothing gets to clean up
        a.wait()
    # the same command twice at once: a resume and a second worker on the same studies
    procs = [start_process(*cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True) for _ in range(2)]
    outs = [q.communicate(timeout=600) for q in procs]
    for q, (_, err) in zip(procs, outs, strict=True):
        assert q.returncode == 0, err[-3000:]
    studies = _studies(tmp_path)
    compute = measured_trials(studies["compute"])
    # each compute setting measured once over the three processes: none lost, none twice
    assert sorted(t.params["loader.batch_size"] for t in compute) == [4, 8]
    for name, st in studies.items():
        done = measured_trials(st)
        keys = [json.dumps(t.params, sort_keys=True) for t in done]
        assert len(keys) == len(set(keys)), f"{name}: a point measured twice"
        assert all(t.state != optuna.trial.TrialState.RUNNING for t in st.trials)
    result = json.loads((tmp_path / "sweep" / "pipes.json").read_text())
    assert result["join"]["pairings"] and result["recommended"]["e2e"][0] > 0
    assert set(result["recommended"]["params"]) == {"loader.batch_size", "loader.num_workers"}


@pytest.mark.slow
def test_pipes_whose_joins_all_fail_exit_1_and_keep_the_bounds(tmp_path):
    """Bounds alone are no answer: no pairing measured end to end fails the sweep in one line
    (before: exit 0, 'no feasible full-length measurement'); the pipes' bounds stay. Workers
    fixed on the command line (0), pin_memory the data knob: each pairing's bound is the serial
    one, from the workers it ran with (the data study's params, which hold none, were read as
    1 worker: the overlapped bound)."""
    space = [o.replace("loader.num_workers=choice(0,1)", "loader.num_workers=0").replace(
        "loader.pin_memory=false", "loader.pin_memory=choice(false,true)") for o in SPACE]
    p = run_cli("sweep=pipes", *PIPES, *space, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}", "tracking=none",
                "hydra.sweeper.pipes.join_overrides=['bench.phases=[e2e]',"
                "'fault.fail_message=boom']", cwd=tmp_path)
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert p.returncode == 1 and len(errors) == 1, p.stderr[-3000:]
    assert "no pairing of this sweep measured end to end" in errors[0] and "boom" in errors[0]
    # no stage's pick is logged as what the report recommends, a failure not as the ceiling
    log = p.stdout + p.stderr
    assert "as the report recommends" not in log and "under the memory ceiling" not in log
    assert "no trial measured: every one failed" in log
    result = json.loads((tmp_path / "sweep" / "pipes.json").read_text())
    assert result["compute"]["kept"] and result["join"]["pairings"]
    assert all(p["e2e"] is None for p in result["join"]["pairings"])
    assert {p["narrower"] for p in result["join"]["pairings"]} == {"serial"}, result["join"]


def test_the_joins_next_data_try_counts_in_its_data_stages_trials(monkeypatch, caplog):
    """Where the join found contention, the next data setting ran in the data stage's study,
    yet pipes.json kept the stage's count from before it (`2 loader-only trials` for 3)."""
    from types import SimpleNamespace

    from gpubench.search import pipes as P
    from hydra_plugins.gpubench_sweeper.config import PipesConf

    space = parse_search_space(["loader.batch_size=choice(4,8)", "bench.device=cpu",
                                "loader.num_workers=choice(0,1,2)"])
    plan = PipesConf(["loader.num_workers"], 4, 1, 12, 4, [], [], [])
    rows = [loader_row({"loader.num_workers": 0}, 90.0, [88, 92]),
            loader_row({"loader.num_workers": 1}, 300.0, [290, 310])]
    shared = SimpleNamespace(study=SimpleNamespace(study_name="s-data-x"))
    monkeypatch.setattr(P, "_rows", lambda s: list(rows))
    written: list = []
    p = P.Pipes(plan, space, "s", lambda name: shared, None, None, written.append)
    p._measure = lambda *a, **k: rows.append(
        loader_row({"loader.num_workers": 2}, 600.0, [590, 610]))
    kept = P.Kept({"loader.batch_size": 4}, Est(200.0, 195.0, 205.0), "the fastest")
    first = p._data(kept)
    assert first.params == {"loader.num_workers": 1} and p.result["data"][0]["trials"] == 2
    with caplog.at_level("INFO", logger="gpubench.sweep"):
        nxt = p._data(kept, past=first.params)
    assert nxt.params == {"loader.num_workers": 2}
    # the log says which setting the join tried next, and that it clears
    assert "loader.num_workers=2" in caplog.text and " clears compute" in caplog.text
    assert p.result["data"][0]["trials"] == 3 and len(p.result["data"]) == 1
    assert written[-1]["data"][0]["trials"] == 3
    # a next try that does not clear either: no setting (the join keeps its pairing), counted
    p._measure = lambda *a, **k: rows.append(
        loader_row({"loader.num_workers": 2}, 150.0, [140, 160]))
    rows[:] = rows[:2]
    assert p._data(kept, past=first.params) is None and p.result["data"][0]["trials"] == 3
