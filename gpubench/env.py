"""Facts about the machine a run measured, and the dense peak FLOP/s of known GPUs (for MFU)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib.metadata import PackageNotFoundError, version

import torch

# Dense (no sparsity) peak TFLOP/s from NVIDIA's data sheets: fp32 on CUDA cores, tf32 / fp16 /
# bf16 on tensor cores (fp16 with fp32 accumulation). Matched by substring of the device name,
# most specific first. Unknown devices get no MFU rather than a made-up one.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("GB200", {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0}),
    ("B200", {"fp32": 80.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0}),
    ("H200", {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.0, "bf16": 835.0}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0}),
    ("L40", {"fp32": 90.5, "tf32": 90.5, "fp16": 181.0, "bf16": 181.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0}),
    ("A10G", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2}),
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0}),
    ("T4", {"fp32": 8.1, "tf32": 8.1, "fp16": 65.0}),
]


def peak_flops(device_name: str, math_kind: str) -> float | None:
    for key, table in PEAK_TFLOPS:
        if key in device_name:
            tf = table.get(math_kind)
            return tf * 1e12 if tf else None
    return None


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def git_commit(cwd: str | None = None) -> str | None:
    """The commit of the user's working directory, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return platform.processor() or platform.machine() or "cpu"


def device_memory_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def facts(device: str) -> dict:
    from gpubench.monitor import Nvml

    d = {
        "device": device,
        "device_name": device_name(device),
        "device_memory_bytes": device_memory_bytes(device),
        "torch": torch.__version__,
        "torchvision": _pkg("torchvision"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": Nvml.get().driver if device == "cuda" else None,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "gpubench": _pkg("gpubench"),
        "git_commit": git_commit(),
    }
    if device == "cuda":
        cap = torch.cuda.get_device_capability()
        d["compute_capability"] = f"{cap[0]}.{cap[1]}"
    return d
