"""How many loader workers: the fewest whose loader rate out-runs compute (reference article 003:
set workers to the minimum that unblocks the GPU; each extra worker costs host RAM for nothing).
Pure functions of measured figures."""

from __future__ import annotations

from dataclasses import dataclass

from gpubench.analysis.verdict import positive
from gpubench.core.stats import median

# a loader must clear compute by this fraction to count as unblocking it: runs of the same
# config differ by several percent, and e2e loses a little more to the hand-over
WORKERS_TOLERANCE = 0.05


@dataclass
class WorkersPick:
    num_workers: int | None  # None: nothing measured to choose from
    loader_images_per_sec: float | None
    unblocks: bool  # True: this loader out-runs compute (the GPU is no longer starved)
    reason: str


def _loader_rows(rows) -> dict[int, float]:
    """{num_workers: median loader images/sec} from (num_workers, ips) pairs or mappings with
    `num_workers` and `loader_images_per_sec` keys; repeats of a worker count are pooled by
    their median, unmeasured ones (None, NaN, <= 0) dropped."""
    per: dict[int, list[float]] = {}
    for r in rows:
        if isinstance(r, dict):
            w, ips = r.get("num_workers"), r.get("loader_images_per_sec")
        else:
            w, ips = r
        if w is not None and positive(ips):
            per.setdefault(int(w), []).append(float(ips))
    return {w: median(v) for w, v in per.items()}


def fewest_workers(rows, compute_images_per_sec: float | None,
                   tolerance: float = WORKERS_TOLERANCE) -> WorkersPick:
    """The fewest loader workers whose loader throughput exceeds compute by `tolerance`
    (reference article 003: set workers to the minimum that unblocks the GPU; each extra
    worker costs RAM for nothing). When no worker count gets there, the best available: the
    fewest workers within `tolerance` of the highest loader throughput (the plateau's start),
    with the reason the data side stays the bottleneck."""
    loader = _loader_rows(rows)
    if not loader:
        return WorkersPick(None, None, False, "no loader throughput measured")
    if positive(compute_images_per_sec):
        need = compute_images_per_sec * (1 + tolerance)
        for w in sorted(loader):
            if loader[w] >= need:
                fewer = [x for x in loader if x < w]
                below = (f"; with {max(fewer)}: {loader[max(fewer)]:.1f}" if fewer
                         else "; no fewer were measured")
                return WorkersPick(w, loader[w], True, (
                    f"{w} workers load {loader[w]:.1f} img/s, above compute "
                    f"{compute_images_per_sec:.1f} by more than {tolerance:.0%}{below}"
                ))
    best = max(loader.values())
    w = min(x for x in loader if loader[x] >= best * (1 - tolerance))
    plateau = f"{w} workers load {loader[w]:.1f} img/s, within {tolerance:.0%} of the best ({best:.1f})"
    if not positive(compute_images_per_sec):
        return WorkersPick(w, loader[w], False, f"compute throughput not measured; {plateau}")
    return WorkersPick(w, loader[w], False, (
        f"no worker count measured out-runs compute {compute_images_per_sec:.1f} img/s; "
        f"{plateau}, {loader[w] / compute_images_per_sec:.0%} of compute: the data side stays "
        "the bottleneck (next: dataset.preload=true, dataset.augment_on=device, more CPU cores "
        "per GPU)"
    ))
