"""The gpubench sweeper: search-space parsing, outcomes, max-batch search (plain functions), and
real sweeps: `python -m gpubench -m hydra/sweeper=gpubench ...` run from a temporary folder, in
this process or, where a kill or a second worker is the subject, as a new interpreter (which
must discover the plugin through the installed package, not the current directory), with a real Optuna sqlite study and fault injection for OOMs and errors."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
from conftest import TINY, run_cli, sqlite_store, start_process
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from gpubench.config.errors import ConfigError
from gpubench.config.overrides import format_value
from gpubench.core import record
from gpubench.core.files import read_json
from gpubench.core.record import OOM_CONSTRAINT, RunRecord, Status
from gpubench.report.write import RANK_ORDER
from gpubench.search.jobs import read_job
from gpubench.search.maxbatch import find_max_batch
from gpubench.search.space import parse_search_space
from gpubench.search.study import (
    abandon,
    measured_trials,
    open_study,
    screen_passes,
    split_duplicates,
)
from tests.cli.test_cli import sigterm_kept  # noqa: F401 - a fixture

optuna.logging.set_verbosity(optuna.logging.WARNING)

# ---------------------------------------------------------------------------- search space


def test_parses_hydra_sweep_syntax():
    space = parse_search_space([
        "loader.batch_size=choice(16,32,64)",
        "loader.num_workers=range(0,4)",
        "loader.prefetch_factor=range(2,9,2)",
        "bench.lr=tag(log,interval(1e-4,1e-1))",
        "memory.reserve=interval(0.0,0.2)",
        "precision=choice(fp32,amp_bf16)",
        "channels_last=true,false",
        "model=tiny",
    ])
    d = space.distributions
    assert d["loader.batch_size"] == CategoricalDistribution([16, 32, 64])
    # range() excludes its end, as Python and Hydra do: range(0,4) is 0..3
    assert d["loader.num_workers"] == IntDistribution(0, 3)
    assert d["loader.prefetch_factor"] == IntDistribution(2, 8, step=2)
    assert d["bench.lr"] == FloatDistribution(1e-4, 1e-1, log=True)
    assert d["memory.reserve"] == FloatDistribution(0.0, 0.2)
    assert d["precision"] == CategoricalDistribution(["fp32", "amp_bf16"])
    assert d["channels_last"] == CategoricalDistribution([True, False])
    assert space.fixed == ["model=tiny"]
    assert space.size() is None  # two continuous params
    ov = space.overrides({"loader.batch_size": 32, "loader.num_workers": 3,
                          "loader.prefetch_factor": 4, "bench.lr": 0.01, "memory.reserve": 0.1,
                          "precision": "amp_bf16", "channels_last": False})
    assert ov == ["model=tiny", "loader.batch_size=32", "loader.num_workers=3",
                  "loader.prefetch_factor=4", "bench.lr=0.01", "memory.reserve=0.1",
                  "precision=amp_bf16", "channels_last=false"]


def test_range_sampling_never_reaches_the_end():
    space = parse_search_space(["a=range(0,4)", "b=range(1,10,3)"])
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_a, seen_b = set(), set()
    for _ in range(200):
        t = study.ask(space.distributions)
        seen_a.add(t.params["a"])
        seen_b.add(t.params["b"])
        study.tell(t, 0.0)
    assert seen_a == {0, 1, 2, 3}
    assert seen_b == {1, 4, 7}


@pytest.mark.parametrize("sweep", ["tag(log,range(1,9))", "range(0.5,2.0,0.5)",
                                   "range(2,40,6)"])
def test_a_stepped_spaces_points_are_what_optuna_samples(sweep):
    """`tag(log, range(1,9))` and a float range with a step (docs/sweeps.md) crashed every
    search at its start: size() counted their points, grid() had none for them. Every point
    listed is one Optuna samples, and Optuna samples no other."""
    from gpubench.search.space import grid

    space = parse_search_space([f"a={sweep}"])
    points = [p["a"] for p in grid(space.params)]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(300):
        t = study.ask(space.distributions)
        seen.add(t.params["a"])
        study.tell(t, 0.0)
    assert seen == set(points) and space.size() == len(points)


def test_a_tag_other_than_log_is_refused():
    """`tag(lg, range(4,8))` sampled on a linear scale without a word."""
    with pytest.raises(ConfigError, match=r"^loader.batch_size='tag\(lg,range\(4,8\)\)' is not "
                                          r"allowed: it must be tag\(log, ...\)"):
        parse_search_space(["loader.batch_size=tag(lg,range(4,8))"])
    assert parse_search_space(["loader.batch_size=tag(log,range(4,8))"]).params[0].dist.log


def test_a_huge_stepped_space_is_counted_never_listed():
    """10^7 stepped floats: their count alone (a list of them took gigabytes before the search
    began)."""
    from gpubench.search.space import axes

    space = parse_search_space(["a=range(1.0,1000.0,0.0001)", "b=tag(log,range(1,1025))"])
    a, b = axes(space.params)
    assert space.size() == len(a) * len(b) == 9990000 * 1024
    assert (a[0], a[1], a[-1]) == (1.0, 1.0001, 1.0 + 9989999 * 0.0001)


def test_preset_params_yield_to_the_command_line():
    space = parse_search_space(
        ["loader.batch_size=choice(4,8)", "bench.steps=3"],
        params={"loader.batch_size": "choice(32,64)", "precision": "choice(fp32,amp_bf16)"},
    )
    assert space.distributions["loader.batch_size"] == CategoricalDistribution([4, 8])
    assert set(space.distributions) == {"loader.batch_size", "precision"}
    assert space.size() == 4
    # an extra override (a short screen) replaces the fixed one of the same key
    ov = space.overrides({"loader.batch_size": 4, "precision": "fp32"}, ["bench.steps=1"])
    assert "bench.steps=1" in ov and "bench.steps=3" not in ov


def test_odd_choices_round_trip_as_hydra_text():
    space = parse_search_space(["bench.phases=choice([e2e],[compute,e2e])", "+x='a b',c"])
    p = {q.name: q for q in space.params}
    assert p["bench.phases"].dist.choices == ("[e2e]", "[compute,e2e]")
    assert p["bench.phases"].override("[compute,e2e]") == "bench.phases=[compute,e2e]"
    assert p["x"].dist.choices == ("'a b'", "c")  # a quoted string is sampled as its text
    assert p["x"].override("'a b'") == "+x='a b'" and p["x"].key == "+x"


def test_study_name_follows_the_search_space():
    a = parse_search_space(["loader.batch_size=choice(4,8)", "model=tiny"])
    b = parse_search_space(["model=tiny", "loader.batch_size=choice(4,8)"])
    c = parse_search_space(["loader.batch_size=choice(4,16)", "model=tiny"])
    assert a.study_name() == b.study_name() != c.study_name()


def test_range_edges():
    d = parse_search_space(["a=range(10,0,-3)", "b=range(5)", "c=tag(log,range(1,9))"]).distributions
    assert d["a"] == IntDistribution(1, 10, step=3)  # 10, 7, 4, 1
    assert d["b"] == IntDistribution(0, 4)
    assert d["c"] == IntDistribution(1, 8, log=True)


@pytest.mark.parametrize("bad", ["a=tag(log,choice(1,2))", "a=range(5,5)",
                                 "a=tag(log,range(1,9,2))", "a=choice(1,1)",
                                 "a=tag(log,interval(0,1))", "a=tag(log,range(0,8))",
                                 "a=choice(0,false)", "a=choice(1,1.0)"])
def test_bad_search_spaces_are_rejected(bad):
    with pytest.raises(ConfigError) as e:
        parse_search_space([bad])
    msg = str(e.value)  # one line naming the key, the value and what is allowed
    assert "\n" not in msg and msg.startswith("a") and "allowed:" in msg


def _sweeper(**kw):
    from omegaconf import OmegaConf

    from hydra_plugins.gpubench_sweeper.config import GpubenchSweeperConf
    from hydra_plugins.gpubench_sweeper.sweeper import GpubenchSweeper

    conf = OmegaConf.structured(GpubenchSweeperConf)
    args = {k: conf[k] for k in conf if k != "_target_"}
    return GpubenchSweeper(**{**args, **kw})


@pytest.mark.parametrize("key,value,allowed", [
    ("n_trials", 0, "an integer >= 1"), ("n_jobs", -1, "an integer >= 1"),
    ("max_failures", -1, "an integer >= 0"), ("sampler", "cmaes", "one of tpe, random"),
    ("mode", "grid", "one of optuna, max_batch"), ("storage", "not a url", "sqlite, postgresql"),
    ("storage", "redis://localhost/0", "sqlite, postgresql"),
    ("seed", -1, "null or an integer in [0, 4294967295]"),
    ("heartbeat_interval", 0, "an integer >= 1"), ("grace_period", 5, "seconds > heartbeat"),
])
def test_bad_sweeper_settings_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as e:
        _sweeper(**{key: value}).check()
    msg = str(e.value)
    assert "\n" not in msg and f"hydra.sweeper.{key}=" in msg and str(value) in msg
    assert allowed in msg


@pytest.mark.parametrize("key,value,allowed", [
    ("top", -1, "an integer >= 0"), ("rounds", 0, "an integer >= 1"), ("top", 1.5, ">= 0"),
    ("rounds", "two", ">= 1"), ("top", True, ">= 0"),
])
def test_bad_confirm_settings_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as e:
        _sweeper(confirm={"top": 3, "rounds": 2, key: value}).check()
    msg = str(e.value)
    assert "\n" not in msg and f"hydra.sweeper.confirm.{key}=" in msg and format_value(value) in msg
    assert allowed in msg
    _sweeper(confirm={"top": 0, "rounds": 1}).check()  # 0: the step is off


def test_good_sweeper_settings_pass():
    s = _sweeper(storage="postgresql+psycopg://u@/optuna?host=/tmp", sampler="random")
    s.check()
    assert s.sampler.value == "random" and s.mode.value == "optuna"


def _override_lists() -> list[str]:
    """Every list of overrides the sweeper declares it adds to some jobs (a key `*overrides`)."""
    from gpubench.config.keys import keys
    from hydra_plugins.gpubench_sweeper.config import GpubenchSweeperConf

    return [k.name for k in keys(GpubenchSweeperConf, "hydra.sweeper.")
            if k.name.endswith("overrides")]


def test_the_sweeper_declares_its_override_lists():
    assert {"hydra.sweeper.screen.overrides", "hydra.sweeper.max_batch.overrides",
            "hydra.sweeper.pipes.compute_overrides", "hydra.sweeper.pipes.data_overrides",
            "hydra.sweeper.pipes.join_overrides"} <= set(_override_lists())


@pytest.mark.parametrize("name", _override_lists())
@pytest.mark.parametrize("bad,allowed", [
    ("garbage", "an override in Hydra's syntax"), ("bench.stps=3", "close: bench.steps"),
    ("bench.steps=0", "bench.steps: an integer in [1, "),
    ("loader.batch_size=choice(2,4)", "a plain override key=value"),
])
def test_every_override_list_of_the_sweeper_is_checked_before_any_trial(compose_cfg, name, bad,
                                                                       allowed):
    """A bad override in any list the sweeper adds to its jobs would fail every such job: it is
    refused in one line before Hydra builds the sweeper (gpubench.config.prechecks)."""
    from omegaconf import OmegaConf

    from gpubench.config.prechecks import check_before_work

    cfg = compose_cfg("hydra/sweeper=gpubench", hydra=True)
    check_before_work(cfg)  # the declared defaults pass
    OmegaConf.update(cfg, name, ["bench.warmup_steps=1", bad])
    with pytest.raises(ConfigError) as e:
        check_before_work(cfg)
    line = str(e.value)
    assert line.startswith(f"{name}[1]={bad!r} is not allowed: it must be ") and allowed in line, line


@pytest.mark.slow
@pytest.mark.parametrize("args,key", [
    (["hydra.sweeper.n_trials=0", "loader.batch_size=choice(2,4)"], "hydra.sweeper.n_trials=0"),
    (["hydra.sweeper.sampler=cmaes", "loader.batch_size=choice(2,4)"], "hydra.sweeper.sampler"),
    (["hydra.sweeper.storage=nourl", "loader.batch_size=choice(2,4)"], "hydra.sweeper.storage"),
    (["hydra.sweeper.confirm.top=-1", "loader.batch_size=choice(2,4)"],
     "hydra.sweeper.confirm.top=-1"),
    (["bench.steps=2"], "hydra.sweeper.params"),
    (["loader.batch_size=range(8,4)"], "loader.batch_size='range(8,4"),
    (["sweep=pipes", "hydra.sweeper.pipes.compute_overrides=[garbage]"],
     "hydra.sweeper.pipes.compute_overrides[0]='garbage'"),
])
def test_bad_sweeps_fail_in_one_line_before_any_job(tmp_path, args, key):
    p = _sweep(tmp_path, *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: ") and key in lines[0]
    assert "allowed" in lines[0] and "Traceback" not in p.stderr
    assert not list((tmp_path / "sweep").glob("*/results.json"))  # nothing launched


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["memory.reserve=1.5", "memory.ceiling=nan", "loader.batch_size=0"])
def test_max_batch_fails_in_one_line_on_the_keys_it_reads_before_any_probe(tmp_path, arg):
    p = _sweep(tmp_path, "sweep=max_batch", arg)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpubench: error: {arg}")
    assert "is not allowed" in lines[0] and "Traceback" not in p.stderr
    assert not list((tmp_path / "sweep").glob("*/results.json"))  # nothing launched


# ---------------------------------------------------------------------------- outcomes


def dead_pid() -> int:
    """A pid no process has: the kernel's pid_max (every pid is below it)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def _results(tmp: Path, name: str, **data) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"memory_ceiling": 0.8, **data}))
    return d


