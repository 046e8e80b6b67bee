"""Facts about the machine a run measured, and the dense peak FLOP/s of known GPUs (for MFU)."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import socket
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

# Dense peak TFLOP/s: fp32 on CUDA cores, tf32/fp16/bf16 on tensor cores (fp16 with fp32
# accumulation; data sheets quote sparse: halved here), matched case-insensitively against
# torch.cuda.get_device_name, most specific first. `sms`, the whole GPU's multiprocessors, scales
# the peak to a MIG slice's or cut-down part's own. Sources: NVIDIA's H100, H200, GH200 data
# sheets (H100 NVL: TF32 835, BF16/FP16 1,671 sparse); HGX B200 / GB200 NVL72 specifications, per
# GPU (B200: FP32 75, TF32 2.2 P, BF16 4.5 P sparse; GB200: 80, 2.5 P, 5 P); A100, A10, L4, L40,
# L40S (BF16 362.05 / 733 sparse), V100, T4 data sheets; Ada and Ampere GeForce whitepapers. A10G
# (AWS's) repeats A10's figures, unverified, with 80 SMs (AWS lists 80 RT cores vs A10's 72).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"\bGB200\b", {"sms": 148, "fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0}),
    (r"\bB200\b", {"sms": 148, "fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0}),
    # GH200's GPU is an H100 SXM-class part (989 dense bf16), not an H200
    (r"\bGH200\b", {"sms": 132, "fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    (r"\bH200 NVL\b", {"sms": 132, "fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5}),
    (r"\bH200\b", {"sms": 132, "fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    (r"\bH100 PCIe\b", {"sms": 114, "fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0}),
    (r"\bH100 NVL\b", {"sms": 132, "fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5}),
    (r"\bH100\b", {"sms": 132, "fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    (r"\bA100\b", {"sms": 108, "fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    (r"\bL40S\b", {"sms": 142, "fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05}),
    (r"\bL40\b", {"sms": 142, "fp32": 90.5, "tf32": 90.5, "fp16": 181.05, "bf16": 181.05}),
    (r"\bL4\b", {"sms": 58, "fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0}),
    (r"\bA10G\b", {"sms": 80, "fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    (r"\bA10\b", {"sms": 72, "fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    (r"\bRTX 4090\b", {"sms": 128, "fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2}),
    (r"\bRTX 3090\b", {"sms": 82, "fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0}),
    # Volta: no tf32/bf16 units (tf32 falls back to fp32); PCIe clocks lower than SXM2, V100S
    (r"\bV100S\b", {"sms": 80, "fp32": 16.4, "tf32": 16.4, "fp16": 130.0}),
    (r"\bV100-PCIE\b|\bV100 PCIe\b", {"sms": 80, "fp32": 14.0, "tf32": 14.0, "fp16": 112.0}),
    (r"\bV100-SXM2\b|\bV100 SXM2\b", {"sms": 80, "fp32": 15.7, "tf32": 15.7, "fp16": 125.0}),
    (r"\bT4\b", {"sms": 40, "fp32": 8.1, "tf32": 8.1, "fp16": 65.0}),
]


def device_peaks(device_name: str, multiprocessors: int | None = None
                 ) -> tuple[dict[str, float] | None, str | None]:
    """Dense peaks in FLOP/s by math, or None and why. Fewer `multiprocessors` than the row's
    scale the peak (an A100 1g.5gb slice has 14 of 108 SMs at the same clocks); more: not this
    device. A MIG name without a count: no peak (the whole GPU's would understate its MFU)."""
    row = next((r for p, r in PEAK_TFLOPS if re.search(p, device_name, re.IGNORECASE)), None)
    if row is None:
        return None, f"no peak-FLOPs row for {device_name!r}"
    sms = int(row["sms"])
    # a MIG instance reports its parent's name and profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    if multiprocessors is None and re.search(r"\bMIG\b", device_name):
        return None, f"{device_name}: a MIG slice, and its multiprocessor count is unknown"
    if multiprocessors is not None and multiprocessors > sms:
        return None, (f"{device_name} reports {multiprocessors} multiprocessors, more than the "
                      f"{sms} of the row it matched")
    scale = 1.0 if multiprocessors is None else multiprocessors / sms
    return {k: v * 1e12 * scale for k, v in row.items() if k != "sms"}, None


def peak_flops(device_name: str, math_kind: str, multiprocessors: int | None = None
               ) -> float | None:
    peaks, _ = device_peaks(device_name, multiprocessors)
    return peaks.get(math_kind) if peaks else None


def mfu_peak(device_name: str, flops_by_math: dict[str, float],
             multiprocessors: int | None = None) -> tuple[float | None, str | None]:
    """The peak for FLOPs at several maths: total / sum(part / its peak), or None and why."""
    peaks, why = device_peaks(device_name, multiprocessors)
    if peaks is None:
        return None, why
    parts = {k: fl for k, fl in flops_by_math.items() if fl > 0}
    missing = next((k for k in parts if not peaks.get(k)), None)
    if missing or not parts:
        return None, f"no {missing} peak for {device_name}" if missing else "no FLOPs counted"
    return sum(parts.values()) / sum(fl / peaks[k] for k, fl in parts.items()), None


def _pkg(name: str) -> str | None:
    with contextlib.suppress(PackageNotFoundError):
        return version(name)
    return None


def git_commit(cwd: str | None = None) -> str | None:
    """The working directory's git commit, read from .git: no `git` process per run."""
    here = Path(cwd or os.getcwd()).absolute()
    git = next((f / ".git" for f in (here, *here.parents) if (f / ".git").exists()), None)
    if git is None:
        return None
    with contextlib.suppress(OSError):
        if git.is_file():  # a worktree or submodule: "gitdir: <path>"
            git = git.parent / git.read_text().strip().removeprefix("gitdir:").strip()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None  # a detached HEAD holds the commit
        ref = head.removeprefix("ref:").strip()
        common = git / (git / "commondir").read_text().strip() if (git / "commondir").is_file() \
            else git
        for base in (git, common):
            if (base / ref).is_file():
                return (base / ref).read_text().strip() or None
        refs = (line.partition(" ") for line in (common / "packed-refs").read_text().splitlines())
        return next((sha for sha, _, name in refs if name == ref), None)
    return None


def platform_text() -> str:
    """platform.platform()'s text without its `uname -p` process (Linux)."""
    libc, version = platform.libc_ver()
    head = "-".join(p for p in (platform.system(), platform.release(), platform.machine()) if p)
    return f"{head}-with-{libc}{version}" if libc else head


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return cpu_model() or platform.machine() or "cpu"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU model ('AMD EPYC 7B13'), Linux only: platform.processor() starts a process."""
    with contextlib.suppress(OSError), open(cpuinfo, encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model name", "cpu model") and value.strip():
                return " ".join(value.split())
    return None


def device_memory_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    import psutil
    return int(psutil.virtual_memory().total)


def facts(device: str) -> dict:
    from gpubench.telemetry.nvml import Nvml
    cuda = device == "cuda"
    d = {"device": device, "device_name": device_name(device),
         "device_memory_bytes": device_memory_bytes(device),
         "torch": torch.__version__, "torchvision": _pkg("torchvision"),
         # none on a CPU run: a CUDA wheel reports its build's versions even without a GPU
         "cuda": torch.version.cuda if cuda else None,
         "cudnn": (torch.backends.cudnn.version()
                   if cuda and torch.backends.cudnn.is_available() else None),
         "driver": Nvml.get().driver if cuda else None,
         "python": platform.python_version(), "cpu_count": os.cpu_count(),
         "host": socket.gethostname(), "platform": platform_text(),
         "gpubench": _pkg("gpubench"), "git_commit": git_commit()}
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        d["compute_capability"] = f"{props.major}.{props.minor}"
        # this device's own SMs (a MIG slice's, not its parent's): MFU's peak scales by them
        d["multiprocessors"] = int(props.multi_processor_count)
    return d
