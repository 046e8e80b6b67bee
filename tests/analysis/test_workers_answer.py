"""The workers answer of a loader-only sweep: the fewest workers whose loader interval clears the
compute bound's interval by the margin (gpubench.analysis.workers), the compute bound found in
the sweep or named with --compute (gpubench.report.loader_answer), measured once per setup by
the multirun itself (gpubench.run.compute_bound), and the plot's band."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from conftest import TINY, run_cli

from gpubench.analysis.recommend import Row
from gpubench.analysis.select import loader_only, training_rows
from gpubench.analysis.verdict import Knobs
from gpubench.analysis.workers import COMPUTE_DIR, fewest_workers
from gpubench.core.record import Flaw, Reason, RunRecord, Status
from gpubench.core.stats import Est
from gpubench.report.loader_answer import loader_answer
from gpubench.report.plot_data import curve_data
from gpubench.report.write import write_report
from gpubench.run import compute_bound
from gpubench.run.compute_bound import claim_in

# article 003's shape: 0 and 1 workers starve the device, 2 and 4 feed it
LOADER = {0: (300.0, [280.0, 320.0]), 1: (600.0, [560.0, 640.0]), 2: (812.0, [790.0, 840.0]),
          4: (830.0, [800.0, 850.0])}


def config(workers: int, phases: list[str], batch: int = 32) -> dict:
    return {"model": {"name": "resnet18"},
            "dataset": {"name": "synthetic", "image_size": 32, "num_classes": 10},
            "loader": {"batch_size": batch, "num_workers": workers},
            "precision": {"name": "fp32"}, "channels_last": False, "compile": "off",
            "bench": {"phases": phases, "optimizer": "sgd", "grad_accum_steps": 1}}


def loader_row(w: int, ips: float, ci, reasons=(), batch: int = 32) -> Row:
    rec = RunRecord(status=Status.ok, loader_images_per_sec=ips, loader_images_per_sec_ci=ci,
                    config=config(w, ["loader"], batch), env={"device": "cuda"},
                    measurement_stable=False if reasons else True, noise_reasons=list(reasons))
    return Row(str(w), rec)


def compute_run(ips: float, ci, tmp: Path, name: str = "c", batch: int = 32) -> RunRecord:
    return RunRecord(status=Status.ok, compute_images_per_sec=ips, compute_images_per_sec_ci=ci,
                     config=config(0, ["compute"], batch), env={"device": "cuda"},
                     measurement_stable=True, dir=tmp / name)


def rows() -> list[Row]:
    return [loader_row(w, ips, ci) for w, (ips, ci) in LOADER.items()]


def dict_rows() -> list[dict]:
    return [{"num_workers": w, "loader_images_per_sec": ips, "loader_images_per_sec_ci": ci}
            for w, (ips, ci) in LOADER.items()]


# ------------------------------------------------------------------ the rule, on intervals


def test_the_fewest_workers_whose_low_end_clears_computes_high_end_by_the_margin():
    pick = fewest_workers(dict_rows(), Est(540.0, 520.0, 555.0))
    assert (pick.num_workers, pick.unblocks) == (2, True)
    # 1 worker's figure (600) is above 540 x 1.05, its low end (560) not above 555 x 1.05
    assert pick.answer() == (
        "workers: 2 (loader 812 [790-840] img/s clears compute 540 [520-555] by 50% [42%-62%], "
        "more than the 5% margin); 1 worker: 600 [560-640] does not (its low end 560 is not "
        "above 583, compute's high end + 5%)")
    # on figures alone the same rows pick 1 worker: the intervals are what decide
    assert fewest_workers([(w, ips) for w, (ips, _) in LOADER.items()], 540.0).num_workers == 1


def test_an_undecided_pick_says_the_runs_own_measure_longer():
    """Overlapping intervals: the loader check read `measure longer (a larger bench.repeats
    and bench.steps)` beside the report's own `bench.steps=20 bench.repeats=10` for the same
    runs; it says the runs' figures where it is given them."""
    close = Est(820.0, 800.0, 845.0)  # overlaps 812 [790-840], its best loader
    given = fewest_workers(dict_rows(), close, longer="bench.steps=20 bench.repeats=10")
    assert ("the intervals overlap, so it is not decided: measure longer (bench.steps=20 "
            "bench.repeats=10) or try more workers") in given.answer(), given.answer()
    assert "measure longer (bench.steps=20 bench.repeats=10)" in given.reason
    assert "a larger bench.repeats" in fewest_workers(dict_rows(), close).reason