@pytest.mark.slow
def test_job_records_as_the_sweeper_reads_them(tmp_path):
    ok = read_job(_results(tmp_path, "ok", status="ok", images_per_sec=100.0,
                           peak_memory_fraction=0.5), None, "full")
    assert ok.feasible and ok.throughput == 100.0 and ok.constraint == pytest.approx(-0.3)
    over = read_job(_results(tmp_path, "over", status="over_ceiling", images_per_sec=120.0,
                             peak_memory_fraction=0.9), None, "full")
    # an over-ceiling run keeps its measured speed; the constraint makes it infeasible
    assert not over.feasible and over.throughput == 120.0 and over.constraint == pytest.approx(0.1)
    oom = read_job(_results(tmp_path, "oom", status="oom", peak_memory_fraction=0.3), None, "full")
    assert not oom.feasible and oom.throughput == 0.0 and oom.constraint == OOM_CONSTRAINT
    assert not oom.status.crashed
    nan = read_job(_results(tmp_path, "nan", status="ok", images_per_sec=None,
                            peak_memory_fraction=0.3), None, "full")
    assert nan.status.crashed and nan.status is Status.failed  # NaN is stored as null
    gone = read_job(tmp_path / "nowhere", RuntimeError("boom"), "full")
    assert gone.status.crashed and "boom" in gone.error
    raised = read_job(_results(tmp_path, "raised", status="ok", images_per_sec=5.0,
                               peak_memory_fraction=0.1), ValueError("late"), "full")
    assert raised.status is Status.failed and "late" in raised.error
    # left running by a process that is gone (kill -9): killed, not measured
    left = read_job(_results(tmp_path, "left", status="running", pid=dead_pid(),
                             host=socket.gethostname()), None, "full")
    assert left.status is Status.killed and left.status.crashed
    # still running in a live process (the job returned without finishing it): failed
    alive = read_job(_results(tmp_path, "alive", status="running", pid=os.getpid(),
                              host=socket.gethostname()), None, "full")
    assert alive.status is Status.failed


def test_fits_under_keeps_the_reserve(tmp_path):
    at = read_job(_results(tmp_path, "a", status="ok", images_per_sec=1.0,
                           peak_memory_fraction=0.77), None, "probe")
    assert at.fits_under(reserve=0.0) and not at.fits_under(reserve=0.05)  # 0.8 x 0.95 = 0.76


class RecordingLauncher:
    """Stands in for Hydra's launcher: each job leaves the results.json its run would have
    written (given in order), and returns as Hydra's jobs do."""

    def __init__(self, sweep: Path, records: list[dict]) -> None:
        self.sweep, self.records = sweep, records

    def launch(self, batch, initial_job_idx: int):
        from hydra.core.utils import JobReturn, JobStatus
        from omegaconf import OmegaConf

        out = []
        for i in range(len(batch)):
            d = self.sweep / str(initial_job_idx + i)
            (d / "results.json").write_text(json.dumps({"memory_ceiling": 0.8,
                                                        **self.records.pop(0)}))
            hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(d)}}})
            out.append(JobReturn(hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED,
                                 _return_value=0.0))
        return out


FAILED = {"status": "failed", "error": "RuntimeError: boom at http://u:pw@host:5000"}
OOM = {"status": "oom", "peak_memory_fraction": 0.9, "error": "OutOfMemoryError: injected"}
MEASURED = {"status": "ok", "images_per_sec": 10.0, "peak_memory_fraction": 0.1}
OVER = {"status": "over_ceiling", "images_per_sec": 10.0, "peak_memory_fraction": 0.9}


def test_a_trial_another_worker_took_over_costs_a_retry_not_the_sweep(tmp_path, caplog):
    """A worker whose trial another worker failed as stale meanwhile (its heartbeats lapsed past
    grace_period: a pause of this process or of the database) goes on: that trial's retry, from
    the queue, is measured, and the sweep ends with its n_trials measured."""
    from gpubench.search.jobs import Jobs
    from gpubench.search.loop import Search
    from gpubench.search.manifest import Manifest
    from gpubench.search.study import abandon, running_trials
    from hydra_plugins.gpubench_sweeper.config import ScreenConf

    url = f"sqlite:///{tmp_path / 'o.db'}"
    mine = open_study("s", url, heartbeat_interval=30, grace_period=60)
    other = open_study("s", url, heartbeat_interval=30, grace_period=60)

    class TakenOver(RecordingLauncher):
        def launch(self, batch, initial_job_idx: int):
            if initial_job_idx == 0:  # while the first job runs, the other worker fails it
                [t] = running_trials(other.study)
                assert abandon(other, t.number, requeue=True)
            return super().launch(batch, initial_job_idx)

    manifest = Manifest(tmp_path, "optuna")
    jobs = Jobs(TakenOver(tmp_path, [MEASURED] * 3), manifest, max_failures=0)
    space = parse_search_space(["loader.batch_size=choice(2,4)"])
    Search(mine, space, jobs, n_trials=2, n_jobs=1,
           screen=ScreenConf(None, 1.0, 0, []), poll_s=0.01).run()
    measured = measured_trials(mine.study)
    assert sorted(t.params["loader.batch_size"] for t in measured) == [2, 4]
    assert "taken over by another worker" in caplog.text
    first = mine.study.trials[0]
    assert first.state == TrialState.FAIL and first.user_attrs["interrupted"]
    assert any(0 in t.system_attrs.get("retry_history", ()) for t in measured)


@pytest.mark.parametrize("outcomes,failed", [
    ([FAILED, FAILED], True), ([FAILED, OOM], True), ([OOM], True),
    ([FAILED, MEASURED], False), ([OOM, OVER], False), ([], False),
])
def test_a_sweep_that_measured_nothing_has_failed(tmp_path, outcomes, failed):
    """docs/sweeps.md "When a sweep fails": an invocation whose jobs all failed or ran out of
    memory fails (exit 1); one measurement is enough (an OOM is a memory search's answer); an
    invocation with nothing left to run has not failed."""
    from gpubench.search.jobs import Jobs, SweepFailed
    from gpubench.search.manifest import Manifest

    jobs = Jobs(RecordingLauncher(tmp_path, list(outcomes)), Manifest(tmp_path, "optuna"), 10)
    for _ in outcomes:
        jobs.launch([["loader.batch_size=2"]], [{"trial": 0, "rung": "full"}])
    if not failed:
        jobs.check_measured()
        return
    with pytest.raises(SweepFailed) as e:
        jobs.check_measured()
    line = str(e.value)
    assert line.startswith("no job of this sweep measured (") and "\n" not in line
    assert outcomes[-1]["error"].split(" at ")[0] in line and ":pw@" not in line, line
    assert ("u:***@host" in line) == (outcomes[-1] is FAILED)  # its password masked
    assert str(tmp_path / "sweep.json") in line


