"""An optional PyTorch profiler trace of a few steps, taken after the measured windows.

Profiling slows what it watches, so it never overlaps a measurement: with `bench.profile=true`
the run measures its phases as usual, then runs a few more e2e steps under torch.profiler
(schedule wait 1, warm-up 1, active N, as reference article 002 sets it up) and writes a
Chrome/Perfetto trace and the top operators beside results.json. Data loading and the train
step are marked as `gpubench/data` and `gpubench/step` ranges on the timeline.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

TRACE_DIR = "traces"


def _self_time_us(avg, cuda: bool) -> float:
    # torch >= 2.4 names the device figure self_device_time_total (self_cuda_time_total before)
    if cuda:
        return float(getattr(avg, "self_device_time_total", getattr(avg, "self_cuda_time_total", 0)))
    return float(avg.self_cpu_time_total)


def profile_steps(fetch: Callable, work: Callable, device: str, out_dir: Path,
                  active: int = 3, top: int = 10) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    wait, warmup = 1, 1
    with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
                 record_shapes=False) as prof:
        for _ in range(wait + warmup + active):
            with record_function("gpubench/data"):
                batch = fetch()
            with record_function("gpubench/step"):
                work(batch)
            prof.step()
    if cuda:
        torch.cuda.synchronize()  # the last active step's kernels belong in the trace
    folder = Path(out_dir) / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "trace.json"
    prof.export_chrome_trace(str(raw))
    trace = folder / "trace.json.gz"  # traces compress ~10x; Perfetto opens .json.gz directly
    with open(raw, "rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()

    averages = [a for a in prof.key_averages() if not a.key.startswith(("gpubench/", "ProfilerStep"))]
    averages.sort(key=lambda a: _self_time_us(a, cuda), reverse=True)
    sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
    try:
        table = prof.key_averages().table(sort_by=sort_by, row_limit=25)
    except (AttributeError, KeyError):  # older torch spells the device column self_cuda_time_total
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
    (folder / "top_ops.txt").write_text(table)
    return {
        "trace": str(trace),
        "steps": active,
        "time_kind": "device" if cuda else "cpu",
        "top_ops": [
            {"name": a.key, "calls": int(a.count),
             "self_ms_per_step": _self_time_us(a, cuda) / 1000.0 / active}
            for a in averages[:top]
        ],
    }
