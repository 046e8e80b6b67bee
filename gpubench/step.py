"""One training step, shared by the compute and e2e phases (and by nothing else, so the two
phases measure exactly the same work)."""

from __future__ import annotations

import torch
from torch import nn

from gpubench.precision import PrecisionPlan, make_grad_scaler

OOM_ERRORS: tuple[type[BaseException], ...] = (
    getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
    torch.cuda.OutOfMemoryError,
)

# What ran out, read from the error's text (the whole chain: a DataLoader worker or the pin
# thread re-raises the original message inside its own). Checked in this order, first match wins.
# - "pinned": page-locked host memory for H2D copies (the CachingHostAllocator's cudaHostAlloc,
#   reported by C10_CUDA_CHECK as a plain "CUDA error: out of memory", so only where it happened
#   tells it apart): host RAM / the pin limit, never the device's memory.
# - "device": the caching allocator's OutOfMemoryError, and memory that libraries take with
#   their own cudaMalloc outside it (cuBLAS/cuDNN handles and workspaces, cuFFT, cuSOLVER,
#   cuSPARSE, nvJPEG, the CUDA runtime itself) which fail near the limit with status codes.
# - "host": the CPU allocator (c10's alloc_cpu: posix_memalign failing) and Python's MemoryError.
OOM_MESSAGES: tuple[tuple[str, str], ...] = (
    ("in pin memory thread", "pinned"),
    ("cudahostalloc", "pinned"),
    ("cachinghostallocator", "pinned"),
    ("pinned memory", "pinned"),
    ("cuda out of memory", "device"),
    ("cublas_status_alloc_failed", "device"),
    ("cudnn_status_alloc_failed", "device"),
    ("cufft_alloc_failed", "device"),
    ("cusolver_status_alloc_failed", "device"),
    ("cusparse_status_alloc_failed", "device"),
    ("nvjpeg_status_allocator_failure", "device"),
    ("cuda error: out of memory", "device"),
    ("cudaerrormemoryallocation", "device"),
    ("defaultcpuallocator: can't allocate memory", "host"),
    ("defaultcpuallocator: not enough memory", "host"),
    ("cannot allocate memory", "host"),
    ("out of memory", "device"),
)


def _chain_text(exc: BaseException) -> str:
    parts, seen, e = [], set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(parts).lower()


def oom_kind(exc: BaseException) -> str | None:
    """"device", "host" (CPU RAM), "pinned" (page-locked host memory), or None: not a memory
    error."""
    text = _chain_text(exc)
    for needle, kind in OOM_MESSAGES:
        if needle in text:
            return kind
    if isinstance(exc, OOM_ERRORS):  # the caching allocator's own type, whatever its text
        return "device"
    if isinstance(exc, MemoryError):
        return "host"
    return None


def is_oom(exc: BaseException, device: str = "cuda") -> bool:
    """Did the benchmarked device run out of memory (status "oom", a point a sweep treats as
    too big)? On a CPU run the host RAM is that device; a pinned-host failure never is: it is
    a host limit that a smaller batch would not cure the same way."""
    kind = oom_kind(exc)
    if kind == "device":
        return True
    return kind == "host" and device != "cuda"


def make_optimizer(model: nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


class TrainStep:
    """forward, loss, backward, optimizer step. Never reads the loss back: `.item()` would
    synchronize the device every step and hide exactly the host/device overlap we measure."""

    def __init__(
        self,
        model: nn.Module,
        plan: PrecisionPlan,
        device: str,
        optimizer: torch.optim.Optimizer,
        oom_above_batch: int | None = None,
    ):
        self.model, self.plan, self.device, self.opt = model, plan, device, optimizer
        self.scaler = make_grad_scaler(plan, device)
        self.criterion = nn.CrossEntropyLoss()
        self.oom_above_batch = oom_above_batch

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.oom_above_batch is not None and x.shape[0] > self.oom_above_batch:
            # fault injection, for testing the recovery path without a real device
            raise OOM_ERRORS[0](f"injected: batch {x.shape[0]} > fault.oom_above_batch")
        with self.plan.autocast(self.device):
            loss = self.criterion(self.model(x), y)
        if self.scaler is not None:
            # GradScaler.step reads found_inf back to the host: a per-step sync that real fp16
            # training pays too, so it stays in the measurement
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def count_step_flops_split(model: nn.Module, plan: PrecisionPlan, device: str, x, y
                           ) -> dict[str, float] | None:
    """FLOPs of one forward+backward on this batch, counted once by torch's FlopCounterMode
    (2 per multiply-add), as {"conv", "matmul", "total"}: convolutions and matmuls can run at
    different maths (PyTorch's defaults: TF32 convolutions, fp32 matmuls), so MFU's peak needs
    the split. None if the counter cannot run this model."""
    from torch.utils.flop_counter import FlopCounterMode

    crit = nn.CrossEntropyLoss()
    try:
        counter = FlopCounterMode(display=False)
        with counter:
            with plan.autocast(device):
                loss = crit(model(x), y)
            loss.backward()
        counts = counter.get_flop_counts().get("Global", {})
    except Exception:
        return None
    finally:
        model.zero_grad(set_to_none=True)
    # convolution, _convolution, cudnn_convolution, convolution_backward: cuDNN's math; the
    # rest the counter knows (mm, addmm, bmm, baddbmm, attention) are cuBLAS-side matmuls
    conv = float(sum(v for op, v in counts.items() if "conv" in str(op)))
    total = float(sum(counts.values()))
    return {"conv": conv, "matmul": total - conv, "total": total}


def count_step_flops(model: nn.Module, plan: PrecisionPlan, device: str, x, y) -> float | None:
    """Total FLOPs of one forward+backward (see count_step_flops_split)."""
    split = count_step_flops_split(model, plan, device, x, y)
    return split["total"] if split else None
