"""Resolve a precision name into what the train step needs (in the spirit of timm's
`resolve_precision`): the autocast dtype, whether a GradScaler is used, the TF32 flags, and
which math convolutions and matmuls really run in (for MFU's peak).

`torch_default` (the default) leaves PyTorch's backend flags as the user's process has them,
so the run measures what a plain training job runs: on Ampere and newer, PyTorch's defaults
run convolutions in TF32 (torch.backends.cudnn.allow_tf32=True) and matmuls in full fp32
(torch.backends.cuda.matmul.allow_tf32=False), and cudnn.benchmark off. `fp32` turns TF32 off
for both (strict fp32, 2-3x slower convolutions there), `tf32` on for both.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

TORCH_DEFAULT = "torch_default"


@dataclass(frozen=True)
class PrecisionPlan:
    name: str
    autocast_dtype: torch.dtype | None
    grad_scaler: bool
    # True/False: set both TF32 flags so; None: leave PyTorch's flags alone (torch_default)
    tf32: bool | None
    # the rows of the peak-FLOPs table convolutions and matmuls run at (they can differ)
    conv_math: str
    matmul_math: str

    @property
    def math(self) -> str:
        """One math for the whole step where one figure is wanted: the convolutions' (they
        carry nearly all FLOPs of a CNN); see `flops_by_math` for the exact split."""
        return self.conv_math

    def flops_by_math(self, conv_flops: float, matmul_flops: float) -> dict[str, float]:
        """A step's FLOPs keyed by the math they run at, for env.mixed_peak_flops."""
        out: dict[str, float] = {}
        for m, fl in ((self.conv_math, conv_flops), (self.matmul_math, matmul_flops)):
            out[m] = out.get(m, 0.0) + fl
        return out

    def autocast(self, device: str):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=device, dtype=self.autocast_dtype)


# The flags as they were before gpubench first changed them (None until then): restored for
# torch_default, since one process may run several configs (Hydra's basic launcher runs a
# whole multirun in one process) and an earlier `fp32` run must not leak into a later one.
_USER_FLAGS: dict | None = None


def _read_flags() -> dict:
    return {
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def _write_flags(f: dict) -> None:
    # The legacy allow_tf32 setters exist from torch 1.7 to today (2.9+ maps them onto the
    # newer fp32_precision settings), so they serve every torch >= 2.4 this runs on. They are
    # plain process-wide flags: setting them without a GPU is harmless (and testable).
    torch.backends.cuda.matmul.allow_tf32 = f["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = f["cudnn_tf32"]
    torch.backends.cudnn.benchmark = f["cudnn_benchmark"]


def user_flags() -> dict:
    """The user's own flags: as first seen, or as they are if gpubench never changed them."""
    return dict(_USER_FLAGS) if _USER_FLAGS is not None else _read_flags()


def _fp32_math(tf32_on: bool, device: str) -> str:
    # TF32 exists on CUDA tensor cores only (Ampere+; older GPUs fall back to fp32, and the
    # peak table's tf32 column equals fp32 for them)
    return "tf32" if tf32_on and device == "cuda" else "fp32"


def resolve_precision(name: str, device: str) -> PrecisionPlan:
    if name == TORCH_DEFAULT:
        f = user_flags()
        return PrecisionPlan(name, None, False, None, _fp32_math(f["cudnn_tf32"], device),
                             _fp32_math(f["matmul_tf32"], device))
    if name == "fp32":
        return PrecisionPlan(name, None, False, False, "fp32", "fp32")
    if name == "tf32":
        m = _fp32_math(True, device)
        return PrecisionPlan(name, None, False, True, m, m)
    if name == "amp_fp16":
        return PrecisionPlan(name, torch.float16, device == "cuda", True, "fp16", "fp16")
    if name == "amp_bf16":
        # bf16 has fp32's exponent range: no loss scaling needed
        return PrecisionPlan(name, torch.bfloat16, False, True, "bf16", "bf16")
    raise ValueError(f"unknown precision {name!r}")


def _remember_user_flags() -> None:
    """Keep the process's own flags before gpubench first changes them, so a later
    torch_default run in this process (a sweep's next trial) gets the user's flags back."""
    global _USER_FLAGS
    if _USER_FLAGS is None:
        _USER_FLAGS = _read_flags()


def apply_backend_flags(plan: PrecisionPlan, cudnn_benchmark: bool | None = None) -> None:
    """Set the flags the plan asks for; torch_default puts back the user's own.

    fp32 means fp32: cuDNN allows TF32 convolutions by default, so it is switched off
    explicitly, otherwise 'fp32' on Ampere+ silently measures TF32.

    `cudnn_benchmark` (bench.cudnn_benchmark): time every cuDNN convolution algorithm at the
    first call of each input shape and keep the fastest. The search runs in the warm-up (whose
    steps are not measured); with shapes that keep changing it would run again and again. No
    effect without cuDNN. None leaves the flag as the plan sets it."""
    if plan.tf32 is None:
        if _USER_FLAGS is not None:
            _write_flags(_USER_FLAGS)
    else:
        _remember_user_flags()
        # benchmark mode picks the fastest conv algorithm for fixed shapes, as tuned training
        # jobs do (torch_default keeps PyTorch's own choice, off)
        _write_flags({"matmul_tf32": plan.tf32, "cudnn_tf32": plan.tf32, "cudnn_benchmark": True})
    if cudnn_benchmark is not None:
        _remember_user_flags()
        torch.backends.cudnn.benchmark = bool(cudnn_benchmark)


def make_grad_scaler(plan: PrecisionPlan, device: str):
    if not plan.grad_scaler:
        return None
    return torch.amp.GradScaler(device)
