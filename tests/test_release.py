"""A sweep measures many runs in one process: each run must leave nothing behind. The runner
freezes the collector's view of what survives a run (gpubench.runner.Benchmark._release), so a
run caught in a reference cycle at that moment would never be freed: its model, optimizer and
data pool would pile up trial after trial."""

from __future__ import annotations

import gc
import weakref

import pytest

from gpubench import runner
from tests.conftest import compose_config


@pytest.mark.parametrize("faults,status", [
    ([], "ok"),
    (["fault.oom_above_batch=1", "fault.fail_after_windows=1"], "oom"),
    (["fault.fail_message=boom", "fault.fail_after_windows=2"], "failed"),
])
def test_a_finished_run_is_freed(tmp_path, monkeypatch, faults, status):
    built: list[weakref.ref] = []
    init = runner.Benchmark.__init__

    def watch(self, *a, **k):
        built.append(weakref.ref(self))
        init(self, *a, **k)

    monkeypatch.setattr(runner.Benchmark, "__init__", watch)
    cfg = compose_config(*faults)
    for i in range(2):
        result = runner.measure_run(cfg, tmp_path / str(i))
        assert result.status == status
        del result
    gc.collect()
    assert len(built) == 2
    assert [r() for r in built] == [None, None], "a finished run is still alive"
