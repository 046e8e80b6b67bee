"""The reference: a train step and loader loop as a user writes them, timed by a clock and a
synchronize at window edges; only the model, optimizer and precision plan come from gpubench."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch.nn import functional as F

from gpubench.config.settings import Settings
from gpubench.parts.models import build_model, prepare_model, step_marker
from gpubench.parts.precision import resolve_precision
from gpubench.parts.step import make_optimizer


def sync(device: str) -> None:
    # CUDA kernels run asynchronously: the clock must not stop with work still queued
    if device == "cuda":
        torch.cuda.synchronize()


def timed(work: Callable[[], int], steps: int, device: str, warm: int = 0) -> tuple[int, float]:
    """(images, seconds) of `steps` calls of `work` after `warm` untimed ones."""
    for _ in range(warm):
        work()
    sync(device)  # the warm-up's work is done before the clock starts
    t0 = time.perf_counter()
    images = sum(work() for _ in range(steps))
    sync(device)  # every timed step's work is done before the clock stops
    return images, time.perf_counter() - t0


class PlainStep:
    """forward, cross-entropy, backward, optimizer step on one batch kept on the device."""

    def __init__(self, s: Settings, x: torch.Tensor, y: torch.Tensor):
        b, device = s.bench, s.device
        model = prepare_model(build_model(s), device, s.channels_last)
        if s.compile != "off":
            # not gpubench's maybe_compile: it resets dynamo, dropping the compared run's model
            model = torch.compile(model, mode=None if s.compile == "default" else s.compile)
        self.model, self.x, self.y, self.device = model, x, y, device
        # a user's loop under a CUDA-graph compile mode marks each iteration, as PyTorch asks
        self.mark_step = step_marker(s.compile)
        self.opt = make_optimizer(model, b.optimizer, b.lr, b.optimizer_impl)
        plan = resolve_precision(s.precision, device)
        self.dtype = plan.autocast_dtype
        self.scaler = torch.amp.GradScaler(device) if plan.grad_scaler else None
        self.accum, self.every, self.calls = b.grad_accum_steps, b.host_metrics_every, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.mark_step is not None:
            self.mark_step()
        with torch.autocast(self.device, self.dtype) if self.dtype is not None else nullcontext():
            logits = self.model(self.x)
            loss = F.cross_entropy(logits, self.y)
        if self.every and self.calls % self.every == 0:  # as bench.host_metrics_every asks
            self.host = (loss.item(), (logits.argmax(1) == self.y).float().mean().item())
        if self.accum > 1:
            loss = loss / self.accum
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if self.calls % self.accum == 0:
            if self.scaler is not None:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return int(self.y.shape[0])


def plain_copy(device: str, pin: bool, channels_last: bool) -> Callable[[object], int]:
    """Copies a loader item ((images, labels), skipped) to the device; returns its images."""
    def move(item) -> int:
        batch, _ = item
        if batch is None:  # nothing of this batch decoded (dataset.on_corrupt=skip)
            return 0
        x, y = batch
        x, y = x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return int(y.shape[0])

    return move
