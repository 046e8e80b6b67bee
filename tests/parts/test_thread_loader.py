"""loader.worker_type=thread: the same Dataset, sampler and collate as the DataLoader, read by
threads of this process (gpubench.parts.data.ThreadLoader), and the rules that make the keys of
worker processes inert with threads. Thread workers start no process: these tests are quick;
the ones that start DataLoader worker processes are `slow`."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose_config
from optuna.distributions import CategoricalDistribution
from torch.utils.data import DataLoader, SequentialSampler

from gpubench.config.errors import ConfigError
from gpubench.config.settings import as_run, resolve
from gpubench.parts import data
from gpubench.parts.data import ThreadLoader, build_pipeline, collate_skipping
from gpubench.run.runner import measure_run
from gpubench.search.pipes import cost
from gpubench.search.space import Param

sys.path.insert(0, str(ROOT / "scripts"))
from make_imagefolder import make_imagefolder  # noqa: E402


class Numbered(torch.utils.data.Dataset):
    """Sample i is (a 2x2 image of value i, label i); `seen` records the threads reading."""

    def __init__(self, n: int):
        self.n, self.seen = n, set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.seen.add(threading.get_ident())
        return torch.full((3, 2, 2), float(i)), i


def labels(batches) -> list[list[int]]:
    return [b[0][1].tolist() for b in batches]


def test_threads_give_the_dataloaders_batches_in_order():
    ds = Numbered(10)
    want = labels(DataLoader(ds, batch_size=3, sampler=SequentialSampler(ds),
                             collate_fn=collate_skipping, drop_last=True))
    ds.seen.clear()
    loader = ThreadLoader(ds, SequentialSampler(ds), 3, True, collate_skipping, workers=2,
                          prefetch=2)
    try:
        got = [labels(loader), labels(loader)]  # two epochs, each whole
    finally:
        loader.shutdown()
    assert want == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and got == [want, want]
    assert threading.get_ident() not in ds.seen  # read by the worker threads, not this one
    unordered = ThreadLoader(ds, SequentialSampler(ds), 3, False, collate_skipping, workers=3,
                             prefetch=1, in_order=False)
    try:
        assert sorted(labels(unordered)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    finally:
        unordered.shutdown()


def test_shutdown_stops_every_thread():
    before = set(threading.enumerate())
    loader = ThreadLoader(Numbered(400), SequentialSampler(range(400)), 2, True,
                          collate_skipping, workers=3, prefetch=2)
    it = iter(loader)
    next(it)  # the threads run, and fill the queues behind this batch
    started = set(threading.enumerate()) - before
    assert len(started) >= 3 and loader.worker_tids()
    loader.shutdown()
    assert not [t for t in started if t.is_alive()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    make_imagefolder(root, classes=3, per_class=6, size=24, quality=85, seed=1)
    return root


def thread_cfg(*overrides: str):
    return compose_config("loader.worker_type=thread", "loader.num_workers=2", *overrides)


def test_a_thread_run_measures_three_phases_and_records_its_kind(folder, tmp_path):
    cfg = thread_cfg("dataset=imagefolder", f"dataset.root={folder}",
                     "loader.persistent_workers=true", "loader.multiprocessing_context=spawn")
    r = measure_run(cfg, tmp_path)
    d = r.data
    assert r.status == "ok" and set(d["phases"]) == {"loader", "compute", "e2e"}, d.get("error")
    ld = d["config"]["loader"]
    assert (ld["worker_type"], ld["num_workers"], ld["in_order"]) == ("thread", 2, True)
    # the keys of worker processes do not act on threads: recorded as with 0 workers, and
    # the one set on purpose is named (persistent_workers=true is the default: no note)
    assert (ld["persistent_workers"], ld["multiprocessing_context"], ld["worker_threads"]) == \
        (False, None, 1)
    assert ld["prefetch_factor"] == 2  # threads hold batches ahead too
    assert r.notes[-1] == ("loader.multiprocessing_context=spawn acts only with loader worker "
                           "processes: recorded as null with loader.worker_type=thread")
    tel = d["phases"]["loader"]["telemetry"]
    # no worker process; the threads' CPU, read per thread, is the workers' as processes' is
    assert tel["workers_max"] == 0 and tel["workers_cpu_util_mean"] is not None
    assert d["loader_images_per_sec"] > 0


def test_worker_type_and_in_order_are_inert_without_workers(compose_cfg):
    s = resolve(compose_cfg("loader.worker_type=thread", "loader.in_order=false"))
    assert (s.loader.worker_type, s.loader.in_order) == ("process", True)
    assert "loader.worker_type=thread acts only with loader worker processes: recorded as " \
        "process with loader.num_workers=0" in s.notes
    # two 0-worker settings are one run; with threads the process-only keys drop out
    assert as_run({"loader.num_workers": 0, "loader.worker_type": "thread"}) == \
        {"loader.num_workers": 0}
    assert as_run({"loader.num_workers": 2, "loader.worker_type": "thread",
                   "loader.persistent_workers": True, "loader.prefetch_factor": 4}) == \
        {"loader.num_workers": 2, "loader.worker_type": "thread", "loader.prefetch_factor": 4}


@pytest.mark.parametrize("override, line", [
    ("loader.worker_type=fibers", "loader.worker_type=fibers is not allowed: it must be one of process, "
                                  "thread"),
    ("loader.in_order=maybe", "loader.in_order=maybe is not allowed: it must be true or false"),
])
def test_bad_values_are_one_line(compose_cfg, override, line):
    from gpubench.cli.messages import describe

    with pytest.raises(Exception) as e:
        compose_cfg(override)
    assert describe(e.value)[0] == line


def test_without_torchdata_thread_workers_are_one_line(compose_cfg, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.nodes", None)  # an import that fails
    with pytest.raises(ConfigError) as e:
        build_pipeline(resolve(thread_cfg()))
    assert str(e.value).startswith("loader.worker_type='thread' is not allowed: it must be process here")
    assert "pip install torchdata" in str(e.value) and "\n" not in str(e.value)


def test_out_of_order_process_workers_need_a_dataloader_that_takes_it(compose_cfg,
                                                                     monkeypatch):
    class Torch25Loader:  # torch 2.4/2.5's DataLoader signature: no in_order
        def __init__(self, dataset, batch_size=1, num_workers=0, prefetch_factor=None):
            pass

    s = resolve(compose_cfg("loader.num_workers=2", "loader.in_order=false"))
    assert data.loader_settings(s.loader, "cpu")["in_order"] is False
    monkeypatch.setattr(data, "DataLoader", Torch25Loader)
    with pytest.raises(ConfigError) as e:
        data.loader_settings(s.loader, "cpu")
    assert str(e.value).startswith("loader.in_order=false is not allowed: it must be true with process "
                                   "workers on torch")
    s = resolve(compose_cfg("loader.num_workers=2", "loader.in_order=false",
                            "loader.worker_type=thread"))
    assert "in_order" not in data.loader_settings(s.loader, "cpu")  # threads order themselves


def test_preload_with_threads_equals_lazy_loading(folder):
    from gpubench.parts.augment import cpu_fixed_size
    from gpubench.parts.datasets import ImageFiles, scan_imagefolder, source_size

    samples, _ = scan_imagefolder(folder)
    ds = ImageFiles(samples, cpu_fixed_size(source_size(16)), "skip")
    images, labels_, _, skipped = data.preload(ds, source_size(16), 2, threads=True)
    lazy, lazy_labels, _, _ = data.preload(ds, source_size(16), 0)
    assert skipped == 0 and torch.equal(images, lazy) and torch.equal(labels_, lazy_labels)


def test_a_corrupt_file_read_by_a_thread_fails_naming_it(tmp_path):
    make_imagefolder(tmp_path / "f", classes=1, per_class=3, size=24, seed=2)
    bad = next((tmp_path / "f").iterdir()) / "truncated.jpg"
    bad.write_bytes(b"\xff\xd8\xff not a jpeg")
    r = measure_run(thread_cfg("dataset=imagefolder", f"dataset.root={tmp_path / 'f'}",
                               "dataset.on_corrupt=fail", "bench.phases=[loader]",
                               "loader.batch_size=2"), tmp_path / "out")
    assert r.status == "failed" and "\n" not in r.data["error"]
    assert r.data["error"].startswith(f"dataset.on_corrupt=fail: cannot decode {bad}")


def test_threads_cost_less_than_processes_at_the_same_workers():
    """The cost order (config.knobs.CHEAP_FIRST): fewer workers first, then thread before
    process; in order before out of order."""
    space = [Param(k, k, CategoricalDistribution(v)) for k, v in (
        ("loader.num_workers", [1, 2]), ("loader.worker_type", ["process", "thread"]),
        ("loader.in_order", [False, True]))]
    settings = [{"loader.num_workers": w, "loader.worker_type": t, "loader.in_order": o}
                for w in (2, 1) for t in ("process", "thread") for o in (False, True)]
    ordered = sorted(settings, key=lambda p: cost(p, space))
    assert [(p["loader.num_workers"], p["loader.worker_type"], p["loader.in_order"])
            for p in ordered[:4]] == [(1, "thread", True), (1, "thread", False),
                                      (1, "process", True), (1, "process", False)]


@pytest.mark.slow  # DataLoader worker processes
def test_out_of_order_process_workers_run(folder, tmp_path):
    cfg = compose_config("dataset=imagefolder", f"dataset.root={folder}",
                         "loader.num_workers=2", "loader.in_order=false", "bench.phases=[loader]")
    r = measure_run(cfg, tmp_path)
    assert r.status == "ok" and r.data["config"]["loader"]["in_order"] is False


@pytest.mark.gpu
def test_thread_workers_pin_their_batches():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    loader = ThreadLoader(Numbered(8), SequentialSampler(range(8)), 4, True, collate_skipping,
                          workers=2, prefetch=2, pin=True)
    try:
        (x, y), _ = next(iter(loader))
    finally:
        loader.shutdown()
    assert x.is_pinned() and y.is_pinned()


def test_the_workers_answer_names_the_kind_and_the_count(tmp_path):
    """A loader-only sweep over both kinds: one answer per kind, then which kind: the fewest
    workers of either that clear compute, threads first at the same count."""
    from gpubench.analysis.recommend import Row
    from gpubench.core.record import RunRecord, Status
    from gpubench.report.loader_answer import loader_answer

    def run(workers, kind, ips, phases=("loader",), **figures):
        cfg = {"model": {"name": "resnet18"}, "precision": {"name": "fp32"},
               "dataset": {"name": "synthetic", "image_size": 32, "num_classes": 10},
               "loader": {"batch_size": 32, "num_workers": workers, "worker_type": kind},
               "bench": {"phases": list(phases), "optimizer": "sgd", "grad_accum_steps": 1},
               "channels_last": False, "compile": "off"}
        return RunRecord(status=Status.ok, config=cfg, env={"device": "cuda"},
                         measurement_stable=True, loader_images_per_sec=ips,
                         loader_images_per_sec_ci=ips and [ips * 0.98, ips * 1.02], **figures)

    loaders = [Row(f"{k}{w}", run(w, k, ips)) for k, w, ips in (
        ("process", 0, 300.0), ("process", 1, 500.0), ("process", 2, 900.0),
        ("thread", 1, 520.0), ("thread", 2, 910.0), ("thread", 4, 1500.0))]
    bound = run(0, "process", None, ("compute",), compute_images_per_sec=600.0,
                compute_images_per_sec_ci=[590.0, 610.0], dir=tmp_path / "c")
    answer = loader_answer(loaders, [bound], [], str(tmp_path))
    text = "\n".join(answer.lines)
    assert "batch 32, fp32 (cuda), 3 loader runs:" in text  # process: 0, 1 and 2 workers
    assert "batch 32, fp32, thread workers (cuda), 4 loader runs:" in text  # 0, 1, 2, 4
    assert answer.lines[-1] == ("  which kind: thread, 2 workers: the fewest workers of either "
                                "kind whose loader clears compute (at the same count, threads: "
                                "no process per worker)")
    assert {(g["worker_type"], g["num_workers"]) for g in answer.summary()} == \
        {("process", 2), ("thread", 2)}
    # the main process alone clears compute: no kind to pick
    loaders[0] = Row("process0", run(0, "process", 700.0))
    answer = loader_answer(loaders, [bound], [], str(tmp_path))
    assert answer.lines[-1] == ("  which kind: neither, 0 workers: the main process alone "
                                "loads faster than compute")


def test_the_monitor_counts_worker_threads_as_workers():
    """A loader thread's CPU is this process's: the sampler reads it per thread and moves it
    from the main process's share to the workers'."""
    from gpubench.telemetry.monitor import Monitor

    ready, done, leave, tids = threading.Event(), threading.Event(), threading.Event(), []

    def busy():
        tids.append(threading.get_native_id())
        ready.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.05:  # CPU time, whatever the host's load
            pass
        done.set()
        leave.wait()  # alive when sampled: an ended thread's time is not read

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        mon = Monitor("cpu", worker_pids=lambda: [], worker_tids=lambda: tids)  # no process
        mon.sample(fresh=True)  # the baselines
        ready.set()
        done.wait()
        s = mon.sample()
    finally:  # the thread ends whatever happened here
        ready.set()
        leave.set()
    worker.join()
    assert s.worker_threads == 1 and s.workers == 0 and s.workers_cpu > 0
    assert s.main_cpu + s.workers_cpu == pytest.approx(s.procs_cpu)