def test_none_clears_says_whether_the_data_side_is_surely_the_bottleneck():
    below = fewest_workers(dict_rows(), Est(900.0, 880.0, 920.0))
    assert not below.unblocks and below.num_workers == 2  # the plateau: 812 within 5% of 830
    assert below.answer().startswith("workers: none of 0, 1, 2, 4 clears compute 900 [880-920]")
    assert "the data side stays the bottleneck" in below.answer()
    assert below.answer().endswith("; the loader levels off from 2 workers: 812 [790-840] "
                                   "img/s, within 5% of the best")
    # the fastest at the most workers tried: no level was seen, more may load faster
    rising = fewest_workers([{"num_workers": w, "loader_images_per_sec": ips,
                              "loader_images_per_sec_ci": [ips - 10, ips + 10]}
                             for w, ips in ((0, 300.0), (1, 500.0), (2, 700.0))],
                            Est(900.0, 880.0, 920.0))
    assert rising.num_workers == 2 and "levels off" not in rising.answer()
    assert rising.answer().endswith("; the most tried, 2 workers, loads fastest (700 [690-710] "
                                    "img/s): more may load faster still")
    # 4 workers' 830 [800-850] against 800 [780-830]: not cleared, not surely below either
    close = fewest_workers(dict_rows(), Est(800.0, 780.0, 830.0))
    assert not close.unblocks and "not decided" in close.answer()
    assert "stays the bottleneck" not in close.answer()


def test_a_cpu_only_data_side_is_told_only_what_acts_on_a_cpu(tmp_path):
    """No worker count out-runs compute on a CPU-only run: its next steps name no device augment
    (the model's own cores would run it) and no GPU; on CUDA (or unrecorded) they do."""
    for pick in (fewest_workers(dict_rows(), Est(900.0, 880.0, 920.0), device="cpu"),
                 fewest_workers([(w, ips) for w, (ips, _) in LOADER.items()], 1000.0,
                                device="cpu")):
        for text in (pick.answer(), pick.reason):
            # 4 workers, the most tried, loaded fastest: more come first
            assert "(next: loader.num_workers=8, dataset.preload=true, more CPU cores)" in text
            assert "augment_on" not in text and "GPU" not in text
    gpu = fewest_workers(dict_rows(), Est(900.0, 880.0, 920.0))
    assert "dataset.augment_on=device, more CPU cores per GPU" in gpu.answer()
    # levelled off below the most tried (2 loads as fast as 4, 8 slower): no more workers
    level = fewest_workers(dict_rows() + [{"num_workers": 8, "loader_images_per_sec": 700.0,
                                           "loader_images_per_sec_ci": [680.0, 720.0]}],
                           Est(900.0, 880.0, 920.0), device="cpu")
    assert "(next: dataset.preload=true, more CPU cores)" in level.answer()
    # the report's answer passes its runs' device on
    cpu_rows = rows()
    for r in cpu_rows:
        r.record.env["device"] = "cpu"
    bound = compute_run(900.0, [880.0, 920.0], tmp_path)
    bound.env["device"] = "cpu"
    text = "\n".join(loader_answer(cpu_rows, [bound], [], "/sweeps/a").lines)
    assert "stays the bottleneck" in text and "augment_on" not in text


def test_the_loader_check_judges_as_the_answer_does():
    """The loader check (WorkersPick.reason) said `the data side stays the bottleneck` of any
    loader that did not clear, also where the answer said it is not decided."""
    close = fewest_workers(dict_rows(), Est(800.0, 780.0, 830.0))
    assert "not decided" in close.reason and "stays the bottleneck" not in close.reason
    below = fewest_workers(dict_rows(), Est(900.0, 880.0, 920.0))
    assert "stays the bottleneck" in below.reason and "not decided" not in below.reason


