"""Facts about the machine a run measured, and the dense peak FLOP/s of known GPUs (for MFU)."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from importlib.metadata import PackageNotFoundError, version

import torch

# Dense (no sparsity) peak TFLOP/s from NVIDIA's data sheets: fp32 on CUDA cores, tf32 / fp16 /
# bf16 on tensor cores (fp16 with fp32 accumulation). Data sheets quote the sparse figure for
# tensor cores: these are half of it. Rows are regular expressions over the name CUDA reports
# (torch.cuda.get_device_name), matched case-insensitively, most specific first; a form factor
# with other clocks/power (PCIe, NVL) has its own row, so "H200 NVL" never reads the SXM row.
# Unknown devices get no MFU rather than a made-up one.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"\bGB200\b", {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0}),
    (r"\bB200\b", {"fp32": 80.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0}),
    # GH200's GPU is an H100 SXM-class part (989 dense bf16), not an H200
    (r"\bGH200\b", {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    (r"\bH200 NVL\b", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5}),
    (r"\bH200\b", {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    (r"\bH100 PCIe\b", {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0}),
    (r"\bH100 NVL\b", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.0, "bf16": 835.0}),
    (r"\bH100\b", {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    (r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    (r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0}),
    (r"\bL40\b", {"fp32": 90.5, "tf32": 90.5, "fp16": 181.0, "bf16": 181.0}),
    (r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0}),
    (r"\bA10G\b", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    (r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    (r"\bRTX 4090\b", {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2}),
    (r"\bRTX 3090\b", {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0}),
    # Volta: no tf32 or bf16 units (tf32 math falls back to fp32). The PCIe card runs lower
    # clocks than SXM2 (14 / 112 vs 15.7 / 125); V100S PCIe is faster than both.
    (r"\bV100S\b", {"fp32": 16.4, "tf32": 16.4, "fp16": 130.0}),
    (r"\bV100-PCIE\b|\bV100 PCIe\b", {"fp32": 14.0, "tf32": 14.0, "fp16": 112.0}),
    (r"\bV100-SXM2\b|\bV100 SXM2\b", {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0}),
    (r"\bT4\b", {"fp32": 8.1, "tf32": 8.1, "fp16": 65.0}),
]


def peak_flops(device_name: str, math_kind: str) -> float | None:
    for pattern, table in PEAK_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            tf = table.get(math_kind)
            return tf * 1e12 if tf else None
    return None


def mixed_peak_flops(device_name: str, flops_by_math: dict[str, float]) -> float | None:
    """The peak for a step whose FLOPs run at different maths (say convolutions in tf32 and
    matmuls in fp32 under PyTorch's defaults): the rate at which the whole step would run if
    each part ran at its own peak, total / sum(part / its peak). None if any part's peak is
    unknown."""
    total, seconds = 0.0, 0.0
    for math_kind, fl in flops_by_math.items():
        if fl <= 0:
            continue
        pk = peak_flops(device_name, math_kind)
        if not pk:
            return None
        total += fl
        seconds += fl / pk
    return total / seconds if seconds > 0 else None


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
    return cpu_model() or platform.processor() or platform.machine() or "cpu"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU as its owner knows it ('AMD EPYC 7B13', 'Intel(R) Xeon(R) ...'): two machines
    of one architecture ('x86_64') are different devices in a comparison. Linux only; None
    elsewhere, where platform.processor() is the best there is."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model name", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return None


def device_memory_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def facts(device: str) -> dict:
    from gpubench.telemetry.monitor import Nvml

    d = {
        "device": device,
        "device_name": device_name(device),
        "device_memory_bytes": device_memory_bytes(device),
        "torch": torch.__version__,
        "torchvision": _pkg("torchvision"),
        # the CUDA and cuDNN a GPU run used; a CPU run used neither (a CUDA wheel reports its
        # build's versions even without a GPU, which would read as the device's)
        "cuda": torch.version.cuda if device == "cuda" else None,
        "cudnn": (torch.backends.cudnn.version()
                  if device == "cuda" and torch.backends.cudnn.is_available() else None),
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
