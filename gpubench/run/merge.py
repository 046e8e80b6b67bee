"""A phase's windows' telemetry merged into one summary, and under torchrun the ranks' windows."""

from __future__ import annotations

import dataclasses

from gpubench.core.stats import WindowStats
from gpubench.parts.distributed import Dist
from gpubench.telemetry.monitor import MonitorSummary

# byte counters the sampler restarts at each window
_COUNTERS = ("read_bytes", "disk_read_bytes")


def across_ranks(stats: WindowStats, dist: Dist) -> WindowStats:
    """All ranks' images over the slowest rank's window (it sets the pace); step times and data
    wait stay rank 0's. The same collectives in the same order on every rank."""
    images, seconds = sum(dist.gather(stats.images)), max(dist.gather(stats.seconds))
    return dataclasses.replace(stats, images=images, seconds=seconds,
                               images_per_sec=images / seconds,
                               ranks_images_per_sec=dist.gather(stats.images_per_sec))


def energy_across_ranks(energy_j: float | None, dist: Dist, before: float | None) -> float | None:
    """Every rank's GPU energy in this window added to `before` (the earlier windows', 0.0 at the
    first); None once any rank lacked its own in any window (the later ones would undercount)."""
    energies = dist.gather(energy_j)
    if before is None or any(e is None for e in energies):
        return None
    return before + sum(energies)


def telemetry(summaries: list[MonitorSummary]) -> MonitorSummary:
    """A phase's telemetry over its windows: energy the sum of the windows' counter differences
    (within one counter update per window; None if one has none), byte counters kept cumulative."""
    samples, base = [], dict.fromkeys(_COUNTERS, 0)
    for s in summaries:
        last = dict(base)
        for x in s.samples:
            moved = {k: getattr(x, k) + base[k] for k in base if getattr(x, k) is not None}
            samples.append(dataclasses.replace(x, **moved))
            last.update(moved)
        base = last
    energy = [s.energy_j for s in summaries]
    known = bool(energy) and None not in energy
    sources = sorted({s.energy_source for s in summaries if s.energy_source})
    used = [s.device_used_source for s in summaries if s.device_used_source]
    return MonitorSummary(
        samples=samples, seconds=sum(s.seconds for s in summaries),
        energy_j=sum(energy) if known else None, energy_source="+".join(sources) if known else None,
        device_used_source=used[-1] if used else None,
        nvml_unsupported=sorted({k for s in summaries for k in s.nvml_unsupported}),
        nvml_dropped=sum(s.nvml_dropped for s in summaries))


def phase_record_fields(pooled: dict, summaries: list[MonitorSummary], device: str,
                        name: str) -> dict:
    """A phase's pooled windows (core.stats.pool) with their CPU and device data figures."""
    for w, t in zip(pooled["windows"], summaries, strict=True):
        d = t.as_dict()
        w |= {k: d[k] for k in ("host_cpu_util_mean", "process_cpu_util_mean", "samples")}
    blocked = pooled.pop("host_blocked_seconds_per_image", None)
    if device != "cuda":
        # on a CPU the host clock already gives data wait: "device idle" would repeat it
        pooled["device_idle_fraction"] = pooled["device_work_seconds_per_image"] = None
    elif name == "loader":
        # the data side's device work on the training stream, which e2e runs in series with the
        # step. nvJPEG decodes on torchvision's stream with the host blocked (measure.DeviceStart):
        # a host cost, in the loader's own rate, kept apart
        pooled["device_data_seconds_per_image"] = pooled["device_work_seconds_per_image"]
        if blocked is not None:
            pooled["host_decode_seconds_per_image"] = blocked
    return pooled


def series(windows: list[WindowStats], merged: MonitorSummary) -> dict:
    """A phase's step times (warm-up, measured, per window) and its telemetry samples."""
    out = {"warmup_step_times_s": windows[0].warmup_step_times_s,
           "step_times_s": [t for w in windows for t in w.step_times_s],
           "window_steps": [w.steps for w in windows]}
    if merged.samples:
        out["telemetry"] = [{k: v for k, v in vars(s).items() if v is not None}
                            for s in merged.samples]
    return out