def test_no_next_step_repeats_what_the_runs_already_do(tmp_path):
    """Preloaded runs were told `(next: dataset.preload=true, more CPU cores)`: a step that sets
    a knob to the value the runs have is dropped; more workers than tried stay advised."""
    preloaded = [{"dataset.preload": True, "dataset.augment_on": "cpu"}]
    pick = fewest_workers(dict_rows(), Est(900.0, 880.0, 920.0), tried=preloaded)
    assert "(next: loader.num_workers=8, dataset.augment_on=device, more CPU cores per GPU)" \
        in pick.answer()
    cpu = fewest_workers(dict_rows(), Est(900.0, 880.0, 920.0), device="cpu", tried=preloaded)
    assert "(next: loader.num_workers=8, more CPU cores)" in cpu.reason
    # the report's answer passes its runs' settings on
    rs = rows()
    for r in rs:
        r.record.config["dataset"]["preload"] = True
    rs = [Row(r.label, r.record) for r in rs]
    text = "\n".join(loader_answer(rs, [compute_run(900.0, [880.0, 920.0], tmp_path)], [],
                                    "/s").lines)
    assert "stays the bottleneck (next: " in text and "dataset.preload=true" not in text, text


# ------------------------------------------------------------------ the report's answer


def test_a_loader_only_sweep_without_compute_says_how_to_get_it():
    ans = loader_answer(rows(), [], [], "/sweeps/a")
    assert all(loader_only(r.record) for r in ans.rows) and len(ans.groups) == 1
    text = "\n".join(ans.lines)
    assert "workers: no compute bound to compare with" in text
    # the command that measures it at the same setup (every key the compute phase depends on,
    # gpubench.config.knobs.COMPUTE), and the report that then answers
    assert ("python -m gpubench dataset.image_size=32 dataset.num_classes=10 model=resnet18 "
            "loader.batch_size=32 precision=fp32 bench.optimizer=sgd bench.grad_accum_steps=1 "
            "channels_last=false compile=off 'bench.phases=[compute]'") in text
    assert "python -m gpubench.report /sweeps/a --compute" in text
    assert ans.summary()[0]["compute"] is None and ans.band(ans.rows[0]) is None
    # the training ranking still leaves the loader runs out
    assert training_rows(rows())[0] == []


def test_the_bound_comes_from_the_sweep_or_the_command_line(tmp_path):
    a = compute_run(540.0, [520.0, 555.0], tmp_path, "a")
    ans = loader_answer(rows(), [a], [], "/sweeps/a")
    assert ans.groups[0].pick.num_workers == 2 and ans.groups[0].sources == [a]
    assert f"compute bound from {a.dir}" in "\n".join(ans.lines)
    band = ans.band(ans.rows[0])
    assert (band["y"], band["lo"], band["hi"]) == (540.0, 520.0, 555.0)
    # two measurements of the bound: the median inside the widest interval
    b = compute_run(560.0, [530.0, 760.0], tmp_path, "b")
    both = loader_answer(rows(), [a], [b], "/sweeps/a").groups[0].pick
    assert (both.compute.value, both.compute.lo, both.compute.hi) == (550.0, 520.0, 760.0)
    assert both.num_workers == 4  # 790 is not above 760 x 1.05 = 798; 800 is
    # a named run of another batch size bounds nothing here: one line naming the knob
    other = compute_run(300.0, [290.0, 310.0], tmp_path, "o", batch=64)
    with pytest.raises(SystemExit, match="batch_size 64 is not the loader runs' 32"):
        loader_answer(rows(), [], [other], "/sweeps/a")


