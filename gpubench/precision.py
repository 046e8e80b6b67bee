"""Resolve a precision name into what the train step needs (in the spirit of timm's
`resolve_precision`): the autocast dtype, whether a GradScaler is used, and TF32 flags."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrecisionPlan:
    name: str
    autocast_dtype: torch.dtype | None
    grad_scaler: bool
    tf32: bool
    # which row of the peak-FLOPs table the math runs at (MFU)
    math: str

    def autocast(self, device: str):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=device, dtype=self.autocast_dtype)


def resolve_precision(name: str, device: str) -> PrecisionPlan:
    if name == "fp32":
        return PrecisionPlan(name, None, False, False, "fp32")
    if name == "tf32":
        return PrecisionPlan(name, None, False, True, "tf32" if device == "cuda" else "fp32")
    if name == "amp_fp16":
        return PrecisionPlan(name, torch.float16, device == "cuda", True, "fp16")
    if name == "amp_bf16":
        # bf16 has fp32's exponent range: no loss scaling needed
        return PrecisionPlan(name, torch.bfloat16, False, True, "bf16")
    raise ValueError(f"unknown precision {name!r}")


def apply_backend_flags(plan: PrecisionPlan) -> None:
    """fp32 means fp32: cuDNN allows TF32 convolutions by default, so switch it off explicitly,
    otherwise 'fp32' on Ampere+ silently measures TF32."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = plan.tf32
        torch.backends.cudnn.allow_tf32 = plan.tf32
        # benchmark mode picks the fastest conv algorithm for fixed shapes, as training jobs do
        torch.backends.cudnn.benchmark = True


def make_grad_scaler(plan: PrecisionPlan, device: str):
    if not plan.grad_scaler:
        return None
    return torch.amp.GradScaler(device)
