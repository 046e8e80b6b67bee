"""Shared fixtures: compose real configs with Hydra's compose API, shrunk to a tiny CPU run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from gpubench.config import CONFIG_DIR

ROOT = Path(__file__).resolve().parent.parent

# A run that takes well under a second on a slow 2-core CPU: tiny CNN, 16 px, 2 measured steps.
TINY = [
    "model=tiny",
    "dataset.image_size=16",
    "dataset.num_classes=10",
    "dataset.num_samples=32",
    "loader.batch_size=4",
    "loader.num_workers=0",
    "bench.device=cpu",
    "bench.warmup_steps=1",
    "bench.steps=2",
    "bench.monitor_interval_s=0.05",
    "tracking=none",
]


def compose_config(*overrides: str, hydra: bool = False, tiny: bool = True):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        return compose(
            "bench", overrides=[*(TINY if tiny else []), *overrides], return_hydra_config=hydra
        )


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skipped (not failed) on machines without it, like CI."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def compose_cfg():
    return compose_config


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300):
    """`python -m gpubench ARGS` in a subprocess, from `cwd` (outputs land under it)."""
    e = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    e.update(PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "gpubench", *args],
        cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout,
    )
