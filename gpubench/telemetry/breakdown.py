"""Where a profiled step's time goes, read from the profiler's Chrome trace (telemetry/profile.py).

The trace holds, per active step, a `ProfilerStep#N` range and gpubench's named ranges
(`gpubench/data`, `gpubench/step`, and inside the step `forward`, `backward`, `optimizer`,
`host_metrics`); on a GPU also the kernels, copies and memsets, each with the correlation id of
the CUDA runtime call that launched it. Figures are seconds per step, averaged over the steps:
- host parts: each range's mean (on a GPU, the host's launching and waiting time);
  `unattributed_s` is what none covers (the copy to the device, Python between ranges); the
  parts must cover the step within `TOLERANCE` for the breakdown to be trusted (`covered`).
- device parts (CUDA): `device_busy_s`, the union of kernel, copy and memset intervals;
  `device_idle_s`, the rest of the step (the device waited on the host); kernel time launched
  from inside each host range; H2D copy time and the share of it that overlapped a kernel.
Holistic Trace Analysis computes these and more (docs/profiling.md); the core install stays
free of it.
"""

from __future__ import annotations

from collections.abc import Iterable

HOST_PARTS = ("data", "forward", "backward", "optimizer", "host_metrics")
# parts + unattributed == step by definition; the parts alone must cover the step to this
# fraction for the breakdown to be trusted (`covered` in the result)
TOLERANCE = 0.10
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(a: tuple[float, float], merged: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a[1], y) - max(a[0], x)) for x, y in merged)


def _clip(iv: tuple[float, float], lo: float, hi: float) -> tuple[float, float] | None:
    a, b = max(iv[0], lo), min(iv[1], hi)
    return (a, b) if b > a else None


def _span(e: dict) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def breakdown(trace: dict, cuda: bool) -> dict | None:
    """Seconds per step by part (see the module's docstring); None without profiler steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    # the host's step ranges only: on a GPU the trace repeats them on the device's timeline as
    # gpu_user_annotation events, which must not count as more steps
    steps = sorted((_span(e) for e in events if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda s: s[0])
    if not steps:
        return None
    n = len(steps)
    lo, hi = steps[0][0], steps[-1][1]
    us = 1e-6 / n  # trace microseconds, summed over the steps -> seconds per step

    ranges: dict[str, list[tuple[float, float]]] = {p: [] for p in HOST_PARTS}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and name.startswith("gpubench/"):
            part = name.removeprefix("gpubench/")
            iv = _clip(_span(e), lo, hi)
            if part in ranges and iv:
                ranges[part].append(iv)
    out: dict = {"steps": n, "step_s": (hi - lo) * us}
    for part in HOST_PARTS:
        out[f"{part}_s"] = _length(ranges[part]) * us if ranges[part] else None
    # the part ranges do not nest in one another; merged anyway, so no time counts twice
    # should a future range sit inside another
    covered = _length(_union(iv for p in HOST_PARTS for iv in ranges[p])) * us
    out["unattributed_s"] = out["step_s"] - covered
    out["coverage"] = covered / out["step_s"] if out["step_s"] > 0 else None
    out["tolerance"] = TOLERANCE
    out["covered"] = out["coverage"] is not None and out["coverage"] >= 1.0 - TOLERANCE
    out["time_kind"] = "host"
    if cuda:
        out.update(_device(events, ranges, lo, n))
        out["time_kind"] = "host+device"
    return out


def _device(events: list[dict], ranges: dict, lo: float, n: int) -> dict:
    dev = [e for e in events if e.get("cat") in DEVICE_CATS]
    if not dev:
        return {"device_busy_s": None, "device_idle_s": None}
    # the device's step window: from the first step's start to the end of the last work the
    # steps launched (kernels run behind the host, the last ones after its last range ended)
    hi = max(_span(e)[1] for e in dev)
    us = 1e-6 / n
    busy = _union(iv for e in dev if (iv := _clip(_span(e), lo, hi)))
    kernels = _union(_span(e) for e in dev if e.get("cat") == "kernel")
    h2d = [_span(e) for e in dev
           if e.get("cat") == "gpu_memcpy" and "htod" in str(e.get("name", "")).lower()]
    h2d_total = _length(h2d)
    out = {
        "device_window_s": (hi - lo) * us,
        "device_busy_s": _length(busy) * us,
        "device_idle_s": ((hi - lo) - _length(busy)) * us,
        "h2d_copy_s": h2d_total * us,
        "h2d_copies_per_step": len(h2d) / n,
        "h2d_overlap_fraction": (sum(_overlap(c, kernels) for c in h2d) / h2d_total
                                 if h2d_total > 0 else None),
    }
    # device time launched from inside each host range: the launch (cuda_runtime) call lies
    # in the range on the host; its kernel carries the same correlation id. Autograd launches
    # backward kernels from its own thread while the main thread waits in backward(), so the
    # launch is matched by time, on any thread.
    launches = [(_span(e)[0], e.get("args", {}).get("correlation")) for e in events
                if e.get("cat") in LAUNCH_CATS]
    by_corr: dict = {}
    for e in dev:
        c = e.get("args", {}).get("correlation")
        if c is not None:
            by_corr[c] = by_corr.get(c, 0.0) + float(e.get("dur", 0.0))
    for part in ("forward", "backward", "optimizer"):
        ivs = ranges.get(part) or []
        ids = {c for t, c in launches if c is not None and any(a <= t <= b for a, b in ivs)}
        out[f"device_{part}_s"] = sum(by_corr.get(c, 0.0) for c in ids) * us if ivs else None
    return out


def lines(b: dict) -> list[str]:
    """The breakdown as a few printable lines (milliseconds per step)."""
    def ms(k: str) -> str:
        v = b.get(k)
        return "-" if v is None else f"{v * 1000:.2f}"

    host = ", ".join(f"{p} {ms(p + '_s')}" for p in HOST_PARTS if b.get(p + "_s") is not None)
    out = [f"profiled step {ms('step_s')} ms ({b['steps']} steps): host {host}, "
           f"unattributed {ms('unattributed_s')} ms"]
    if b.get("device_busy_s") is not None:
        ov = b.get("h2d_overlap_fraction")
        out.append(f"device busy {ms('device_busy_s')} ms, idle waiting on the host "
                   f"{ms('device_idle_s')} ms; H2D copies {ms('h2d_copy_s')} ms"
                   + (f", {ov:.0%} overlapped with compute" if ov is not None else ""))
    return out
