"""A precision name resolved (as timm's `resolve_precision`) into the autocast dtype, GradScaler,
TF32 flags and the maths convolutions and matmuls run in (MFU's peak). torch_default leaves the
user's TF32 flags; fp32 turns both off (cuDNN allows TF32 convolutions by default)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrecisionPlan:
    name: str
    autocast_dtype: torch.dtype | None
    grad_scaler: bool
    tf32: bool | None  # both TF32 flags set so; None: PyTorch's flags left alone (torch_default)
    # the rows of the peak-FLOPs table convolutions and matmuls run at (they can differ)
    conv_math: str
    matmul_math: str

    def flops_by_math(self, conv_flops: float, matmul_flops: float) -> dict[str, float]:
        if self.conv_math == self.matmul_math:
            return {self.conv_math: conv_flops + matmul_flops}
        return {self.conv_math: conv_flops, self.matmul_math: matmul_flops}

    def autocast(self, device: str):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=device, dtype=self.autocast_dtype)


# The flags before gpubench first changed them (None until then), restored for torch_default:
# one process may run several configs (Hydra's basic launcher), and an `fp32` run must not leak.
_USER_FLAGS: dict | None = None


def _fp32_precision(node) -> str | None:
    """torch >= 2.9's per-operation TF32 setting as PyTorch resolves it
    (Context::float32Precision); None on a torch without that API (2.4 to 2.8)."""
    try:
        return str(node().fp32_precision)
    except AttributeError:  # cuBLASModule: "Unknown attribute"; cudnn: no `conv`/`rnn` module
        return None


def _tf32_on(node, legacy) -> bool:
    precision = _fp32_precision(node)
    # torch >= 2.9: the new API is what the kernels consult, and the legacy getters raise once a
    # process has set it for some operations only ("you have used mix of the legacy and new APIs")
    return bool(legacy()) if precision is None else precision == "tf32"


def _read_flags() -> dict:
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    return {"matmul_tf32": _tf32_on(lambda: cuda.matmul, lambda: cuda.matmul.allow_tf32),
            "cudnn_tf32": _tf32_on(lambda: cudnn.conv, lambda: cudnn.allow_tf32),
            "cudnn_benchmark": bool(cudnn.benchmark)}


def _write_flags(f: dict) -> None:
    # the legacy setters set the new API too on 2.9+: both views agree (harmless without a GPU)
    torch.backends.cuda.matmul.allow_tf32 = f["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = f["cudnn_tf32"]
    if not f["cudnn_tf32"] and _fp32_precision(lambda: torch.backends.cudnn.conv) is not None:
        # setAllowTF32CuDNN(false) leaves conv and rnn at "none", which inherits a generic
        # torch.backends.fp32_precision="tf32" the process may have set: say ieee outright
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    torch.backends.cudnn.benchmark = f["cudnn_benchmark"]


def user_flags() -> dict:  # as first seen, or as they are if gpubench never changed them
    return dict(_USER_FLAGS or _read_flags())


# name: (autocast dtype, its math, TF32 flags: None leaves the user's own)
PRECISIONS = {
    "torch_default": (None, None, None),
    "fp32": (None, None, False),
    "tf32": (None, None, True),
    "amp_fp16": (torch.float16, "fp16", True),
    "amp_bf16": (torch.bfloat16, "bf16", True),  # fp32's exponent range: no loss scaling
}


def resolve_precision(name: str, device: str) -> PrecisionPlan:
    dtype, math, tf32 = PRECISIONS[name]
    f = user_flags() if tf32 is None else {"cudnn_tf32": tf32, "matmul_tf32": tf32}
    # TF32 exists on CUDA tensor cores only (older GPUs' tf32 peak equals fp32's in the table)
    conv, matmul = (math or ("tf32" if f[k] and device == "cuda" else "fp32")
                    for k in ("cudnn_tf32", "matmul_tf32"))
    return PrecisionPlan(name, dtype, dtype == torch.float16 and device == "cuda", tf32, conv,
                         matmul)


def backend_flags(plan: PrecisionPlan, cudnn_benchmark: bool | None, user: dict) -> dict:
    """TF32 as the plan says, cudnn.benchmark as bench's (searched in warm-up), else the user's."""
    tf32 = {} if plan.tf32 is None else {"matmul_tf32": plan.tf32, "cudnn_tf32": plan.tf32}
    bench = {} if cudnn_benchmark is None else {"cudnn_benchmark": bool(cudnn_benchmark)}
    return {**user, **tf32, **bench}


def apply_backend_flags(plan: PrecisionPlan, cudnn_benchmark: bool | None = None) -> None:
    """Set `backend_flags` (nothing written while they already are), the user's own kept from
    before the first change for a later torch_default run in this process."""
    global _USER_FLAGS
    want = backend_flags(plan, cudnn_benchmark, user_flags())
    if want != _read_flags():
        _USER_FLAGS = _USER_FLAGS or _read_flags()
        _write_flags(want)


def make_grad_scaler(plan: PrecisionPlan, device: str):
    return torch.amp.GradScaler(device) if plan.grad_scaler else None
