"""Data-loading benchmark on a folder of real-photo JPEGs (docs/benchmarks.md, "Data loading").

1. Overhead: gpubench's loader phase (`bench.phases=[loader]`, the sampler thread on) against
   iterating a plain torch.utils.data.DataLoader over torchvision's ImageFolder with the same
   settings (batch, workers, prefetch, persistent workers, transforms, warm-up and steps),
   alternated --repeats times; the median of the per-pair ratios. Goal: >= 0.97.
2. Decode: loader images/sec of lazy PIL decode vs dataset.preload=true (vs
   dataset.decode_on=device where CUDA is present) for each worker count, alternated, medians.

    python scripts/bench_loader.py --root /tmp/bench_jpegs --make
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_imagefolder import make_imagefolder  # noqa: E402

from gpubench.config.paths import CONFIG_DIR  # noqa: E402
from gpubench.parts.augment import cpu_train_transform  # noqa: E402
from gpubench.run.runner import measure_run  # noqa: E402


def wait_idle(a) -> None:
    """On a shared host, start each measurement when the other processes are quiet (host CPU
    under --idle-below % over half a second), waiting at most --idle-wait seconds."""
    if a.idle_below >= 100:
        return
    import psutil

    deadline = time.monotonic() + a.idle_wait
    while psutil.cpu_percent(interval=0.5) > a.idle_below and time.monotonic() < deadline:
        pass


def gpubench_loader(a, workers: int, *extra: str) -> tuple[float, dict]:
    """Loader images/sec of one gpubench run, as a user would launch it (loader phase only)."""
    wait_idle(a)
    overrides = [
        "dataset=imagefolder", f"dataset.root={a.root}", f"dataset.image_size={a.image_size}",
        f"loader.batch_size={a.batch_size}", f"loader.num_workers={workers}",
        f"bench.warmup_steps={a.warmup}", f"bench.steps={a.steps}", "bench.phases=[loader]",
        "bench.max_seconds=600", "bench.warmup_max_seconds=600", "tracking=none", *extra,
    ]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose("bench", overrides=overrides)
    with tempfile.TemporaryDirectory() as out:
        r = measure_run(cfg, out)
    if r.status != "ok":
        raise RuntimeError(f"gpubench run {overrides}: {r.status} {r.data['error']}")
    return r.data["loader_images_per_sec"], r.data


def plain_loader(a, workers: int, device: str) -> float:
    """The same loading with nothing but torchvision's ImageFolder and a DataLoader."""
    from torchvision.datasets import ImageFolder

    wait_idle(a)
    ds = ImageFolder(str(a.root), transform=cpu_train_transform(a.image_size))
    kw = dict(num_workers=workers, pin_memory=device == "cuda")
    if workers:
        kw.update(prefetch_factor=2, persistent_workers=True)
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, drop_last=True, **kw)

    def batches(dl):
        while True:
            yield from dl

    it = batches(loader)
    for _ in range(a.warmup):
        x, y = next(it)
        x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    if device == "cuda":
        torch.cuda.synchronize()
    images, t0 = 0, time.perf_counter()
    for _ in range(a.steps):
        x, y = next(it)
        x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        images += len(y)
    if device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    del it, loader  # stops the workers before the next measurement starts
    return images / secs


def overhead(a, device: str) -> dict:
    pairs = []
    for i in range(a.repeats):
        # alternate which goes first, so drift in the host's speed does not favour either
        if i % 2 == 0:
            g, _ = gpubench_loader(a, a.workers)
            p = plain_loader(a, a.workers, device)
        else:
            p = plain_loader(a, a.workers, device)
            g, _ = gpubench_loader(a, a.workers)
        pairs.append((g, p))
        print(f"  overhead pair {i + 1}: gpubench {g:.1f}  plain {p:.1f}  ratio {g / p:.3f}",
              flush=True)
    ratios = [g / p for g, p in pairs]
    return {
        "gpubench_images_per_sec": [g for g, _ in pairs],
        "plain_images_per_sec": [p for _, p in pairs],
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
    }