def test_a_swept_workload_key_is_refused_naming_key_value_and_what_is_allowed():
    """A search ranks its trials as one setup: every workload key (what is trained: model,
    data, image size, phases, lr, a team's own +key) is refused before any trial; every knob,
    and how runs are measured (bench.steps), may be searched."""
    from gpubench.config.keys import Role
    from gpubench.config.knobs import KEYS, SEARCHABLE

    workload = [n for n, k in KEYS.items() if k.knob.role is Role.workload]
    assert {"dataset.image_size", "model.name", "bench.phases", "bench.lr"} <= set(workload)
    for key in [*workload, "model", "dataset", "+team.width"]:
        space = parse_search_space([f"{key}=choice(1,2)"])
        with pytest.raises(ConfigError) as e:
            space.require_knobs()
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"{key.lstrip('+')}=choice(1,2) is not "
                                                     "allowed: it must be a knob"), line
        assert "loader.num_workers" in line and "grid multirun" in line, line
    for key in [*SEARCHABLE, "bench.steps", "memory.ceiling"]:
        parse_search_space([f"{key}=choice(1,2)"]).require_knobs()


def test_the_sweep_presets_search_knobs_only(compose_cfg):
    from gpubench.config.paths import CONFIG_DIR

    for preset in sorted((CONFIG_DIR / "sweep").glob("*.yaml")):
        cfg = compose_cfg(f"sweep={preset.stem}", hydra=True)
        params = dict(cfg.hydra.sweeper.params or {})
        parse_search_space([], params).require_knobs()


class ByBatch(RecordingLauncher):
    """Each job's results.json by the batch size its overrides name (a sampler's order aside)."""

    def __init__(self, sweep: Path, records: dict[int, dict]) -> None:
        super().__init__(sweep, [])
        self.by_batch = records

    def launch(self, batch, initial_job_idx: int):
        for overrides in batch:
            b = next(int(o.split("=")[1]) for o in overrides if o.startswith("loader.batch_size="))
            self.records.append(self.by_batch[b])
        return super().launch(batch, initial_job_idx)


def _measured(batch: int, ips: float, stable: bool = True) -> dict:
    return {"status": "ok", "images_per_sec": ips, "images_per_sec_ci": [0.99 * ips, 1.01 * ips],
            "peak_memory_fraction": 0.1, "measurement_stable": stable, "rung": "full",
            "env": {"device": "cpu"},
            "config": {"loader": {"batch_size": batch, "num_workers": 0}}}


def _search_best(tmp_path, records: dict[int, dict], confirm=None) -> tuple[dict, object]:
    """sweep.json's best after a search of every batch in `records`, and what the report of
    the same sweep dir recommends."""
    from gpubench.search.jobs import Jobs
    from gpubench.search.loop import Search
    from gpubench.search.manifest import Manifest
    from gpubench.search.rows import recommendation
    from hydra_plugins.gpubench_sweeper.config import ScreenConf

    shared = open_study("s", f"sqlite:///{tmp_path / 'o.db'}", heartbeat_interval=30,
                        grace_period=60)
    manifest = Manifest(tmp_path, "optuna")
    jobs = Jobs(ByBatch(tmp_path, records), manifest, max_failures=0)
    space = parse_search_space([f"loader.batch_size=choice({','.join(map(str, records))})"])
    Search(shared, space, jobs, n_trials=len(records), n_jobs=1,
           screen=ScreenConf(None, 1.0, 0, []), poll_s=0.01, confirm=confirm).run()
    manifest.update(study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}")
    manifest.save()
    return read_json(tmp_path / "sweep.json")["best"], recommendation(tmp_path)


def test_sweep_json_best_is_never_a_trial_that_flagged_its_own_measurement(tmp_path):
    """Optuna's best_trial is the highest value; the report never recommends a run that
    flagged itself while a stable one measured: sweep.json's best is the report's pick."""
    best, rec = _search_best(tmp_path, {2: _measured(2, 100.0), 4: _measured(4, 300.0, False)})
    assert rec.chosen.knob("batch_size") == 2
    assert best["dir"] == rec.chosen.dir and best["params"] == {"loader.batch_size": 2}
    # the report's reference (fastest feasible) is the stable one too: no `fastest` apart
    assert best["value"] == 100.0 and rec.best is rec.chosen and "fastest" not in best


def test_sweep_json_best_after_the_confirm_step_is_the_recommended_run_not_the_fastest(tmp_path):
    """Confirmed alike, batch 4 is the fastest (the reference) and batch 2, within 5% of it, the
    recommendation: best is batch 2, the reference kept as `fastest`."""
    from hydra_plugins.gpubench_sweeper.config import ConfirmConf

    best, rec = _search_best(tmp_path, {2: _measured(2, 98.0), 4: _measured(4, 100.0)},
                             ConfirmConf(top=2, rounds=1))
    assert (rec.best.knob("batch_size"), rec.chosen.knob("batch_size")) == (4, 2)
    assert best["dir"] == rec.chosen.dir and best["params"] == {"loader.batch_size": 2}
    assert best["confirmed"] is True and best["measurements"] == 2
    assert best["fastest"]["dir"] == rec.best.dir


# ---------------------------------------------------------------------------- max batch


def test_max_batch_doubles_then_bisects():
    best, probes = find_max_batch(lambda b: b <= 12, start=4, limit=4096)
    assert best == 12
    assert [p.batch_size for p in probes] == [4, 8, 16, 12, 14, 13]


def test_max_batch_halves_when_the_start_does_not_fit():
    best, probes = find_max_batch(lambda b: b <= 5, start=64, limit=4096)
    assert best == 5
    assert [p.batch_size for p in probes][:5] == [64, 32, 16, 8, 4]


@pytest.mark.parametrize("above", [{"status": "refused", "error": "loader.batch_size=32 is not "
                                    "allowed: it must be at most the dataset's 20 samples"},
                                   FAILED])
def test_a_max_batch_probe_refused_as_bad_input_is_no_failed_trial(tmp_path, compose_cfg, above):
    """A probe past the dataset's size is refused (its config): the search goes on, as a search's
    refused trial does; a probe that crashed counts against max_failures (here 0); every probe
    refused ends the search as bad input."""
    from gpubench.search.jobs import Jobs, SweepFailed
    from gpubench.search.manifest import Manifest
    from gpubench.search.maxbatch import run_max_batch

    def probe(fit: int):
        fits = {**MEASURED, "memory_source": "host_rss"}
        records = {b: fits if b <= fit else above for b in range(1, 65)}
        jobs = Jobs(ByBatch(tmp_path, records), Manifest(tmp_path, "max_batch"), max_failures=0)
        return jobs, functools.partial(run_max_batch, jobs, parse_search_space([]),
                                       compose_cfg(), 4, 64, [])

    jobs, search = probe(20)
    if above is FAILED:
        with pytest.raises(SweepFailed, match="1 failed trials"):
            search()
        return
    result = search()
    assert result["max_batch"] == 20 and jobs.failures == 0
    # what the fraction is of, from a probe that read it: the last ones, refused, read none
    assert result["memory_of"] == "host RAM"
    # every probe refused (a key no batch size helps): its line and exit 2, not "none fits"
    with pytest.raises(SweepFailed, match=r"\(3 refused as bad input\)") as e:
        probe(0)[1]()
    assert e.value.code == 2


def test_max_batch_edges():
    assert find_max_batch(lambda b: False, 8, 100)[0] is None
    assert find_max_batch(lambda b: True, 8, 100)[0] == 100
    assert find_max_batch(lambda b: b <= 1, 1, 100)[0] == 1


# ---------------------------------------------------------------------------- study helpers


# a pid no process can have (above Linux's largest, 2^22): its worker is gone, without a fork
GONE_PID = 2**31 - 1


def _gone(t) -> None:
    """Trial t as asked by a process of this host that has died since."""
    t.set_user_attr("worker", f"{socket.gethostname()}:{GONE_PID}:{t.number}")


@pytest.mark.slow
def test_only_a_trial_that_stopped_beating_is_failed_and_retried(tmp_path):
    from gpubench.search.study import ask, fail_stale, heartbeat

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    space = parse_search_space(["loader.batch_size=range(1,100)"])
    # two workers on one study; sqlite's clock has 1 s resolution: a grace of 4 s
    a = open_study("s", storage, heartbeat_interval=1, grace_period=4)
    b = open_study("s", storage, heartbeat_interval=1, grace_period=4)
    done = ask(a, space.distributions)
    a.study.tell(done, 1.0)
    # asked by a live process (this one), so only its silent heartbeat can give it away: as a
    # worker on another machine that lost its power right after asking (ask beats once)
    dead = ask(a, space.distributions)
    killed = ask(a, space.distributions)
    _gone(killed)
    live = ask(b, space.distributions)
    assert fail_stale(b) == 1  # its process is gone: at once, not after the grace period
    with heartbeat(b, [live.number]):  # b keeps beating through the grace period
        time.sleep(6)
        assert fail_stale(a) == 1  # a live worker's trial is never touched
    trials = b.study.get_trials()
    assert trials[dead.number].state == TrialState.FAIL
    assert trials[killed.number].state == TrialState.FAIL
    assert trials[live.number].state == TrialState.RUNNING
    assert fail_stale(b) == 0  # failed once, retried once
    assert [t.number for t in measured_trials(b.study)] == [done.number]
    retries = [ask(b, space.distributions) for _ in range(2)]  # the queue comes first
    assert sorted(t.params["loader.batch_size"] for t in retries) == sorted(
        t.params["loader.batch_size"] for t in (dead, killed))
    assert all(t.number > live.number for t in retries)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # Optuna's own ask, outside optimize