def test_the_compute_command_drops_every_data_knob_from_either_source(tmp_path):
    """The command that measures a loader sweep's missing compute bound dropped only workers
    and phases from a job's command line, while the same row read from MLflow kept only the
    compute knobs: a data knob (pin_memory) was in one command and not the other."""
    from gpubench.report.loader_answer import _compute_command

    r = loader_row(4, 600.0, [560.0, 640.0])
    r.record.dir = tmp_path / "job"
    (r.record.dir / ".hydra").mkdir(parents=True)
    (r.record.dir / ".hydra" / "overrides.yaml").write_text(
        "- model.name=resnet18\n- loader.num_workers=4\n- loader.pin_memory=true\n"
        "- loader.prefetch_factor=4\n- bench.phases=[loader]\n")
    cmd = _compute_command(r)
    assert cmd == "python -m gpubench model.name=resnet18 'bench.phases=[compute]'", cmd


def test_preload_is_no_next_step_for_images_made_in_ram():
    """A synthetic dataset is made in RAM: preload has nothing to decode (a new user who
    followed `next: dataset.preload=true` got 0.00 GiB preloaded and a slower loader). The
    next steps ask what the verdict's advice asks (schema.PRELOAD_HELPS)."""
    from gpubench.analysis.verdict import Bottleneck, advise
    from gpubench.analysis.workers import next_steps

    for name, preload in (("synthetic", False), ("device_synthetic", False),
                          ("imagefolder", True), ("fake_jpeg", True)):
        said = next_steps("cuda", tried=[{"dataset.name": name, "dataset.preload": False}])
        assert ("dataset.preload=true" in said) is preload, (name, said)
        knobs = Knobs(device="cuda", num_workers=2, cpu_count=8, pin_memory=True,
                      preload=False, augment_on="cpu", precision="fp32", channels_last=False,
                      compile="off", batch_size=64, dataset=name, memory_fraction=0.3,
                      ceiling=0.8)
        assert any(a.startswith("dataset.preload=true") for a in advise(Bottleneck.data, knobs)) \
            is preload, name
    assert "dataset.preload=true" in next_steps("cuda")  # the runs' dataset not known


def test_more_workers_are_advised_only_up_to_the_hosts_cores():
    """2 workers loading fastest on a 2-core host were told `loader.num_workers=4`: more workers
    than cores take turns on them, so there the step is more cores (env.cpu_count)."""
    from gpubench.analysis.workers import least_cores, next_steps

    assert next_steps("cpu", 2, cores=2).startswith("dataset.preload=true, more CPU cores")
    assert next_steps("cuda", 2, cores=3).startswith("loader.num_workers=3, ")
    assert next_steps("cuda", 2, cores=16).startswith("loader.num_workers=4, ")
    assert next_steps("cuda", 2).startswith("loader.num_workers=4, ")  # cores not recorded
    hosts = [RunRecord(env={"cpu_count": 8}), RunRecord(env={"cpu_count": 2}), RunRecord()]
    assert least_cores(hosts) == 2 and least_cores([RunRecord()]) is None


def test_the_next_worker_count_from_zero_is_the_consoles():
    """From 0 workers on a 2-core CPU the report said `loader.num_workers=2` while the run's
    console said to measure 1 against 0 (a worker loads on a core the model trains on; in a
    review 2 halved e2e). Both now ask workers.more_workers; on CUDA 0 still leads to 2."""
    from gpubench.analysis.verdict import Bottleneck, Knobs, advise
    from gpubench.analysis.workers import next_steps

    assert next_steps("cpu", 0, cores=2).startswith("loader.num_workers=1, ")
    assert next_steps("cpu", 0, cores=8).startswith("loader.num_workers=1, ")
    assert next_steps("cuda", 0, cores=8).startswith("loader.num_workers=2, ")
    assert next_steps("cpu", 1, cores=8).startswith("loader.num_workers=2, ")
    knobs = Knobs(device="cpu", num_workers=0, cpu_count=2, pin_memory=False, preload=False,
                  augment_on="cpu", precision="fp32", channels_last=False, compile="off",
                  batch_size=8, dataset="synthetic", memory_fraction=None, ceiling=0.9)
    assert advise(Bottleneck.data, knobs)[0].startswith("loader.num_workers=1, ")


