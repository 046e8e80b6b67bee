"""`bench.profile=true`: a few e2e steps under torch.profiler after the measured windows (it slows
what it watches); its trace, top operators and breakdown land beside results.json."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from gpubench.core.record import TRACE_DIR

log = logging.getLogger("gpubench")


def profile_steps(fetch: Callable, work: Callable, device: str, out_dir: Path,
                  active: int = 3, top: int = 10, step=None) -> dict:
    """Profile `active` steps of fetch + work, `step`'s (the TrainStep) named ranges on."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from gpubench.telemetry.breakdown import breakdown, lines

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    wait, warmup = 1, 1  # the schedule's steps before the active ones
    total = wait + warmup + active
    if step is not None:
        step.ranges = True
    try:
        with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
                     record_shapes=False) as prof:
            for i in range(total):
                with record_function("gpubench/data"):
                    batch = fetch()
                with record_function("gpubench/step"):
                    work(batch)
                if cuda and i == total - 1:
                    # the last step's kernels must finish before prof.step() stops the profiler
                    # or CUPTI drops them; the wait shows in its host time only
                    torch.cuda.synchronize()
                prof.step()
    finally:
        if step is not None:
            step.ranges = False
    folder = Path(out_dir) / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "trace.json"
    prof.export_chrome_trace(str(raw))
    parts = breakdown(json.loads(raw.read_text()), cuda)
    trace = folder / "trace.json.gz"  # traces compress ~10x; Perfetto opens .json.gz directly
    with open(raw, "rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    hta = hta_breakdown(folder, raw) if cuda else None
    raw.unlink()
    for line in lines(parts) if parts else ():
        log.info(line)
    # torch >= 2.4 deprecates self_cuda_time_total (pyg-team/pytorch_geometric#9616)
    sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
    every = prof.key_averages()  # aggregates the whole trace: once
    averages = sorted((a for a in every if not a.key.startswith(("gpubench/", "ProfilerStep"))),
                      key=lambda a: getattr(a, sort_by), reverse=True)
    (folder / "top_ops.txt").write_text(every.table(sort_by=sort_by, row_limit=25))
    return {"trace": str(trace), "breakdown": parts, "hta": hta, "steps": active,
            "time_kind": "device" if cuda else "cpu",
            "top_ops": [{"name": a.key, "calls": int(a.count),
                         "self_ms_per_step": getattr(a, sort_by) / 1000.0 / active}
                        for a in averages[:top]]}


def hta_breakdown(folder: Path, raw: Path) -> dict | None:
    """Holistic Trace Analysis' temporal and idle-time breakdowns, where installed (".[hta]")."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    try:
        # HTA reads every trace in a folder, one per rank; this run's trace is rank 0's
        hta_dir = folder / "hta"
        hta_dir.mkdir(exist_ok=True)
        shutil.copyfile(raw, hta_dir / "rank0.json")
        analyzer = TraceAnalysis(trace_dir=str(hta_dir))
        temporal = analyzer.get_temporal_breakdown(visualize=False)
        idle = analyzer.get_idle_time_breakdown(visualize=False)
        idle = idle[0] if isinstance(idle, tuple) else idle
        shutil.rmtree(hta_dir, ignore_errors=True)
        return {"temporal": temporal.to_dict(orient="records"),
                "idle_time": idle.to_dict(orient="records")}
    except Exception as e:
        log.warning("Holistic Trace Analysis failed on the trace: %s", e)
        return {"error": f"{type(e).__name__}: {e}"}