def test_a_trial_whose_worker_died_before_naming_it_is_failed_at_once_under_the_file_lock(
        tmp_path):
    from gpubench.search.study import ask, fail_stale

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    space = parse_search_space(["loader.batch_size=range(1,100)"])
    a = open_study("s", storage, heartbeat_interval=30, grace_period=60)
    b = open_study("s", storage, heartbeat_interval=30, grace_period=60)
    # a worker killed between Optuna's ask and gpubench's naming, both inside the turn: the
    # kernel freed its lock, so no live asker can be naming it now (measured: a resume after
    # such a kill waited out the 60 s grace period)
    ghost = a.study.ask(space.distributions)
    live = ask(a, space.distributions)
    assert fail_stale(b, lambda: 1000.0) == 1  # at once: the clock has not moved
    states = {t.number: t.state for t in b.study.get_trials()}
    assert states[ghost.number] == TrialState.FAIL
    assert states[live.number] == TrialState.RUNNING
    assert ask(b, space.distributions).params == ghost.params  # queued again, first


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # Optuna's own ask, outside optimize
def test_without_a_file_lock_an_unnamed_trial_is_failed_after_the_grace_period(tmp_path):
    from gpubench.search.study import ask, fail_stale, set_attr

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    space = parse_search_space(["loader.batch_size=range(1,100)"])
    # a grace period no real beat runs out during the test: only the injected clock moves
    a = open_study("s", storage, heartbeat_interval=30, grace_period=60)
    b = open_study("s", storage, heartbeat_interval=30, grace_period=60)
    for shared in (a, b):  # as on a server database (PostgreSQL): no turn lock beside it
        shared.__dict__["turn"] = contextlib.nullcontext()
    # a worker killed between Optuna's ask and gpubench's: RUNNING, never beat, never named
    ghost = a.study.ask(space.distributions)
    late = a.study.ask(space.distributions)  # one named just after b first sees it
    live = ask(a, space.distributions)
    now = [1000.0]
    assert fail_stale(b, lambda: now[0]) == 0  # first seen: it may be being named this instant
    set_attr(late, "worker", f"{socket.gethostname()}:{os.getpid()}:{late.number}")
    now[0] += 60
    assert fail_stale(b, lambda: now[0]) == 0  # a grace period, not more
    now[0] += 1
    assert fail_stale(b, lambda: now[0]) == 1
    states = {t.number: t.state for t in b.study.get_trials()}
    assert states[ghost.number] == TrialState.FAIL
    assert states[late.number] == states[live.number] == TrialState.RUNNING
    assert ask(b, space.distributions).params == ghost.params  # queued again, first


# a worker asking for queued trials until the queue is empty: the numbers it was handed
_ASK_ALL = """
import json, sys, time
from optuna.distributions import IntDistribution
from gpubench.search.study import abandon, ask, open_study
shared = open_study("q", sys.argv[1], heartbeat_interval=30, grace_period=60)
got = []
while "queued" in (t := ask(shared, {"x": IntDistribution(0, 10**6)})).user_attrs:
    got.append(t.number)
    time.sleep(0.02)  # as a trial runs between claims: a tight loop would starve the other
abandon(shared, t.number)  # sampled: the queue is empty
print(json.dumps(got))
"""


