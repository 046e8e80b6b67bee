"""A sweep measures many runs in one process: each run must leave nothing behind. Between jobs
the entry point collects, then freezes what survives (gpubench.__main__._settle), so later
collections skip it; anything of a run still reachable, or still in a reference cycle, at that
moment would never be freed: its model, loader, data pool and device batch would pile up
trial after trial."""

from __future__ import annotations

import gc
import weakref

import pytest
from conftest import compose_config

from gpubench.__main__ import _settle
from gpubench.run import runner


@pytest.fixture
def watched(monkeypatch):
    """Weak references to each run's Benchmark, data pipeline and dataset, as they are built."""
    refs: list[weakref.ref] = []
    init, build = runner.Benchmark.__init__, runner.build_pipeline

    def watch_init(self, *a, **k):
        refs.append(weakref.ref(self))
        init(self, *a, **k)

    def watch_build(*a, **k):
        pipe = build(*a, **k)
        refs.append(weakref.ref(pipe))
        if pipe.loader is not None:
            refs.append(weakref.ref(pipe.loader.dataset))
        return pipe

    monkeypatch.setattr(runner.Benchmark, "__init__", watch_init)
    monkeypatch.setattr(runner, "build_pipeline", watch_build)
    yield refs
    gc.unfreeze()  # the rest of the test session collects as usual


@pytest.mark.parametrize("faults,status", [
    ([], "ok"),
    (["fault.oom_above_batch=1", "fault.fail_after_windows=1"], "oom"),
    (["fault.fail_message=boom", "fault.fail_after_windows=2"], "failed"),
])
def test_runs_in_one_process_leave_nothing_behind(tmp_path, watched, faults, status):
    cfg = compose_config(*faults)
    for i in range(2):  # as a sweep's jobs: run, settle, run, settle
        result = runner.run_benchmark(cfg, tmp_path / str(i), quiet=True)
        assert result.status == status
        del result
        _settle()
    gc.collect()
    assert len(watched) == 6  # per run: the Benchmark, its pipeline and its dataset
    alive = [type(r()).__name__ for r in watched if r() is not None]
    assert alive == [], f"still alive after the runs: {alive}"