def test_the_reports_tolerance_is_the_workers_answers_margin(tmp_path):
    """`--tolerance` reached the recommendation's loader check but not the workers answer,
    which kept 5%: one report judged one loader against one bound with two margins. At 50%
    neither 2 nor 4 workers clears compute 540 [520-555] (a low end above 832.5)."""
    bound = compute_run(540.0, [520.0, 555.0], tmp_path)
    # 1 worker at 50%: the plateau within 50% of the best
    for tolerance, workers in ((0.05, 2), (0.5, 1)):
        write_report(rows(), tmp_path / str(tolerance), "x", tolerance=tolerance, found=[bound],
                     quiet=True)
        [w] = json.loads((tmp_path / str(tolerance) / "summary.json").read_text())["workers"]
        assert (w["margin_required"], w["num_workers"], w["unblocks"]) == (
            tolerance, workers, tolerance == 0.05)


def test_the_workers_answer_reads_a_repeated_loader_as_the_ranking_pools_it(tmp_path):
    """0 workers run twice (pooled into one row: the ranking read 2062.1 [1827-2297]) and the
    workers answer read only the first run's 1827 [1550-2302]."""
    from gpubench.report.loader_answer import loader_answer

    first, again = loader_row(0, 1827.0, [1550.0, 2302.0]), loader_row(0, 2297.0, [2200.0, 2400.0])
    first.confirms = [again.record]
    bound = compute_run(540.0, [520.0, 555.0], tmp_path)
    answer = loader_answer([first, loader_row(2, 900.0, [880.0, 920.0])], [bound], [], "x")
    [group] = answer.groups
    assert group.pick.rates[0].value == first.throughput == 2062.0
    assert (group.pick.rates[0].lo, group.pick.rates[0].hi) == first.interval


def test_a_bound_from_an_mlflow_run_is_named_by_its_run_id(tmp_path):
    """An MLflow experiment's runs have no folder here: the bound read `compute bound from
    None`; it names the run by its id (the row's label is its first 8 digits)."""
    run_id = "0123456789abcdef0123456789abcdef"
    m = compute_run(540.0, [520.0, 555.0], tmp_path)
    m.dir, m.extra["mlflow_run_id"] = None, run_id
    ans = loader_answer([*rows(), Row(run_id[:8], m)], [], [], "mlflow experiment x")
    text = "\n".join(ans.lines)
    assert f"compute bound from MLflow run {run_id} (a run of this setup" in text, text
    assert "None" not in text


def test_a_zero_worker_run_joins_every_worker_only_setting_of_its_setup(tmp_path):
    def row(w: int, ips: float, ci, prefetch) -> Row:
        r = loader_row(w, ips, ci)
        # as resolve records them: worker-only keys inert with 0 workers
        r.record.config["loader"] |= {"prefetch_factor": prefetch,
                                      "persistent_workers": False}
        return Row(str(w), r.record)

    rs = [row(0, *LOADER[0], None), row(1, *LOADER[1], 2), row(2, *LOADER[2], 2),
          row(1, 500.0, [480.0, 520.0], 4), row(2, 700.0, [680.0, 720.0], 4)]
    ans = loader_answer(rs, [compute_run(540.0, [520.0, 555.0], tmp_path)], [], "/s")
    by_prefetch = {g.rows[-1].knob("prefetch_factor"): g for g in ans.groups}
    assert set(by_prefetch) == {2, 4}
    for g in ans.groups:  # the 0-worker run is in both, as the baseline of each
        assert sorted(r.knob("num_workers") for r in g.rows) == [0, 1, 2]
    assert by_prefetch[2].pick.num_workers == 2 and by_prefetch[4].pick.num_workers == 2
    # the one setting of a plain 0,1,2 sweep: one group, not a 0-worker group of its own
    assert len(loader_answer(rs[:3], [], [], "/s").groups) == 1


