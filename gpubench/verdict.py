"""Which pipe is narrowest, and what to turn next. Pure functions of measured figures.

The rule compares three throughputs (reference article 003's method): the loader phase is the
most the data side can deliver, the compute phase the most the device can, and e2e what the
training loop gets. GPU utilization never decides the verdict: with AMP a GPU at the same
utilization does ~1.7x the work (article 003), so utilization is context, not evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# e2e "tracks" a bound when it reaches this fraction of it
TRACKS = 0.85
# the loader is "well below" compute when it delivers less than this fraction of it
WELL_BELOW = 0.9


@dataclass
class Verdict:
    bottleneck: str  # data | compute | overlap | unknown
    reason: str
    advice: list[str] = field(default_factory=list)


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x)) and x > 0


def classify(loader: float | None, compute: float | None, e2e: float | None,
             data_wait_fraction: float | None = None) -> tuple[str, str]:
    """Return (bottleneck, reason)."""
    if _ok(loader) and _ok(compute) and _ok(e2e):
        bound = min(loader, compute)
        if e2e < TRACKS * bound:
            return "overlap", (
                f"e2e {e2e:.1f} img/s is {e2e / bound:.0%} of the narrower bound {bound:.1f}: "
                "loading and compute run one after the other instead of overlapping"
            )
        if loader < WELL_BELOW * compute:
            return "data", (
                f"the loader delivers {loader:.1f} img/s, {loader / compute:.0%} of what compute "
                f"takes ({compute:.1f}); e2e {e2e:.1f} tracks the loader"
            )
        return "compute", (
            f"e2e {e2e:.1f} img/s tracks compute {compute:.1f} ({e2e / compute:.0%}); the loader "
            f"({loader:.1f}) keeps up"
        )
    if _ok(loader) and _ok(compute):
        side = "data" if loader < WELL_BELOW * compute else "compute"
        return side, f"loader {loader:.1f} vs compute {compute:.1f} img/s (e2e not measured)"
    if _ok(e2e) and data_wait_fraction is not None and not math.isnan(data_wait_fraction):
        if data_wait_fraction > 0.25:
            return "data", f"the loop waits on data {data_wait_fraction:.0%} of the time"
        return "compute", f"the loop waits on data only {data_wait_fraction:.0%} of the time"
    return "unknown", "not enough phases measured to compare (run loader, compute and e2e)"


@dataclass
class Knobs:
    """The current settings the advice refers to."""

    device: str
    num_workers: int
    cpu_count: int
    pin_memory: bool
    preload: bool
    augment_on: str
    precision: str
    channels_last: bool
    compile: str
    batch_size: int
    dataset: str
    memory_fraction: float | None
    ceiling: float
    is_conv: bool = True


def advise(bottleneck: str, k: Knobs) -> list[str]:
    """1-3 concrete next steps, most effective first (reference articles 000, 001, 003)."""
    out: list[str] = []
    gpu = k.device == "cuda"
    if bottleneck == "overlap" and not gpu and k.num_workers > 0:
        out.append(
            f"on a CPU the {k.num_workers} loader workers take cores from the model itself "
            f"({k.cpu_count} cores here): this gap is contention; on a GPU the two overlap"
        )
    if bottleneck in ("data", "overlap"):
        if k.num_workers == 0:
            out.append(
                "loader.num_workers=2 or more: with 0 workers the main process loads each batch "
                "while the device waits (article 003: >= 2 workers gave ~1.5x)"
            )
        elif k.num_workers < k.cpu_count and bottleneck == "data":
            out.append(
                f"loader.num_workers={min(k.cpu_count, max(2 * k.num_workers, k.num_workers + 1))}"
                f" (now {k.num_workers}, host has {k.cpu_count} cores); sweep it with "
                "`-m bench.phases=[loader] loader.num_workers=...` and keep the fewest that "
                "out-run compute"
            )
        if gpu and not k.pin_memory:
            out.append("loader.pin_memory=true: pinned host memory makes the copy asynchronous")
        if k.dataset in ("imagefolder", "fake_jpeg", "cifar10") and not k.preload:
            out.append(
                "dataset.preload=true: decode once into RAM, then only augment per step "
                "(article 000, Method 1)"
            )
        if gpu and k.augment_on == "cpu":
            out.append("dataset.augment_on=device: crop/flip/normalize on the GPU, not in workers")
        if bottleneck == "data" and k.num_workers >= k.cpu_count:
            out.append(
                "the host's cores are all loading: a host with more CPU per GPU "
                "(article 003: marry the right CPU/RAM to the GPU)"
            )
    if bottleneck == "compute":
        if k.precision in ("torch_default", "fp32", "tf32"):
            if gpu:
                out.append(
                    "precision=amp_bf16 (amp_fp16 before Ampere): mixed precision gave ~1.7x "
                    "in article 003"
                )
            else:
                out.append(
                    "precision=amp_bf16: CPU autocast runs matmuls/convs in bfloat16 (faster "
                    "only on CPUs with bf16 units, e.g. AVX512-BF16 or AMX: measure it)"
                )
        if gpu and k.is_conv and not k.channels_last and k.precision.startswith("amp"):
            out.append("channels_last=true: tensor-core convolutions prefer NHWC")
        if gpu and k.compile == "off":
            out.append("compile=default: torch.compile fuses the elementwise ops between convs")
        frac = k.memory_fraction
        if frac is not None and frac < 0.6 * k.ceiling:
            out.append(
                f"loader.batch_size={2 * k.batch_size}: memory peaks at {frac:.0%} of the "
                f"device (ceiling {k.ceiling:.0%}); a larger batch may raise throughput while "
                "compute-bound, keep the smallest that gets near the peak"
            )
        if not gpu:
            out.append("this ran on the CPU: on a GPU the compute bound is far higher")
    if bottleneck == "unknown":
        out.append("bench.phases=[loader,compute,e2e] to get a verdict")
    return out[:3]


def judge(
    loader: float | None,
    compute: float | None,
    e2e: float | None,
    data_wait_fraction: float | None,
    knobs: Knobs,
) -> Verdict:
    b, why = classify(loader, compute, e2e, data_wait_fraction)
    return Verdict(b, why, advise(b, knobs))


# ---------------------------------------------------------------- how many loader workers

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
        if w is not None and _ok(ips):
            per.setdefault(int(w), []).append(float(ips))
    out = {}
    for w, v in per.items():
        s = sorted(v)
        mid = len(s) // 2
        out[w] = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
    return out


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
    if _ok(compute_images_per_sec):
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
    if not _ok(compute_images_per_sec):
        return WorkersPick(w, loader[w], False, f"compute throughput not measured; {plateau}")
    return WorkersPick(w, loader[w], False, (
        f"no worker count measured out-runs compute {compute_images_per_sec:.1f} img/s; "
        f"{plateau}, {loader[w] / compute_images_per_sec:.0%} of compute: the data side stays "
        "the bottleneck (next: dataset.preload=true, dataset.augment_on=device, more CPU cores "
        "per GPU)"
    ))
