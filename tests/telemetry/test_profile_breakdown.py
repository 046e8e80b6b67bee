"""profile.breakdown: a profiled tiny CPU run's parts add up to its step time; the device-side
arithmetic checked on hand-built traces of known shape (no GPU here)."""

from __future__ import annotations

import gzip
import json

import pytest

from gpubench.run.runner import measure_run
from gpubench.telemetry.breakdown import COVER_TOLERANCE, breakdown, lines


def test_profiled_cpu_run_breaks_the_step_down(compose_cfg, tmp_path):
    # a step of tens of ms (64 px, batch 32): the unnamed rest (a copy, Python between the
    # ranges, the profiler's bookkeeping) is about a fixed millisecond, which on the tiny
    # config's 10 ms step was 14% on a loaded machine, past the tolerance
    rec = measure_run(compose_cfg("bench.profile=true", "bench.profile_steps=4",
                                  "bench.host_metrics_every=1", "dataset.image_size=64",
                                  "loader.batch_size=32"), tmp_path).record
    b = rec.extra["profile"]["breakdown"]
    assert b["steps"] == 4 and b["time_kind"] == "host"
    for part in ("data", "forward", "backward", "optimizer", "host_metrics"):
        assert b[f"{part}_s"] > 0, part
    named = sum(b[f"{p}_s"] for p in ("data", "forward", "backward", "optimizer"))
    # the named parts lie within the step and hold most of it (the rest: the copy to the
    # device, Python between the ranges, the profiler's bookkeeping, and on a loaded machine
    # whatever preempts the process between two ranges: how much is the machine's, so
    # `covered` is checked against the coverage the breakdown states, not assumed)
    assert 0.75 * b["step_s"] <= named <= b["step_s"], b
    assert b["coverage"] == pytest.approx(1 - b["unattributed_s"] / b["step_s"])
    assert b["covered"] is (b["coverage"] >= 1 - COVER_TOLERANCE)
    # the trace itself holds the ranges the breakdown read
    trace = json.loads(gzip.open(rec.extra["profile"]["trace"]).read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"gpubench/forward", "gpubench/backward", "gpubench/optimizer"} <= names
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["profile"]["breakdown"]["steps"] == 4
    assert "hta" in saved["profile"]


def test_step_ranges_only_while_profiling(compose_cfg, tmp_path):
    """The measured windows never pay for the named ranges: they are off again afterwards."""
    from gpubench.run.runner import Benchmark

    bench = Benchmark(compose_cfg("bench.profile=true", "bench.profile_steps=1",
                                  "bench.phases=[e2e]"), tmp_path)
    bench.measure()
    assert bench.step.ranges is False
    assert bench.record.extra["profile"]["breakdown"]["steps"] == 1
    bench._release()


def _x(name, ts, dur, cat="user_annotation", **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def _gpu_trace():
    """Two steps of 100 us. Per step: data 10, forward 20 (launches k1), backward 40 (k2),
    optimizer 10 (k3); one H2D copy of 10 us per step, half of it under a kernel."""
    ev = []
    for i, t in enumerate((1000.0, 1100.0)):
        ev += [
            _x(f"ProfilerStep#{i + 2}", t, 100),
            # the device timeline's copy of the step range: not another step
            _x(f"ProfilerStep#{i + 2}", t + 16, 84, "gpu_user_annotation"),
            _x("gpubench/forward", t + 21, 20, "gpu_user_annotation"),
            _x("gpubench/data", t + 2, 10),
            _x("gpubench/step", t + 14, 80),
            _x("gpubench/forward", t + 20, 20),
            _x("gpubench/backward", t + 45, 40),
            _x("gpubench/optimizer", t + 88, 10),
            _x("cudaLaunchKernel", t + 21, 2, "cuda_runtime", correlation=10 * i + 1),
            _x("cudaLaunchKernel", t + 50, 2, "cuda_runtime", correlation=10 * i + 2),
            _x("cudaLaunchKernel", t + 90, 2, "cuda_runtime", correlation=10 * i + 3),
            _x("cudaMemcpyAsync", t + 15, 2, "cuda_runtime", correlation=10 * i + 4),
            # device: copy 16-26, k1 21-41 (copy half hidden), k2 55-85, k3 95-100
            _x("Memcpy HtoD (Pinned -> Device)", t + 16, 10, "gpu_memcpy", correlation=10 * i + 4),
            _x("k1", t + 21, 20, "kernel", correlation=10 * i + 1),
            _x("k2", t + 55, 30, "kernel", correlation=10 * i + 2),
            _x("k3", t + 95, 5, "kernel", correlation=10 * i + 3),
        ]
    return {"traceEvents": ev}


def test_device_parts_from_a_known_trace():
    b = breakdown(_gpu_trace(), cuda=True)
    us = 1e-6
    assert b["steps"] == 2 and b["step_s"] == pytest.approx(100 * us)
    assert b["data_s"] == pytest.approx(10 * us)
    assert b["backward_s"] == pytest.approx(40 * us)
    # busy: copy+k1 16-41 (25) + k2 30 + k3 5 = 60 per step; idle the other 40
    assert b["device_busy_s"] == pytest.approx(60 * us)
    assert b["device_idle_s"] == pytest.approx(40 * us)
    assert b["h2d_copy_s"] == pytest.approx(10 * us)
    assert b["h2d_overlap_fraction"] == pytest.approx(0.5)
    assert b["device_forward_s"] == pytest.approx(20 * us)
    assert b["device_backward_s"] == pytest.approx(30 * us)
    assert b["device_optimizer_s"] == pytest.approx(5 * us)
    text = "\n".join(lines(b))
    assert "50% overlapped" in text and "idle waiting on the host 0.04 ms" in text


def test_overlapping_kernels_count_once_and_late_kernels_extend_the_window():
    tr = {"traceEvents": [
        _x("ProfilerStep#1", 0, 100),
        _x("a", 10, 50, "kernel"), _x("b", 30, 50, "kernel"),  # two streams: 10-80 busy
        _x("c", 110, 10, "kernel"),  # ran after the host's step ended
    ]}
    b = breakdown(tr, cuda=True)
    assert b["device_busy_s"] == pytest.approx(80e-6)
    assert b["device_window_s"] == pytest.approx(120e-6)
    assert b["device_idle_s"] == pytest.approx(40e-6)
    assert b["h2d_overlap_fraction"] is None  # no copies at all


def test_uncovered_step_is_flagged():
    tr = {"traceEvents": [_x("ProfilerStep#1", 0, 100), _x("gpubench/data", 0, 30)]}
    b = breakdown(tr, cuda=False)
    assert b["coverage"] == pytest.approx(0.3) and b["covered"] is False
    assert b["unattributed_s"] == pytest.approx(70e-6)
    assert breakdown({"traceEvents": []}, cuda=False) is None