def test_each_heading_names_what_sets_its_group_apart(tmp_path):
    """Groups split on every knob, yet their headings wrote the compute knobs alone: four groups
    of a preload x pin_memory sweep all read `resnet18 ..., batch 32, fp32 (cuda)`. Each names
    the keys that differ between the groups shown, at their default too; worker-only knobs from
    a run with workers (a 0-worker run records them inert)."""
    def row(w: int, preload: bool, pin: bool, prefetch) -> Row:
        r = loader_row(w, *LOADER[w])
        r.record.config["dataset"]["preload"] = preload
        r.record.config["loader"] |= {"pin_memory": pin, "prefetch_factor": prefetch if w else None}
        return Row(str(w), r.record)

    bound = [compute_run(540.0, [520.0, 555.0], tmp_path)]
    rs = [row(w, p, pin, 2) for w in (0, 1) for p in (False, True) for pin in (True, False)]
    heads = [g.setup for g in loader_answer(rs, bound, [], "/s").groups]
    assert len(heads) == 4 and len(set(heads)) == 4, heads
    assert "resnet18 on synthetic 32px, batch 32, fp32, preload=false, pin_memory=true (cuda)" \
        in heads
    # worker-only settings apart: named from the runs with workers, never the 0-worker's null
    rs = [row(0, False, True, None), row(1, False, True, 2), row(1, False, True, 4)]
    heads = [g.setup for g in loader_answer(rs, bound, [], "/s").groups]
    assert heads == [f"resnet18 on synthetic 32px, batch 32, fp32, prefetch_factor={n} (cuda)"
                     for n in (2, 4)]  # 2, the default, named: it sets its group apart
    # one setting, every knob at its default: the heading as before
    assert [g.setup for g in loader_answer(rows(), bound, [], "/s").groups] == \
        ["resnet18 on synthetic 32px, batch 32, fp32 (cuda)"]


def test_a_flagged_loader_run_is_left_out_of_the_rule_and_named(tmp_path):
    queue = Reason(Flaw.queue, "loader: windows 1, 2 of fewer batches than the workers hold in "
                               "flight (...)")
    flagged = [loader_row(0, 300.0, [280.0, 320.0]),
               loader_row(1, 17945.0, [17000.0, 19000.0], reasons=[queue]),
               loader_row(2, 812.0, [790.0, 840.0])]
    ans = loader_answer(flagged, [compute_run(540.0, [520.0, 555.0], tmp_path)], [], "x")
    assert ans.groups[0].pick.num_workers == 2
    assert "left out, flagged: run 1 (1 worker: queue-timed)" in "\n".join(ans.lines)
    # every run flagged (a busy machine): the disturbed ones are judged, unconfirmed; a
    # queue-timed one reads high and never is
    busy = "other processes used CPU while the host was busy: loader windows 2, 3"
    flagged = [loader_row(w, ips, ci, reasons=[busy]) for w, (ips, ci) in LOADER.items()]
    flagged.append(loader_row(1, 17945.0, [17000.0, 19000.0], reasons=[queue]))
    ans = loader_answer(flagged, [compute_run(540.0, [520.0, 555.0], tmp_path)], [], "x")
    assert ans.groups[0].pick.num_workers == 2 and len(ans.groups[0].used) == 4
    text = "\n".join(ans.lines)
    assert ("  unconfirmed, every loader run flagged its own measurement: rerun on a quiet "
            "machine to confirm; workers: 2 (") in text
    assert "left out, flagged: run 1 (1 worker: queue-timed)" in text
    only_high = [loader_row(1, 17945.0, [17000.0, 19000.0], reasons=[queue])]
    ans = loader_answer(only_high, [compute_run(540.0, [520.0, 555.0], tmp_path)], [], "x")
    assert ans.groups[0].pick.num_workers is None
    assert "workers: no answer: every loader run that measured read high" in "\n".join(ans.lines)
    # a disturbed compute run reads low: it makes no bound beside an undisturbed one ...
    low = compute_run(100.0, [80.0, 200.0], tmp_path, "low")
    low.measurement_stable = False
    low.noise_reasons = [Reason(Flaw.disturbed, "other processes used CPU ...")]
    good = compute_run(540.0, [520.0, 555.0], tmp_path, "good")
    ans = loader_answer(rows(), [low, good], [], "x")
    assert ans.groups[0].sources == [good] and ans.groups[0].pick.num_workers == 2
    # ... and alone, it answers only as unconfirmed
    ans = loader_answer(rows(), [low], [], "x")
    line = next(x for x in ans.lines if "workers: 0" in x)
    assert line.startswith("  unconfirmed, the compute bound flagged its own measurement: ")
    assert ans.summary()[0]["unconfirmed"] and "flagged" in ans.band(ans.rows[0])["label"]


