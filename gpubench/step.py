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


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, OOM_ERRORS):
        return True
    # the CPU allocator raises a plain RuntimeError
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


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


def count_step_flops(model: nn.Module, plan: PrecisionPlan, device: str, x, y) -> float | None:
    """FLOPs of one forward+backward on this batch, counted once by torch's FlopCounterMode
    (matmul/conv FLOPs, 2 per multiply-add). None if the counter cannot run this model."""
    from torch.utils.flop_counter import FlopCounterMode

    crit = nn.CrossEntropyLoss()
    try:
        counter = FlopCounterMode(display=False)
        with counter:
            with plan.autocast(device):
                loss = crit(model(x), y)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return float(counter.get_total_flops())
    except Exception:
        model.zero_grad(set_to_none=True)
        return None