@pytest.mark.slow
def test_two_workers_on_one_sqlite_file_are_never_handed_the_same_queued_trial(tmp_path):
    # Optuna pops a queued trial by reading then writing its state; without a lock SQLite lets
    # two workers both take one (measured here: 12 of 300 trials, both tell, the second fails)
    url = f"sqlite:///{tmp_path / 'q.db'}"
    shared = open_study("q", url, heartbeat_interval=30, grace_period=60)
    for x in range(100):
        shared.study.enqueue_trial({"x": x}, user_attrs={"queued": True})
    procs = [start_process(url, code=_ASK_ALL, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    got = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert got[0] and got[1], "one worker took the whole queue: nothing ran at once"
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == list(range(100))


def test_concurrent_study_creation_loads_the_winner(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    # Optuna's experimental warnings (heartbeats) stay quiet in every thread: catch_warnings is
    # process-wide, so threads quieting at once could restore each other's filters
    with warnings.catch_warnings(), ThreadPoolExecutor(4) as ex:
        warnings.simplefilter("error", optuna.exceptions.ExperimentalWarning)
        shared = list(ex.map(lambda _: open_study("race", storage, 1, 4), range(4)))
    shared[0].study.enqueue_trial({"x": 1})
    assert all(len(s.study.trials) == 1 for s in shared)  # one study, seen by all
    assert len(optuna.get_all_study_names(storage)) == 1


def test_a_storage_that_does_not_open_is_one_line_at_once(tmp_path, caplog):
    """A server that refuses, a file that is no database, a folder that is not there: one line
    naming the storage (its password masked) and the database's own reason, without the
    retries a creation race gets; the report reads the job folders instead."""
    from conftest import free_port

    from gpubench.search.jobs import SweepFailed
    from gpubench.search.rows import load_dir

    (tmp_path / "notadb.db").write_text("a spreadsheet, not a database")
    cases = [(f"postgresql+psycopg://u:pw@127.0.0.1:{free_port()}/db", "Connection refused"),
             (f"sqlite:///{tmp_path / 'notadb.db'}", "file is not a database"),
             (f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}", "unable to open database file")]
    for url, reason in cases:
        with pytest.raises(SweepFailed) as e:
            open_study("s", url, 1, 4)
        line = str(e.value)
        assert line.startswith("the study storage ") and "could not be opened: " in line
        assert reason in line and "\n" not in line and "[SQL" not in line and ":pw@" not in line
    # a sweep whose sweep.json names such a storage: the report warns in one line, reads files
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    d = _results(sweep, "0", status="ok", images_per_sec=5.0, peak_memory_fraction=0.1)
    (sweep / "sweep.json").write_text(json.dumps({
        "mode": "optuna", "study_name": "s", "storage": cases[1][0],
        "jobs": [{"num": 0, "dir": str(d), "trial": 0, "rung": "full", "status": "ok"}]}))
    rows, study = load_dir(sweep)
    assert study is None and [r.label for r in rows] == ["0"]
    [warning] = [r.getMessage() for r in caplog.records if "not readable" in r.getMessage()]
    assert "file is not a database" in warning and "\n" not in warning


def test_a_studys_rows_are_labelled_by_their_job_folders(tmp_path):
    """The user finds a run by its job folder's name, not by Optuna's trial number: the two part
    as soon as a trial is screened, confirmed or resumed. A trial naming no folder keeps its
    number; each row keeps its trial's number (with its stage's prefix) as `trial`."""
    import shutil

    from gpubench.search.rows import trial_rows

    shared = open_study("s", None)
    dist = {"loader.batch_size": CategoricalDistribution([2, 4, 8])}
    for batch, folder in ((2, "5"), (4, "8"), (8, None)):
        t = shared.study.ask(dist)
        t.set_user_attr("status", "ok")
        t.set_user_attr("throughput", 10.0 * batch)
        if folder is not None:
            d = _results(tmp_path, folder, status="ok", images_per_sec=10.0 * batch,
                         peak_memory_fraction=0.1, config={"loader": {"batch_size": batch}})
            t.set_user_attr("dir", str(d))
        shared.study.tell(t, 10.0 * batch)
    shutil.rmtree(tmp_path / "8")  # a folder gone since: the study's figures, under its name
    rows = trial_rows(shared.study, shared.storage, prefix="compute-")
    assert [(t.number, r.label, r.trial) for t, r in rows] == [
        (0, "5", "compute-0"), (1, "8", "compute-1"), (2, "compute-2", "compute-2")]
    assert [r.throughput for _, r in rows] == [20.0, 40.0, 80.0]


def test_ctrl_c_queues_the_running_trial_again():
    shared = open_study("s", None)
    study = shared.study
    space = parse_search_space(["loader.batch_size=choice(2,4,8)"])
    t = study.ask(space.distributions)
    assert abandon(shared, t.number, requeue=True)
    assert not abandon(shared, t.number, requeue=True)  # only a RUNNING trial
    assert study.trials[t.number].user_attrs["interrupted"]
    retry = study.ask(space.distributions)  # queued again by Optuna's retry callback
    assert retry.params == t.params and "interrupted" not in retry.user_attrs
    assert study.trials[retry.number].system_attrs["retry_history"] == [t.number]
    # a claim given back (requeue=None) is queued again only when it came from the queue
    study.enqueue_trial({"loader.batch_size": 8})
    queued, sampled = study.ask(space.distributions), study.ask(space.distributions)
    assert abandon(shared, queued.number, requeue=None)
    assert abandon(shared, sampled.number, requeue=None)
    assert [w.params for w in study.get_trials(states=(TrialState.WAITING,))] == [queued.params]
    assert measured_trials(study) == []


def test_a_claim_past_the_last_slot_is_given_back(tmp_path):
    from gpubench.search.study import ask, claim_is_within

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    a, b = open_study("s", storage, 1, 4), open_study("s", storage, 1, 4)
    space = parse_search_space(["x=range(0,100)"])
    first = ask(a, space.distributions)
    a.study.tell(first, 1.0)
    # n_trials=2: one slot left, two workers ask for it at once
    ta, tb = ask(a, space.distributions), ask(b, space.distributions)
    assert claim_is_within(a.study, ta.number, 2)
    assert not claim_is_within(b.study, tb.number, 2)
    assert claim_is_within(b.study, tb.number, 3)  # with n_trials=3 both fit


def test_a_twin_of_another_workers_live_trial_is_not_run(tmp_path):
    shared = open_study("s", None)
    study = shared.study
    space = parse_search_space(["loader.batch_size=choice(2,4)"])
    study.enqueue_trial({"loader.batch_size": 2})
    study.enqueue_trial({"loader.batch_size": 2})
    other = study.ask(space.distributions)  # another worker's, still running
    mine = study.ask(space.distributions)
    fresh, dups = split_duplicates(study, [mine])
    assert fresh == [] and [(t.number, n) for t, n in dups] == [(mine.number, other.number)]
    # the other worker (lower number) does not yield to mine
    fresh, dups = split_duplicates(study, [other])
    assert fresh == [other] and dups == []


def test_confirm_rounds_are_shared_and_never_lost(tmp_path):
    """Several workers reach the confirm step together: each round is queued once, interleaved,
    and Optuna's queue hands it to one worker; a round whose worker died on this host, or was
    interrupted (Ctrl-C), is queued again at once with its trial and round; a round measured
    twice (two workers queueing it in the same milliseconds) keeps both folders."""
    from gpubench.search.study import abandon, ask, confirm_dirs, fail_stale, queue_rounds

    url = f"sqlite:///{tmp_path / 's.db'}"
    space = parse_search_space(["x=range(0,100)"])
    a, b = open_study("c", url, 1, 60), open_study("c", url, 1, 60)  # no beat goes stale here
    top = []
    for x in (5, 7):
        a.study.enqueue_trial({"x": x})
        t = ask(a, space.distributions)
        a.study.tell(t, float(x))
        top.append(a.study.trials[t.number])
    ca = queue_rounds(a, top, 2)
    cb = queue_rounds(b, top, 2)  # the second worker queues nothing again

    def waiting():
        return [(w.user_attrs["confirm_of"], w.user_attrs["round"])
                for w in cb.study.get_trials(states=(TrialState.WAITING,))]

    def measure(c, r, d):
        r.set_user_attr("dir", d)
        c.study.tell(r, 1.0)

    assert waiting() == [(0, 0), (1, 0), (0, 1), (1, 1)]  # A, B, A, B
    r0, r1 = ask(ca, space.distributions), ask(cb, space.distributions)
    assert (r0.params, r1.params) == ({"x": 5}, {"x": 7})
    _gone(r1)  # b's worker died on this host; a (this process) is alive
    assert fail_stale(ca) == 1
    r2 = ask(ca, space.distributions)
    assert abandon(ca, r2.number, requeue=True)  # Ctrl-C while measuring round 1 of A
    assert waiting() == [(1, 1), (1, 0), (0, 1)]
    measure(ca, r0, "/runs/a0")
    cb.study.enqueue_trial({"x": 5}, user_attrs={"confirm_of": 0, "round": 0})  # the race
    for d in ("/runs/b1", "/runs/b0", "/runs/a1", "/runs/a0bis"):
        measure(cb, ask(cb, space.distributions), d)
    assert waiting() == [] and not cb.study.get_trials(states=(TrialState.RUNNING,))
    assert confirm_dirs("c", url) == {0: ["/runs/a0", "/runs/a0bis", "/runs/a1"],
                                      1: ["/runs/b0", "/runs/b1"]}
    assert confirm_dirs("none", url) == {}  # no confirm step ran


def test_the_confirm_step_re_measures_the_fastest_unflagged_trials_first():
    """The confirm step took the fastest figures flagged or not: a `too short` trial (which can
    never be confirmed, nor recommended beside a steady one) took a slot and the steady fastest
    was never re-measured, so the report's "fastest stable" was a slower one."""
    from gpubench.search.loop import to_confirm

    def rec(ips, stable):
        return RunRecord(status=Status.ok, images_per_sec=ips, measurement_stable=stable)

    found = [(rec(1300.0, False), "flagged"), (rec(1232.6, True), "steady"),
             (rec(1156.7, True), "next"), (rec(900.0, None), "unchecked")]
    assert to_confirm(found, 2) == ["steady", "next"]
    assert to_confirm(found, 4) == ["steady", "next", "unchecked", "flagged"]


def test_a_resume_finds_the_confirm_rounds_a_kill_left_unmeasured(tmp_path):
    """sweep=pipes decides again whether its join needs confirm rounds from the figures a
    resume reads, pooled with the rounds measured before the kill: it decided none, and the
    queued rounds stayed WAITING for good. What is left of the step is read from its study."""
    from gpubench.search.study import ask, queue_rounds, rounds_left

    url = f"sqlite:///{tmp_path / 's.db'}"
    space = parse_search_space(["x=range(0,100)"])
    a = open_study("j", url, 1, 60)
    assert rounds_left(a) == 0  # no confirm step yet
    a.study.enqueue_trial({"x": 5})
    t = ask(a, space.distributions)
    a.study.tell(t, 5.0)
    c = queue_rounds(a, [a.study.trials[t.number]], 2)
    assert rounds_left(a) == 2
    r = ask(c, space.distributions)
    assert rounds_left(a) == 2  # one running (its worker may be killed), one waiting
    c.study.tell(r, 1.0)
    assert rounds_left(a) == 1


def test_screen_cut_counts_pruned_screens_too():
    study = optuna.create_study(direction="maximize")
    space = parse_search_space(["a=range(0,100)"])

    def screened(value, state):
        t = study.ask(space.distributions)
        t.report(value, 0)
        study.tell(t, value if state == TrialState.COMPLETE else None, state=state)

    assert screen_passes(study, 1.0, keep=0.5, n_startup=2)  # nothing to compare with yet
    for v, state in [(100, TrialState.COMPLETE), (90, TrialState.COMPLETE),
                     (10, TrialState.PRUNED), (20, TrialState.PRUNED)]:
        screened(v, state)
    # 60 is 3rd of the 5 screens (its own included): in the top half; the kept screens alone
    # (100, 90: Optuna's PercentilePruner) would cut it
    assert screen_passes(study, 60.0, keep=0.5, n_startup=2)
    assert not screen_passes(study, 15.0, keep=0.5, n_startup=2)
    assert screen_passes(study, 0.0, keep=1.0, n_startup=2)
    assert screen_passes(study, 0.0, keep=0.5, n_startup=5)


def test_duplicates_are_detected(tmp_path):
    study = optuna.create_study(direction="maximize")
    space = parse_search_space(["loader.batch_size=choice(2,4)"])
    study.enqueue_trial({"loader.batch_size": 2})
    first = study.ask(space.distributions)
    study.tell(first, 3.0)
    study.enqueue_trial({"loader.batch_size": 2})
    study.enqueue_trial({"loader.batch_size": 4})
    study.enqueue_trial({"loader.batch_size": 4})
    trials = [study.ask(space.distributions) for _ in range(3)]
    fresh, dups = split_duplicates(study, trials)
    assert [t.params for t in fresh] == [{"loader.batch_size": 4}]
    assert [(t.number, prev) for t, prev in dups] == [(trials[0].number, first.number),
                                                     (trials[2].number, trials[1].number)]


def test_settings_differing_only_in_a_key_inert_there_are_one_run_of_the_search():
    """Thread workers with persistent_workers=true and =false were two trials, both counted
    toward n_trials, two rows alike but for noise: the key does nothing with thread workers
    (knobs.acts), fixed on the command line or swept."""
    study = optuna.create_study(direction="maximize")
    space = parse_search_space(["loader.worker_type=thread", "loader.num_workers=choice(1,2)",
                                "loader.persistent_workers=choice(true,false)"])
    assert space.size() == 2  # of 4 points
    for pw in (True, False):
        study.enqueue_trial({"loader.num_workers": 1, "loader.persistent_workers": pw})
    first = study.ask(space.distributions)
    study.tell(first, 3.0)
    [twin] = [study.ask(space.distributions)]
    fresh, dups = split_duplicates(study, [twin], space.fixed_values)
    assert fresh == [] and [(t.number, prev) for t, prev in dups] == [(twin.number, first.number)]
    # with process workers it acts: two runs
    process = parse_search_space(["loader.num_workers=choice(1,2)",
                                  "loader.persistent_workers=choice(true,false)"])
    assert process.size() == 4
    assert split_duplicates(study, [twin], process.fixed_values)[0] == [twin]


# ---------------------------------------------------------------------------- real sweeps

SWEEP_TINY = [o for o in TINY if not o.startswith("tracking=")]


def _sweep(tmp: Path, *args: str, tracking: tuple[str, ...] = ("tracking=none",), **kw):
    return run_cli("-m", "hydra/sweeper=gpubench", *SWEEP_TINY, *tracking,
                   f"hydra.sweep.dir={tmp / 'sweep'}", *args, cwd=tmp, **kw)


def _study(sweep_dir: Path):
    m = json.loads((sweep_dir / "sweep.json").read_text())
    return optuna.load_study(study_name=m["study_name"], storage=m["storage"]), m


def _results_of(trial) -> dict:
    return json.loads((Path(trial.user_attrs["dir"]) / "results.json").read_text())


@pytest.mark.slow
def test_optuna_sweep_screens_then_measures_and_tracks(tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    p = _sweep(
        tmp_path, "loader.batch_size=choice(2,4,8)", "precision=choice(fp32,amp_bf16)",
        "bench.steps=3", "hydra.sweeper.n_trials=5", "hydra.sweeper.seed=0",
        "hydra.sweeper.screen.steps=1", "hydra.sweeper.screen.n_startup_trials=1",
        "hydra.sweeper.confirm.top=0",  # this test is about the screen: rungs screen + full
        tracking=("tracking=mlflow", f"tracking.uri={sqlite_store(db)}"),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    sweep = tmp_path / "sweep"
    study, manifest = _study(sweep)
    measured = measured_trials(study)
    assert len(measured) == 5
    assert len({json.dumps(t.params, sort_keys=True) for t in measured}) == 5  # none repeated
    assert {t.state for t in measured} <= {TrialState.COMPLETE, TrialState.PRUNED}
    # the screen's cut, replayed from the screens in trial order (keep 0.5, 1 startup trial):
    # kept exactly those in the top half of the screens so far (whatever the speeds measured)
    screens: list[float] = []
    for t in sorted(measured, key=lambda t: t.number):
        value = t.intermediate_values[0]
        better = sum(x > value for x in screens)
        kept = len(screens) < 1 or better < math.ceil(0.5 * (len(screens) + 1))
        assert (t.state == TrialState.COMPLETE) == kept, (t.number, value, screens)
        screens.append(value)
    for t in measured:
        assert t.constraints["memory"] <= 0  # the tiny model is far under the ceiling
        data = _results_of(t)
        assert data["status"] == "ok"
        assert data["config"]["loader"]["batch_size"] == t.params["loader.batch_size"]
        # a pruned trial was measured only by its short screen, a complete one also in full
        assert data["config"]["bench"]["steps"] == (1 if t.state == TrialState.PRUNED else 3)
    jobs = manifest["jobs"]
    for t in measured:
        rungs = sorted(j["rung"] for j in jobs if j["trial"] == t.number)
        assert rungs == (["screen"] if t.state == TrialState.PRUNED else ["full", "screen"])
    best = study.best_trial
    assert best.value == max(t.value for t in measured if t.state == TrialState.COMPLETE)

    # every job is a child of the sweep's one MLflow parent run
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("gpubench").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    job_uids = {json.loads((Path(j["dir"]) / "results.json").read_text())["run_uid"] for j in jobs}
    assert {r.data.tags["run_uid"] for r in children} == job_uids
    # the report was made at the end and attached to the parent
    assert (sweep / "report" / "experiment" / "recommended.yaml").is_file()
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"ranking.csv", "recommended.yaml"} <= artifacts
    # the batch plot is drawn exactly when the full measurements varied the batch size
    full_batches = {t.params["loader.batch_size"] for t in measured
                    if t.state == TrialState.COMPLETE}
    assert ("throughput_vs_batch.png" in artifacts) == (len(full_batches) > 1)


@pytest.mark.slow
def test_a_sweep_of_a_workload_key_is_one_line_and_exit_2_before_any_trial(tmp_path):
    """dataset.image_size=choice(16,64) searched: trials of two setups ranked as one, the best
    crossing them; refused before a study or a job exists."""
    db = tmp_path / "o.db"
    p = _sweep(tmp_path, "dataset.image_size=choice(16,64)", "hydra.sweeper.n_trials=2",
               f"hydra.sweeper.storage=sqlite:///{db}")
    assert p.returncode == 2, p.stderr[-2000:]
    [line] = [x for x in p.stderr.splitlines() if x.strip()]
    assert "dataset.image_size=choice(16,64) is not allowed: it must be a knob" in line, line
    assert not db.exists() and not read_json(tmp_path / "sweep" / "sweep.json").get("jobs")


@pytest.mark.slow
def test_confirm_step_remeasures_the_top_trials_interleaved(tmp_path):
    from gpubench.search.rows import load_dir
    from gpubench.search.study import confirm_dirs

    args = ["loader.batch_size=choice(1,2,4,8)", "hydra.sweeper.n_trials=4",
            "hydra.sweeper.screen.steps=null", "hydra.sweeper.seed=0",
            "hydra.sweeper.confirm.top=2", "hydra.sweeper.confirm.rounds=2"]
    p = _sweep(tmp_path, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    sweep = tmp_path / "sweep"
    study, manifest = _study(sweep)
    measured = measured_trials(study)
    assert len(measured) == 4 and manifest["measured_trials"] == 4
    full = [j for j in manifest["jobs"] if j["rung"] == "full"]
    confirm = [j for j in manifest["jobs"] if j["rung"] == "confirm"]
    assert len(full) == 4 and len(confirm) == 4
    assert manifest["jobs"][:4] == full  # after the trials, never among them
    # the two fastest full measurements (as their records read), interleaved A, B, A, B
    recs = {j["trial"]: record.load(j["dir"]) for j in full}
    top = sorted(recs, key=lambda n: -recs[n].throughput)[:2]
    assert [j["trial"] for j in confirm] == [*top, *top]
    for j in confirm:  # each the trial's own configuration, measured in a job of its own
        rec = record.load(j["dir"])
        assert rec.knob("loader.batch_size") == recs[j["trial"]].knob("loader.batch_size")
        assert j["dir"] not in {x["dir"] for x in full}
        # not a trial: no trial of the study (duplicates included) holds it
        assert j["dir"] not in {t.user_attrs.get("dir") for t in study.trials}
    kept = confirm_dirs(manifest["study_name"], manifest["storage"])
    for n in top:
        assert kept[n] == [j["dir"] for j in confirm if j["trial"] == n]
    # best: the report's reference, a confirmed trial whenever one measured alike again
    # each trial's row, named by the folder of its full measurement (as the user finds it)
    by_label = {r.label: r for r in load_dir(sweep)[0]}
    rows = {j["trial"]: by_label[Path(j["dir"]).name] for j in full}
    assert len(by_label) == 4 and all(bool(rows[n].confirms) == (n in top) for n in recs)
    assert all(rows[n].trial == str(n) for n in recs)
    # best is the run the report recommends; its reference (`fastest` where another trial) the
    # fastest stable confirmed one
    best, summary = manifest["best"], json.loads((sweep / "report" / "summary.json").read_text())
    assert best["dir"] == summary["recommended"]["dir"]
    reference = best.get("fastest", best)
    assert reference["dir"] == summary["best"]["dir"]
    stable_top = [n for n in top if rows[n].stable]
    if stable_top:
        assert reference["trial"] in stable_top
        assert reference["value"] == max(rows[n].throughput for n in stable_top)
    chosen = next(r for r in by_label.values() if r.dir == best["dir"])
    assert best["confirmed"] == chosen.confirmed and best["measurements"] == len(chosen.pooled)
    # the report's ranking shows the pooled figure of a confirmed trial
    pooled = rows[top[0]]
    import statistics

    figures = [recs[top[0]].throughput,
               *(record.load(d).throughput for d in kept[top[0]])]
    assert pooled.throughput == pytest.approx(statistics.median(figures))
    ranking = (sweep / "report" / "ranking.csv").read_text().splitlines()
    shown = [line.split(",") for line in ranking[1:] if line.split(",")[1] == pooled.label]
    assert [(c[3], c[9]) for c in shown] == [(f"{pooled.throughput:.1f}", "full+2 confirm")]

    # the same command again: the study is complete and confirmed, nothing is launched
    p = _sweep(tmp_path, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    again = json.loads((sweep / "sweep.json").read_text())
    assert again["jobs"] == manifest["jobs"]


@pytest.mark.slow
def test_confirm_step_never_takes_a_pruned_trials_screen_for_a_full_run(tmp_path):
    # every screen step (no warm-up) sleeps 1 s (fault.stall_*), twenty times a tiny step even
    # on a loaded machine (50 ms was not: a batch-2 step slowed by load screened below batch 1
    # and nothing was pruned), so a screen's throughput is about its batch size per second; with
    # the seeded random sampler's fixed order (2, 8, 1, repeats, then 4) batch 1, screened below
    # 2 and 8, is pruned every time. Full runs are not stalled: their speed decides nothing here.
    p = _sweep(tmp_path, "loader.batch_size=choice(1,2,4,8)", "bench.steps=3",
               "hydra.sweeper.screen.overrides=['bench.phases=[e2e]','fault.stall_every=1',"
               "'fault.stall_s=1','bench.warmup_steps=0','bench.warmup_max_steps=0']",
               "hydra.sweeper.sampler=random",
               "hydra.sweeper.n_trials=4", "hydra.sweeper.seed=0", "hydra.sweeper.screen.steps=1",
               "hydra.sweeper.screen.n_startup_trials=1", "hydra.sweeper.confirm.top=4",
               "hydra.sweeper.confirm.rounds=1", "hydra.sweeper.report=false")
    assert p.returncode == 0, p.stderr[-3000:]
    study, manifest = _study(tmp_path / "sweep")
    complete = {t.number for t in measured_trials(study) if t.state == TrialState.COMPLETE}
    assert len(complete) < 4  # the screen pruned some: they are no candidates
    assert sorted(j["trial"] for j in manifest["jobs"] if j["rung"] == "confirm") == sorted(
        complete)


@pytest.mark.slow
def test_oom_trials_are_infeasible_and_the_sweep_goes_on(tmp_path):
    p = _sweep(tmp_path, "loader.batch_size=choice(2,4,8,16)", "fault.oom_above_batch=4",
               "hydra.sweeper.n_trials=4", "hydra.sweeper.screen.steps=null",
               "hydra.sweeper.seed=0", "hydra.sweeper.confirm.top=0")  # about OOM: no confirm
    assert p.returncode == 0, p.stderr[-3000:]
    study, _ = _study(tmp_path / "sweep")
    by_batch = {t.params["loader.batch_size"]: t for t in measured_trials(study)}
    assert sorted(by_batch) == [2, 4, 8, 16]  # the whole space, each once
    for b in (8, 16):
        t = by_batch[b]
        assert t.state == TrialState.COMPLETE and t.value == 0.0
        assert t.user_attrs["status"] == "oom" and t.constraints["memory"] == OOM_CONSTRAINT
        assert "fault.oom_above_batch" in t.user_attrs["error"]
    for b in (2, 4):
        assert by_batch[b].value > 0 and by_batch[b].constraints["memory"] <= 0
    assert study.best_trial.params["loader.batch_size"] in (2, 4)
    report = tmp_path / "sweep" / "report"
    # 4 completed trials are too few for parameter importance (it needs 8: report.plot_rules)
    assert not (report / "importance.png").exists()
    rec = json.loads((report / "summary.json").read_text())["recommended"]
    assert rec["overrides"] in (["loader.batch_size=2"], ["loader.batch_size=4"])


@pytest.mark.slow
def test_failed_trials_are_recorded_up_to_the_limit(tmp_path):
    p = _sweep(tmp_path, "loader.batch_size=choice(2,4,8,16)", "fault.fail_message=boom",
               "hydra.sweeper.n_trials=4", "hydra.sweeper.screen.steps=null",
               "hydra.sweeper.max_failures=1", "hydra.sweeper.report=false")
    assert p.returncode != 0
    assert "max_failures=1" in p.stderr
    study, _ = _study(tmp_path / "sweep")
    measured = measured_trials(study)  # (a re-proposed configuration is a duplicate, not run)
    assert [t.state for t in measured] == [TrialState.FAIL] * 2  # the second crossed the limit
    assert all("boom" in t.user_attrs["error"] for t in study.trials)
    assert all(t.state == TrialState.FAIL for t in study.trials)


@pytest.mark.slow
@pytest.mark.parametrize("fault, said, code, counts", [
    ("fault.fail_message=boom", "boom", 1, "2 failed"),
    # refused as bad input: its own line, not "no results.json"; every job: exit 2, as one run
    ("bench.optimizer_impl=foreach", "bench.optimizer_impl='foreach' is not allowed", 2,
     "2 refused as bad input")])
def test_a_sweep_whose_jobs_all_fail_exits_in_one_line(tmp_path, fault, said, code, counts):
    """Under max_failures, yet nothing measured: the sweep failed (before: exit 0)."""
    p = _sweep(tmp_path, "loader.batch_size=choice(2,4)", fault,
               "hydra.sweeper.n_trials=2", "hydra.sweeper.screen.steps=null")
    errors = [ln for ln in p.stderr.splitlines() if "no job of this sweep" in ln]
    assert p.returncode == code and len(errors) == 1, p.stderr[-3000:]
    assert f"no job of this sweep measured ({counts})" in errors[0] and said in errors[0]
    assert "Traceback" not in p.stderr and not (tmp_path / "sweep" / "report").exists()
    assert len(json.loads((tmp_path / "sweep" / "sweep.json").read_text())["jobs"]) == 2
    from gpubench.core.exits import REJECTED

    assert REJECTED == []  # its refusals ended with it: a later multirun in this process has none


@pytest.mark.slow
def test_a_search_names_a_refused_trial_under_its_ranking_not_as_a_failed_row(tmp_path):
    """fp16 autocast is refused on a CPU when its job resolves: the trial is told FAIL but is no
    failure of the machine (max_failures=0 does not end the search), its report names it under
    the ranking as a grid's does, not as a `failed 0.0` row; the study keeps it, so a later
    report from the study says the same."""
    from gpubench.report.write import REPORT_DIR, sweep_report

    p = _sweep(tmp_path, "precision=choice(fp32,amp_fp16)", "hydra.sweeper.n_trials=2",
               "hydra.sweeper.screen.steps=null", "hydra.sweeper.max_failures=0",
               "hydra.sweeper.confirm.top=0")
    assert p.returncode == 0, p.stderr[-3000:]
    # the log names the best trial's job folder, as the ranking names it (`run 2`)
    best = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["best"]
    assert (f"best feasible (as the report recommends): trial {best['trial']} "
            f"(run {Path(best['dir']).name}), ") in p.stdout + p.stderr
    line = ("refused: precision=amp_fp16: precision='amp_fp16' is not allowed: it must be "
            "torch_default, fp32, tf32 or amp_bf16 on CPU (fp16 autocast needs CUDA)")
    out = p.stdout.splitlines()
    assert line in out and out.index(line) > out.index(RANK_ORDER), p.stdout[-3000:]
    assert not any(ln.split()[2:3] == ["failed"] for ln in out if ln[:1].isdigit())
    study, m = _study(tmp_path / "sweep")
    assert sorted(t.user_attrs["status"] for t in measured_trials(study)) == ["ok", "refused"]
    assert sorted(j["status"] for j in m["jobs"]) == ["ok", "refused"]
    summary = tmp_path / "sweep" / REPORT_DIR / "summary.json"
    summary.unlink()  # made again, from the study
    sweep_report(tmp_path / "sweep", quiet=True)
    got = json.loads(summary.read_text())
    assert got["rows"] == 1 and line in got["lines"]
    assert got["refused"][0]["overrides"] == ["precision=amp_fp16"]


@pytest.mark.slow
def test_resume_after_kill_continues_to_n_trials(tmp_path):
    args = ["loader.batch_size=range(1,9)", "precision=choice(fp32,amp_bf16)",
            "hydra.sweeper.n_trials=5", "hydra.sweeper.screen.steps=null", "hydra.sweeper.seed=3",
            "hydra.sweeper.report=false", "hydra.sweeper.confirm.top=0"]  # resume of trials
    cmd = ["-m", "hydra/sweeper=gpubench", *SWEEP_TINY,
           "tracking=none", f"hydra.sweep.dir={tmp_path / 'sweep'}", *args]
    proc = start_process(*cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_measured(tmp_path, proc, 2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # as `kill -9`: nothing gets to clean up
        proc.wait()
    study, _ = _study(tmp_path / "sweep")
    first = len(measured_trials(study))
    assert 2 <= first < 5, "the sweep was not killed mid-way"
    # what the kill interrupted: the trials it left RUNNING (a claim the resume asks past the
    # free slots and gives back is marked `interrupted` too, and is never measured: no loss)
    cut = {t.number for t in study.trials if t.state == TrialState.RUNNING}

    p = _sweep(tmp_path, *args)  # the same command again
    assert p.returncode == 0, p.stderr[-3000:]
    study, _ = _study(tmp_path / "sweep")
    measured = measured_trials(study)
    assert len(measured) == 5
    assert len({json.dumps(t.params, sort_keys=True) for t in measured}) == 5
    # each measured trial has its own job folder, still holding its own results
    assert len({t.user_attrs["dir"] for t in measured}) == 5
    # the manifest lists the jobs of both invocations
    jobs = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["jobs"]
    assert {t.user_attrs["dir"] for t in measured} <= {j["dir"] for j in jobs}
    for t in measured:
        data = _results_of(t)
        assert data["config"]["loader"]["batch_size"] == t.params["loader.batch_size"]
    for t in study.trials:  # a trial the kill interrupted was asked again, not lost
        assert t.state != TrialState.RUNNING
        if t.number in cut:
            assert t.user_attrs.get("interrupted") or t.state == TrialState.FAIL, t
            assert any(t.number in x.system_attrs.get("retry_history", ()) for x in measured)
    # the report reads the whole study: both invocations, one row per measured trial
    from gpubench.report.write import sweep_report

    sweep_report(tmp_path / "sweep", quiet=True)
    ranking = (tmp_path / "sweep" / "report" / "ranking.csv").read_text().splitlines()
    assert len(ranking) == 1 + 5


def _wait_for_measured(tmp: Path, proc, n: int) -> None:
    """Until the study holds n measured trials (told to Optuna, not only run)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if (tmp / "sweep" / "sweep.json").is_file():
            if len(measured_trials(_study(tmp / "sweep")[0])) >= n:
                return


def _wait_for_jobs(tmp: Path, proc, n: int) -> None:
    """Until n jobs have finished, read from the sweep's manifest (a small JSON file written as
    each job ends: cheap to poll, unlike opening the study, which takes seconds the first time
    and lets the next trial run on before a signal is sent)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        m = read_json(tmp / "sweep" / "sweep.json") or {}
        if sum(j.get("status") in ("ok", "over_ceiling", "oom") for j in m.get("jobs", [])) >= n:
            return


def _wait_for_results(tmp: Path, proc, n: int) -> None:
    """Until n job folders hold a results.json (a job writes it after its first window)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((tmp / "sweep").glob("*/results.json"))) >= n:
            return
        time.sleep(0.1)


@pytest.mark.slow
def test_ctrl_c_leaves_no_running_trial(tmp_path):
    cmd = ["-m", "hydra/sweeper=gpubench", *SWEEP_TINY,
           "tracking=none", f"hydra.sweep.dir={tmp_path / 'sweep'}",
           # each phase lasts its 1 s cap, whatever the machine's speed: a trial is ~3 s long
           "bench.steps=1000000", "bench.max_seconds=1", "loader.batch_size=range(1,9)", "hydra.sweeper.n_trials=4",
           "hydra.sweeper.screen.steps=null", "hydra.sweeper.report=false",
           "hydra.sweeper.confirm.top=0"]
    # (start_process's child raises KeyboardInterrupt on SIGINT even where a shell running the
    # tests in the background ignores it)
    proc = start_process(*cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_jobs(tmp_path, proc, 1)
        # into the next trial's ~3 s: once it has written its first phase (a fixed sleep here
        # fell between the trials on a loaded machine, and nothing was interrupted)
        _wait_for_results(tmp_path, proc, 2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    study, _ = _study(tmp_path / "sweep")
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states
    assert len(measured_trials(study)) == 1
    # the sampler may propose batch sizes already measured: those trials copy the earlier
    # result at once (attr duplicate_of), measure nothing and are no part of this check
    own = [t for t in study.trials if "duplicate_of" not in t.user_attrs]
    assert [t.user_attrs.get("interrupted") for t in own] == [None, True, None]
    # the interrupted configuration is queued for the next invocation, as after kill -9
    queued = own[2]
    assert queued.state == TrialState.WAITING
    assert queued.system_attrs["retry_history"] == [own[1].number]


@pytest.mark.slow
def test_max_batch_finds_the_largest_fitting_batch(tmp_path):
    p = run_cli("sweep=max_batch", *TINY, "loader.batch_size=4", "fault.oom_above_batch=12",
                f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.report=false",
                cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "max batch under 80% x (1 - 5%) of host RAM: 12" in p.stdout  # a CPU run
    found = json.loads((tmp_path / "sweep" / "max_batch.json").read_text())
    assert found["max_batch"] == 12
    assert [(x["batch_size"], x["fits"]) for x in found["probes"]] == [
        (4, True), (8, True), (16, False), (12, True), (14, False), (13, False)]
    for x in found["probes"]:  # each probe is a job of its own, OOM ones recorded as such
        data = json.loads((Path(x["dir"]) / "results.json").read_text())
        assert data["status"] == ("ok" if x["fits"] else "oom")
        assert math.isfinite(data["objective"])


# ---------------------------------------------------------------------------- library parts


def test_max_batch_starts_at_the_runners_device_sized_batch(compose_cfg):
    from gpubench.search.maxbatch import start_batch

    cfg = compose_cfg("loader.batch_size=null", "bench.device=cpu")
    assert start_batch(cfg, None) == 16  # gpubench.config.schema.auto_sizes's CPU size, as settings.resolve fills it
    assert cfg.loader.batch_size is None  # the sweep's own config is left as given
    assert start_batch(compose_cfg("loader.batch_size=6"), None) == 6
    assert start_batch(cfg, 40) == 40


def test_max_batch_sizes_its_first_probe_without_the_jobs_device(compose_cfg, monkeypatch):
    """A sweeper on a login node without a GPU launches probes to GPU nodes: it sizes the first
    probe for the device the jobs ask for and leaves that device's rules to the jobs."""
    from gpubench.search.maxbatch import start_batch

    monkeypatch.setattr("gpubench.config.settings.cuda_available", lambda: False)
    cfg = compose_cfg("sweep=max_batch", "bench.device=cuda", "precision=amp_fp16",
                      "loader.batch_size=null", hydra=True)
    assert start_batch(cfg, None) == 128  # gpubench.config.schema.auto_sizes's CUDA size


@pytest.mark.parametrize("override,key", [("memory.reserve=1.5", "memory.reserve"),
                                          ("memory.ceiling=0", "memory.ceiling"),
                                          ("loader.batch_size=0", "loader.batch_size")])
def test_max_batch_checks_its_own_keys_before_any_probe(compose_cfg, override, key):
    from gpubench.search.maxbatch import run_max_batch
    from gpubench.search.space import SearchSpace

    class NoJobs:  # a probe launched here would be the bug
        def launch(self, *a, **k):
            raise AssertionError("probed before the config was checked")

    cfg = compose_cfg("sweep=max_batch", "loader.batch_size=null", override, hydra=True)
    with pytest.raises(ConfigError) as e:
        run_max_batch(NoJobs(), SearchSpace([], []), cfg, None, 64, [])
    line = str(e.value)
    assert e.value.key == key and "\n" not in line and line.startswith(f"{key}=")


@pytest.mark.parametrize("text,why", [
    ("cut {", "not valid JSON"), ("[]", "not a JSON object"), ('{"mode": "optuna"}',
                                                                  "no list of jobs"),
    ('{"mode": "optuna", "jobs": 5}', "jobs: not a list"), ('{"mode": 1, "jobs": []}',
                                                            "mode: not a str"),
    ('{"mode": "optuna", "jobs": [{"x": 1}]}', "a job without its dir and num"),
    ('{"mode": "pipes", "jobs": [], "studies": 3, "storage": "sqlite:///x.db"}',
     "studies: not a list"),
])
def test_a_sweep_json_of_another_shape_is_damaged_kept_and_read_around(tmp_path, caplog, text,
                                                                       why):
    """Valid JSON of another shape (edited by hand, another tool's) is damaged like a file cut
    short: the report warns in one line and reads the job folders; a resume keeps a copy and
    reads its jobs back from their folders."""
    from gpubench.search.manifest import Manifest, problem
    from gpubench.search.rows import load_dir

    _results(tmp_path, "0", status="ok", images_per_sec=5.0, peak_memory_fraction=0.1)
    (tmp_path / "sweep.json").write_text(text)
    assert problem(tmp_path) == why
    rows, study = load_dir(tmp_path)
    assert [r.label for r in rows] == ["0"] and study is None
    assert any(f"is damaged ({why})" in r.getMessage() for r in caplog.records)
    m = Manifest(tmp_path, "optuna")
    assert (tmp_path / "sweep.json.damaged").read_text() == text
    assert [(j["num"], j["status"]) for j in m.jobs] == [(0, "ok")]
    m.save()
    assert problem(tmp_path) is None


def test_job_folders_are_reserved_once_across_threads(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from gpubench.search.manifest import reserve_job_dir

    (tmp_path / "3").mkdir()  # an earlier invocation's job
    with ThreadPoolExecutor(8) as ex:
        nums = list(ex.map(lambda _: reserve_job_dir(tmp_path), range(40)))
    assert sorted(nums) == list(range(4, 44))


@pytest.mark.slow
def test_runs_left_running_by_a_dead_process_are_saved_as_killed(tmp_path):
    from gpubench.core.record import load
    from gpubench.search.jobs import mark_stale_runs

    dead = dead_pid()
    host = socket.gethostname()
    _results(tmp_path, "dead", status="running", pid=dead, host=host)
    _results(tmp_path, "alive", status="running", pid=os.getpid(), host=host)
    _results(tmp_path, "done", status="ok", images_per_sec=3.0, pid=dead, host=host)
    assert mark_stale_runs(tmp_path) == 1
    killed = load(tmp_path / "dead")
    # the same status and message as `tracking sync` gives a dead run (RunRecord.mark_dead)
    assert killed.status is Status.killed
    assert killed.error == (f"process {dead} on {host} ended without a final status "
                            "(killed: kill -9 or out of host memory)")
    assert load(tmp_path / "alive").status is Status.running
    assert load(tmp_path / "done").status is Status.ok


@pytest.mark.slow
def test_a_grid_multirun_whose_jobs_all_fail_exits_1_in_one_line(tmp_path):
    """The sweeper's rule for Hydra's own grid too (before: the report, then exit 0); one job
    that measures is enough (the OOM'd one beside it is an answer)."""
    tiny = [o for o in TINY if o != "loader.batch_size=4"]
    p = run_cli("-m", *tiny, "loader.batch_size=2,4", "fault.fail_message=boom",
                f"hydra.sweep.dir={tmp_path / 'grid'}", cwd=tmp_path)
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert p.returncode == 1 and len(errors) == 1, p.stderr[-3000:]
    assert "no job of this sweep measured (2 failed)" in errors[0] and "boom" in errors[0]
    assert "Traceback" not in p.stderr and (tmp_path / "grid" / "report").is_dir()
    p = run_cli("-m", *tiny, "loader.batch_size=2,8", "fault.oom_above_batch=4",
                f"hydra.sweep.dir={tmp_path / 'half'}", cwd=tmp_path)
    assert p.returncode == 0 and "error:" not in p.stderr, p.stderr[-3000:]
    # every job refused as bad input (each says why, and writes no record): exit 2, as one run
    p = run_cli("-m", *tiny, "loader.batch_size=2,4", "bench.optimizer_impl=foreach",
                f"hydra.sweep.dir={tmp_path / 'bad'}", cwd=tmp_path)
    last = p.stderr.splitlines()[-1]
    assert p.returncode == 2 and last.startswith(
        "gpubench: error: no job of this sweep measured (2 refused as bad input); last error: "
        "bench.optimizer_impl='foreach' is not allowed"), p.stderr[-3000:]


def test_a_folder_of_several_sweeps_pools_each_confirm_into_its_own_sweeps_trial(tmp_path):
    """A report of a folder holding two searches: each search's sweep.json numbers its trials
    from 0, and the root has none, so every confirm run's trial read as None and all of them
    were pooled into whichever full run was read last (another search's). Each now joins the
    trial its own sweep's manifest names."""
    from gpubench.search.rows import load_dir

    for name, full, again in (("a", 100.0, 110.0), ("b", 200.0, 210.0)):
        sweep = tmp_path / name
        sweep.mkdir()
        runs = [_results(sweep, str(i), status="ok", images_per_sec=ips, rung=rung,
                         peak_memory_fraction=0.1)
                for i, (ips, rung) in enumerate(((full, "full"), (again, "confirm")))]
        (sweep / "sweep.json").write_text(json.dumps({"mode": "optuna", "jobs": [
            {"num": i, "dir": str(d), "trial": 0, "rung": r, "status": "ok"}
            for i, (d, r) in enumerate(zip(runs, ("full", "confirm"), strict=True))]}))
    rows, _ = load_dir(tmp_path)
    pooled = {r.record.images_per_sec: [c.images_per_sec for c in r.confirms] for r in rows}
    assert pooled == {100.0: [110.0], 200.0: [210.0]}


def test_a_trial_known_only_to_its_study_shares_the_rankings_columns():
    """A trial whose folder holds no record (a refused or lost job) is a row of its study's
    params, where a group's choice is `precision`, while a measured row's config flattens to
    `precision.name`: the ranking grew a `precision` column of dashes beside the measured run
    and named the study row's choice only there. Both now read `precision.name`."""
    from gpubench.analysis.recommend import Row, varying
    from gpubench.core.record import RunRecord
    from gpubench.search.rows import record_keys

    measured = Row("1", RunRecord(status=Status.ok, images_per_sec=100.0, config={
        "precision": {"name": "fp32"}, "loader": {"batch_size": 16}}))
    refused = Row("0", RunRecord(status=Status.failed),
                  record_keys({"precision": "amp_fp16", "loader.batch_size": 16}))
    assert refused.flat == {"precision.name": "amp_fp16", "loader.batch_size": 16}
    assert varying([measured, refused]) == ["precision.name"]
    # a measured record holds every fault key at its default: no injection, as the trial's
    # missing ones are (they grew six columns of dashes); one injected is a column. How it was
    # measured (bench.steps) is not known for the trial: no column of dashes either
    for every, columns in ((None, ["precision.name"]),
                           (2, ["precision.name", "fault.stall_every"])):
        measured = Row("1", RunRecord(status=Status.ok, images_per_sec=100.0, config={
            "precision": {"name": "fp32"}, "loader": {"batch_size": 16},
            "fault": {"stall_every": every, "stall_s": 1.0, "rank": None},
            "bench": {"steps": 2, "repeats": 6}}))
        assert varying([measured, refused]) == columns


@pytest.mark.usefixtures("sigterm_kept")
def test_bench_device_auto_on_a_cpu_measures_pin_memory_twins_once(monkeypatch, tmp_path):
    """With bench.device=auto (the default) a search on a CPU measured pin_memory=true and
    =false as two trials: knobs.acts saw `auto`, where the jobs run on this host's CPU. The
    sweeper resolves it for a launcher that runs the jobs here (the basic one): one trial."""
    from gpubench.__main__ import main
    from gpubench.cli.errors import one_line_errors

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [
        "gpubench", "-m", "hydra/sweeper=gpubench", *[o for o in TINY if "device" not in o],
        f"hydra.sweep.dir={tmp_path / 's'}", "hydra.sweeper.n_trials=2",
        "hydra.sweeper.report=false", "hydra.sweeper.confirm.top=0",
        "loader.pin_memory=choice(true,false)"])
    with one_line_errors():
        main()
    ran = [json.loads(f.read_text()) for f in (tmp_path / "s").glob("*/results.json")]
    assert [r["config"]["bench"]["device"] for r in ran] == ["auto"]
    assert ran[0]["env"]["device"] == "cpu"