def test_the_workers_plot_draws_the_bound_across_it(tmp_path):
    ans = loader_answer(rows(), [compute_run(540.0, [520.0, 555.0], tmp_path)], [], "x")
    d = curve_data(ans.rows, "num_workers", "loader workers", band=ans.band)
    assert d["phase"] == "loader" and d["band"]["threshold"] == pytest.approx(582.75)
    assert d["ymax"] > 850.0
    # every run flagged: no line, the bound still drawn (the answer judges them, unconfirmed)
    busy = [loader_row(w, ips, ci, reasons=["other processes used CPU ..."])
            for w, (ips, ci) in LOADER.items()]
    ans = loader_answer(busy, [compute_run(540.0, [520.0, 555.0], tmp_path)], [], "x")
    d = curve_data(ans.rows, "num_workers", "loader workers", band=ans.band)
    assert not d["lines"] and d["band"]["y"] == 540.0
    files = write_report(rows(), tmp_path / "rep", "x", quiet=True,
                         found=[compute_run(540.0, [520.0, 555.0], tmp_path)])
    assert tmp_path / "rep" / "throughput_vs_workers.png" in files
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["workers"][0]["num_workers"] == 2 and "recommended" not in summary
    assert not any("no recommendation" in x for x in summary["lines"])


def test_one_job_of_a_setup_claims_its_compute_measurement(tmp_path):
    rec = RunRecord(status=Status.ok, config=config(0, ["loader"]), env={"device": "cpu"},
                    dir=tmp_path / "0")
    got, start = [], threading.Barrier(8)

    def one():
        start.wait()
        got.append(claim_in(tmp_path, rec))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [p for p in got if p is not None]
    assert len(got) == 8 and len(won) == 1 and won[0].parent == tmp_path / COMPUTE_DIR
    assert won[0].with_suffix(".claim").read_text().strip() == str(tmp_path / "0")
    # another batch size is another setup: its own claim
    other = RunRecord(status=Status.ok, config=config(0, ["loader"], 64), env={"device": "cpu"})
    assert claim_in(tmp_path, other) not in (None, won[0])

    def claimer_ends():  # what the kernel does to the lock of a process that ends
        held = next(c for c in compute_bound._CLAIMS if c.lock_file == str(claim_file))
        compute_bound._CLAIMS.remove(held)
        held.release()

    # its claimer died mid-measurement, leaving a record `running`: the next job takes it over
    claim_file = won[0].with_suffix(".claim")
    assert claim_in(tmp_path, rec) is None  # held: left to it
    claimer_ends()
    won[0].mkdir()
    (won[0] / "results.json").write_text(json.dumps({"status": "running"}))
    assert claim_in(tmp_path, rec) == won[0]
    # measured: never again, held or not (a resumed sweep)
    claimer_ends()
    (won[0] / "results.json").write_text(json.dumps({"status": "ok"}))
    assert claim_in(tmp_path, rec) is None


# ------------------------------------------------------------------ through the CLI


