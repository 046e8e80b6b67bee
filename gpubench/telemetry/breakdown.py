"""Where a profiled step's time goes, from the profiler's Chrome trace: seconds per step, averaged
over the `ProfilerStep#N` ranges. Host parts: each `gpubench/<part>` range; `unattributed_s`, what
none covers (the copy to the device, Python between them). Device parts (CUDA): `device_busy_s`,
the union of kernels, copies and memsets; `device_idle_s`, the rest (waiting on the host); kernel
time by the host range that launched it; H2D copy time and its share overlapping a kernel."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

HOST_PARTS = ("data", "forward", "backward", "optimizer", "host_metrics")
# the share of the step the parts alone must cover for the breakdown to be trusted (`covered`)
COVER_TOLERANCE = 0.10
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _union(intervals: Iterable[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(intervals: Iterable) -> float:
    return sum(b - a for a, b in intervals)


def _clip(iv, lo: float, hi: float) -> tuple[float, float] | None:
    a, b = max(iv[0], lo), min(iv[1], hi)
    return (a, b) if b > a else None


def _span(e: dict) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def breakdown(trace: dict, cuda: bool) -> dict | None:
    """Seconds per step by part; None without profiler steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    # host ranges only: the device's timeline repeats them as gpu_user_annotation events
    steps = sorted((_span(e) for e in events if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda s: s[0])
    if not steps:
        return None
    n, lo, hi = len(steps), steps[0][0], steps[-1][1]
    us = 1e-6 / n  # trace microseconds, summed over the steps -> seconds per step
    ranges: dict[str, list[tuple[float, float]]] = {p: [] for p in HOST_PARTS}
    for e in events:
        name = str(e.get("name", ""))
        part = name.removeprefix("gpubench/")
        if (e.get("cat") == "user_annotation" and part != name and part in ranges
                and (iv := _clip(_span(e), lo, hi))):
            ranges[part].append(iv)
    step = (hi - lo) * us
    out: dict = {"steps": n, "step_s": step} | {
        f"{p}_s": _length(ranges[p]) * us if ranges[p] else None for p in HOST_PARTS}
    # merged, so no time counts twice should a range ever sit inside another
    covered = _length(_union(iv for p in HOST_PARTS for iv in ranges[p])) * us
    coverage = covered / step if step > 0 else None
    out.update(unattributed_s=step - covered, coverage=coverage, tolerance=COVER_TOLERANCE,
               covered=coverage is not None and coverage >= 1.0 - COVER_TOLERANCE,
               time_kind="host+device" if cuda else "host")
    if cuda:
        out.update(_device(events, ranges, lo, n))
    return out


def _device(events: list[dict], ranges: dict, lo: float, n: int) -> dict:
    dev = [e for e in events if e.get("cat") in DEVICE_CATS]
    if not dev:
        return {"device_busy_s": None, "device_idle_s": None}
    # the device's window ends with the steps' last work (kernels run behind the host)
    hi = max(_span(e)[1] for e in dev)
    us = 1e-6 / n
    busy = _union(iv for e in dev if (iv := _clip(_span(e), lo, hi)))
    kernels = _union(_span(e) for e in dev if e.get("cat") == "kernel")
    h2d = [_span(e) for e in dev
           if e.get("cat") == "gpu_memcpy" and "htod" in str(e.get("name", "")).lower()]
    h2d_total = _length(h2d)
    out = {"device_window_s": (hi - lo) * us, "device_busy_s": _length(busy) * us,
           "device_idle_s": ((hi - lo) - _length(busy)) * us, "h2d_copy_s": h2d_total * us,
           "h2d_copies_per_step": len(h2d) / n,
           "h2d_overlap_fraction": (sum(_length(iv for k in kernels if (iv := _clip(k, a, b)))
                                        for a, b in h2d) / h2d_total if h2d_total > 0 else None)}
    # kernel time by the host range its launch (same correlation id) lies in, on any thread:
    # autograd launches backward kernels from its own while the main thread waits in backward()
    launches = [(_span(e)[0], e.get("args", {}).get("correlation")) for e in events
                if e.get("cat") in LAUNCH_CATS]
    by_corr: defaultdict = defaultdict(float)
    for e in dev:
        if (c := e.get("args", {}).get("correlation")) is not None:
            by_corr[c] += float(e.get("dur", 0.0))
    for part in ("forward", "backward", "optimizer"):
        ivs = ranges.get(part) or []
        ids = {c for t, c in launches if c is not None and any(a <= t <= b for a, b in ivs)}
        out[f"device_{part}_s"] = sum(by_corr.get(c, 0.0) for c in ids) * us if ivs else None
    return out


def lines(b: dict) -> list[str]:
    """The breakdown as a few printable lines (milliseconds per step)."""
    def ms(k: str) -> str:
        return "-" if b.get(k) is None else f"{b[k] * 1000:.2f}"

    host = ", ".join(f"{p} {ms(p + '_s')}" for p in HOST_PARTS if b.get(p + "_s") is not None)
    out = [f"profiled step {ms('step_s')} ms ({b['steps']} steps): host {host}, "
           f"unattributed {ms('unattributed_s')} ms"]
    if b.get("device_busy_s") is not None:
        ov = b.get("h2d_overlap_fraction")
        out.append(f"device busy {ms('device_busy_s')} ms, idle waiting on the host "
                   f"{ms('device_idle_s')} ms; H2D copies {ms('h2d_copy_s')} ms"
                   + (f", {ov:.0%} overlapped with compute" if ov is not None else ""))
    return out
