"""Resolve a precision name into what the train step needs (as timm's `resolve_precision`):
the autocast dtype, whether a GradScaler is used, the TF32 flags, and which math convolutions and
matmuls really run in (for MFU's peak).

`torch_default` leaves PyTorch's TF32 flags as the user's process has them, so the run measures
what a plain training job runs (on Ampere+: TF32 convolutions, fp32 matmuls). `fp32` turns TF32
off for both (cuDNN allows TF32 convolutions by default: 'fp32' would silently measure TF32),
`tf32` on for both. cudnn.benchmark is not the precision's: bench.cudnn_benchmark sets it alike
for every precision, so a precision comparison changes the maths alone.
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

    def flops_by_math(self, conv_flops: float, matmul_flops: float) -> dict[str, float]:
        """A step's FLOPs keyed by the math they run at, for env.mixed_peak_flops."""
        if self.conv_math == self.matmul_math:
            return {self.conv_math: conv_flops + matmul_flops}
        return {self.conv_math: conv_flops, self.matmul_math: matmul_flops}

    def autocast(self, device: str):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=device, dtype=self.autocast_dtype)


# The flags as they were before gpubench first changed them (None until then): restored for
# torch_default, since one process may run several configs (Hydra's basic launcher runs a
# whole multirun in one process) and an earlier `fp32` run must not leak into a later one.
_USER_FLAGS: dict | None = None


def _fp32_precision(node) -> str | None:
    """torch >= 2.9's per-operation TF32 setting ("tf32", "ieee" or "none") as PyTorch resolves
    it (the operation's own, else its backend's, else the generic one: Context::float32Precision
    in aten/src/ATen/Context.cpp); None on a torch without that API (2.4 to 2.8)."""
    try:
        return str(node().fp32_precision)
    except AttributeError:  # cuBLASModule: "Unknown attribute"; cudnn: no `conv`/`rnn` module
        return None


def _tf32_on(node, legacy) -> bool:
    precision = _fp32_precision(node)
    if precision is None:
        return bool(legacy())
    # torch >= 2.9: read the new API, which is what the kernels consult (cuBLAS's math mode in
    # CublasHandlePool.cpp / CUDABlas.cpp: float32Precision(CUDA, MATMUL) == TF32; cuDNN
    # convolutions: allowTF32CuDNN(Float32Op::CONV)). The legacy getters raise a RuntimeError
    # once a process has set the new API for some operations only ("you have used mix of the
    # legacy and new APIs": Context::allowTF32CuBLAS / allowTF32CuDNN check the two agree).
    return precision == "tf32"


def _read_flags() -> dict:
    return {
        "matmul_tf32": _tf32_on(lambda: torch.backends.cuda.matmul,
                                lambda: torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": _tf32_on(lambda: torch.backends.cudnn.conv,
                               lambda: torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def _write_flags(f: dict) -> None:
    # The legacy allow_tf32 setters exist from torch 1.7 to today and on 2.9+ set the new API
    # too (Context::setAllowTF32CuBLAS: the matmul precision and the legacy flag together), so
    # both views agree afterwards and neither getter raises. They are plain process-wide flags:
    # setting them without a GPU is harmless (and testable).
    torch.backends.cuda.matmul.allow_tf32 = f["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = f["cudnn_tf32"]
    if not f["cudnn_tf32"] and _fp32_precision(lambda: torch.backends.cudnn.conv) is not None:
        # setAllowTF32CuDNN(false) leaves conv and rnn at "none", which inherits a generic
        # torch.backends.fp32_precision="tf32" the process may have set: say ieee outright
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    torch.backends.cudnn.benchmark = f["cudnn_benchmark"]


def user_flags() -> dict:
    """The user's own flags: as first seen, or as they are if gpubench never changed them."""
    return dict(_USER_FLAGS or _read_flags())


def _fp32_math(tf32_on: bool, device: str) -> str:
    # TF32 exists on CUDA tensor cores only (Ampere+; older GPUs fall back to fp32, and the
    # peak table's tf32 column equals fp32 for them)
    return "tf32" if tf32_on and device == "cuda" else "fp32"


# name: (autocast dtype, its math, TF32 flags: None leaves the user's own)
PRECISIONS = {
    TORCH_DEFAULT: (None, None, None),
    "fp32": (None, None, False),
    "tf32": (None, None, True),
    "amp_fp16": (torch.float16, "fp16", True),
    "amp_bf16": (torch.bfloat16, "bf16", True),  # fp32's exponent range: no loss scaling
}


def resolve_precision(name: str, device: str) -> PrecisionPlan:
    dtype, math, tf32 = PRECISIONS[name]
    f = user_flags() if tf32 is None else {"cudnn_tf32": tf32, "matmul_tf32": tf32}
    return PrecisionPlan(name, dtype, dtype == torch.float16 and device == "cuda", tf32,
                         math or _fp32_math(f["cudnn_tf32"], device),
                         math or _fp32_math(f["matmul_tf32"], device))


def backend_flags(plan: PrecisionPlan, cudnn_benchmark: bool | None, user: dict) -> dict:
    """The flags a run uses: TF32 as the precision says (torch_default: the user's own), and
    cudnn.benchmark from bench.cudnn_benchmark alone (null: the user's own), so runs that differ
    in precision differ in nothing else. cudnn.benchmark's algorithm search runs in the warm-up,
    whose steps are not measured."""
    tf32 = {} if plan.tf32 is None else {"matmul_tf32": plan.tf32, "cudnn_tf32": plan.tf32}
    bench = {} if cudnn_benchmark is None else {"cudnn_benchmark": bool(cudnn_benchmark)}
    return {**user, **tf32, **bench}


def apply_backend_flags(plan: PrecisionPlan, cudnn_benchmark: bool | None = None) -> None:
    """Set the flags `backend_flags` gives (nothing written while they already are). The user's
    own are kept before gpubench first changes them: a later torch_default run in this process
    (a sweep's next trial) gets them back."""
    global _USER_FLAGS
    want = backend_flags(plan, cudnn_benchmark, user_flags())
    if want != _read_flags():
        _USER_FLAGS = _USER_FLAGS or _read_flags()
        _write_flags(want)


def make_grad_scaler(plan: PrecisionPlan, device: str):
    return torch.amp.GradScaler(device) if plan.grad_scaler else None