def decode_modes(a, device: str) -> dict:
    modes = {"lazy PIL": [], "preload": ["dataset.preload=true"]}
    if device == "cuda":
        modes["device decode"] = ["dataset.decode_on=device"]
    table: dict = {}
    for w in a.worker_counts:
        runs: dict = {m: [] for m in modes}
        preload_s = []
        for i in range(a.decode_repeats):
            order = list(modes) if i % 2 == 0 else list(reversed(modes))
            for m in order:
                ips, data = gpubench_loader(a, w, *modes[m])
                runs[m].append(ips)
                if "preload_seconds" in data["data_info"]:
                    preload_s.append(data["data_info"]["preload_seconds"])
        table[w] = {m: statistics.median(v) for m, v in runs.items()}
        table[w]["preload_seconds"] = statistics.median(preload_s)
        print(f"  workers {w}: " + ", ".join(f"{m} {v:.1f}" for m, v in table[w].items()),
              flush=True)
    return table


def markdown(res: dict) -> str:
    a, o = res["args"], res["overhead"]
    lines = [
        f"Machine: {res['machine']}. Folder: {res['folder']['images']} JPEGs from "
        f"scikit-image's photos, shorter side {a['size']} px, quality {a['quality']}, mean "
        f"{res['folder']['mean_bytes'] / 1024:.1f} KiB; train transforms to {a['image_size']} px; "
        f"batch {a['batch_size']}, {a['warmup']} warm-up + {a['steps']} measured steps.",
        "",
        f"**Overhead** ({a['workers']} workers, {a['repeats']} alternated pairs): median ratio "
        f"gpubench/plain = **{o['median_ratio']:.3f}**",
        "",
        "| pair | gpubench loader img/s | plain DataLoader img/s | ratio |",
        "|---|---|---|---|",
    ]
    for i, (g, p, r) in enumerate(zip(o["gpubench_images_per_sec"], o["plain_images_per_sec"],
                                      o["ratios"], strict=True), 1):
        lines.append(f"| {i} | {g:.1f} | {p:.1f} | {r:.3f} |")
    modes = [m for m in next(iter(res["decode"].values())) if m != "preload_seconds"]
    lines += ["", f"**Decode** (loader img/s, median of {a['decode_repeats']} alternated runs):", "",
              "| workers | " + " | ".join(modes) + " | preload one-off s |",
              "|---" * (len(modes) + 2) + "|"]
    for w, row in res["decode"].items():
        lines.append(f"| {w} | " + " | ".join(f"{row[m]:.1f}" for m in modes)
                     + f" | {row['preload_seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "gpubench_jpegs")
    p.add_argument("--make", action="store_true", help="(re)build the folder first")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--per-class", type=int, default=64)
    p.add_argument("--size", type=int, default=320, help="shorter side of the JPEGs on disk")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--image-size", type=int, default=224, help="train crop size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="workers for the overhead pairs")
    p.add_argument("--worker-counts", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--idle-below", type=float, default=25.0,
                   help="start a measurement only below this host CPU %% (100: never wait)")
    p.add_argument("--idle-wait", type=float, default=60.0, help="longest wait for that, s")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = p.parse_args(argv)

    if a.make or not a.root.is_dir():
        import shutil

        shutil.rmtree(a.root, ignore_errors=True)
        make_imagefolder(a.root, a.classes, a.per_class, a.size, a.quality, seed=0)
    files = [f for f in a.root.rglob("*.jpg")]
    folder = {"images": len(files), "mean_bytes": sum(f.stat().st_size for f in files) / len(files)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    machine = (f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
               f"{device}{' ' + torch.cuda.get_device_name() if device == 'cuda' else ''}, "
               f"torch {torch.__version__}, load average at start {os.getloadavg()[0]:.2f}")
    print(machine, flush=True)
    res = {"machine": machine, "folder": folder, "args": {k: str(v) if isinstance(v, Path) else v
                                                          for k, v in vars(a).items()}}
    print("overhead (gpubench loader phase vs plain DataLoader):", flush=True)
    res["overhead"] = overhead(a, device)
    print("decode modes:", flush=True)
    res["decode"] = decode_modes(a, device)
    res["load_average_end"] = os.getloadavg()[0]
    if a.out:
        a.out.write_text(json.dumps(res, indent=2))
    print("\n" + markdown(res))


if __name__ == "__main__":
    main()
