"""Does the harness slow what it measures? gpubench's compute phase vs a plain training loop.

Both run the same model, batch, precision and number of steps in this one process, in pairs
whose order alternates (gpubench first, then plain first, ...) so drift in machine speed and
warm-up of the process hit both alike. The plain loop
is what an engineer would write by hand: fixed batch, warm-up, sync, N steps, sync.

    python scripts/bench_overhead.py                                  # CPU-sized default
    python scripts/bench_overhead.py model=resnet50 dataset.image_size=224 \
        loader.batch_size=128 precision=amp_bf16 bench.device=cuda --repeats 5

Prints each pair and the median ratio gpubench/plain (goal: >= 0.97).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from hydra import compose, initialize_config_dir

from gpubench.config.paths import CONFIG_DIR
from gpubench.config.settings import Settings, check_resources, resolve
from gpubench.parts.models import build_model, prepare_model
from gpubench.parts.precision import apply_backend_flags, make_grad_scaler, resolve_precision
from gpubench.run.runner import measure_run

DEFAULTS = [
    "model=resnet18",
    "dataset=device_synthetic",
    "dataset.image_size=32",
    "loader.batch_size=16",
    "bench.warmup_steps=3",
    "bench.steps=30",
    "bench.max_seconds=600",
    "bench.phases=[compute]",
    "bench.flops=false",
    "tracking=none",
]


def plain_loop(s: Settings) -> float:
    """A hand-written loop, sharing nothing with the harness but the model constructor."""
    device = s.device
    plan = resolve_precision(s.precision, device)
    apply_backend_flags(plan)
    model = prepare_model(build_model(s), device, s.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = make_grad_scaler(plan, device)
    crit = torch.nn.CrossEntropyLoss()
    bs, size = s.loader.batch_size, s.dataset.image_size
    x = torch.randn(bs, 3, size, size, device=device)
    if s.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, s.model.num_classes, (bs,), device=device)

    def step():
        with plan.autocast(device):
            loss = crit(model(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(s.bench.warmup_steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = s.bench.steps
    for _ in range(n):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return n * bs / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides on top of the defaults")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose("bench", overrides=[*DEFAULTS, *args.overrides])
    s = resolve(cfg)
    check_resources(s)
    print(f"device={s.device} torch={torch.__version__} threads={torch.get_num_threads()} "
          f"model={s.model.name} size={s.dataset.image_size} batch={s.loader.batch_size} "
          f"precision={s.precision} steps={s.bench.steps}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            # which one goes first alternates: a process warms up (allocator, caches) as it runs
            if i % 2 == 0:
                ours = measure_run(cfg, f"{tmp}/{i}").data["compute_images_per_sec"]
                plain = plain_loop(s)
            else:
                plain = plain_loop(s)
                ours = measure_run(cfg, f"{tmp}/{i}").data["compute_images_per_sec"]
            ratios.append(ours / plain)
            print(f"  pair {i + 1}: gpubench compute {ours:8.1f} img/s   plain loop {plain:8.1f}"
                  f" img/s   ratio {ours / plain:.3f}")
    print(f"median ratio gpubench/plain = {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {args.repeats} pairs)")


if __name__ == "__main__":
    main()