@pytest.mark.slow
def test_a_loader_only_multirun_measures_its_bound_once_and_the_report_answers(tmp_path):
    sweep = tmp_path / "sweep"
    # 6 windows of 3 steps: more than the 1 x 2 batches one worker holds in flight, and enough
    # windows for a 95% interval, so the runs do not flag themselves for their length
    p = run_cli("-m", *TINY, "bench.steps=18", "bench.repeats=6", "bench.phases=[loader]",
                "loader.num_workers=0,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("compute bound for this sweep's workers answer") == 1
    measured = list((sweep / COMPUTE_DIR).glob("*/results.json"))
    assert len(measured) == 1 and len(list((sweep / COMPUTE_DIR).glob("*.claim"))) == 1
    assert json.loads(measured[0].read_text())["config"]["bench"]["phases"] == ["compute"]

    rep = run_cli(str(sweep), module="gpubench.report", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    out = rep.stdout
    assert "no recommendation" not in out and "workers answer" in out
    assert f"compute bound from {measured[0].parent}" in out
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    # one setup: the 0-worker run (its worker-only keys recorded inert) is in the 1-worker's
    [group] = summary["workers"]
    assert group["compute"] is not None and set(group["loader"]) == {"0", "1"}
    # an answer of the rule, with the bound's interval (unconfirmed when the machine was busy)
    assert group["answer"] in out
    assert group["answer"].startswith(("workers: 0 (", "workers: 1 (", "workers: none of"))
    assert f"compute {Est(*group['compute'])}" in group["answer"]
    assert (sweep / "report" / "throughput_vs_workers.png").stat().st_size > 0


def test_a_run_with_a_fault_injected_bounds_no_loader(tmp_path):
    """A grid of fault.stall_every=null,1: the stalled run's compute (75 img/s) joined the
    envelope of the plain one's (3000), and the loader check read compute 1583.7 [74-3100]."""
    from gpubench.analysis.select import faulted
    from gpubench.analysis.workers import compute_bound, compute_setup

    # the grid's other run shares fault.stall_s=0.05, which injects nothing without stall_every
    plain = compute_run(3000.0, [2900.0, 3100.0], tmp_path, "plain")
    plain.config["fault"] = {"stall_every": None, "stall_s": 0.05}
    stalled = compute_run(75.0, [74.0, 76.0], tmp_path, "stalled")
    stalled.config["fault"] = {"stall_every": 1, "stall_s": 0.05}
    setup = compute_setup(plain.knob, "cuda")
    assert compute_setup(stalled.knob, "cuda") == setup  # a fault is no compute knob
    bound, sources = compute_bound([plain, stalled], setup)
    assert sources == [plain] and (bound.value, bound.lo, bound.hi) == (3000.0, 2900.0, 3100.0)
    assert faulted(stalled) and not faulted(plain)
    plain.config["fault"] = {"stall_every": 1, "stall_s": 0.0}  # a stall of 0 s: none
    assert not faulted(plain)
    plain.config["fault"] = {"fail_message": "boom", "fail_after_windows": 2}
    assert faulted(plain)
    # what the runner injects, not what is set: an OOM only above the run's batch (32), a
    # failure only with a message, a fault only on a rank the run has
    for fault, injected in (({"oom_above_batch": 64}, False), ({"oom_above_batch": 16}, True),
                            ({"fail_message": ""}, False),
                            ({"rank": 1, "stall_every": 1, "stall_s": 1.0}, False),
                            ({"rank": 0, "stall_every": 1, "stall_s": 1.0}, True)):
        plain.config["fault"] = fault
        assert faulted(plain) is injected, fault


def test_runs_apart_only_in_a_fault_key_that_injected_nothing_are_one_setup(tmp_path):
    """`-m fault.stall_s=0.05,1` without a stall: no fault acted in either run, yet the ranking
    grew a fault.stall_s column and never pooled them as repeats."""
    from gpubench.analysis.recommend import repeats, varying

    a, b = (compute_run(3000.0 + i, [2900.0, 3100.0], tmp_path, f"r{i}") for i in range(2))
    a.config["fault"], b.config["fault"] = {"stall_s": 0.05}, {"stall_s": 1.0}
    assert varying([Row("a", a), Row("b", b)]) == [] and repeats(a, b)
    b.config["fault"] = {"stall_s": 1.0, "stall_every": 2}  # one stalled: a row apart, named
    assert varying([Row("a", a), Row("b", b)]) == ["fault.stall_every"] and not repeats(a, b)
    # the grid fault.stall_every=null,1 fault.stall_s=0.05: both read 0.05, no stall_s column
    b.config["fault"] = {"stall_s": 0.05, "stall_every": 1}
    assert varying([Row("a", a), Row("b", b)]) == ["fault.stall_every"]
