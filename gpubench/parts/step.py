"""One training step, shared by the compute and e2e phases (and by nothing else, so the two
phases measure exactly the same work)."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from gpubench.config.errors import ConfigError
from gpubench.parts.models import without_recompute
from gpubench.parts.oom import OOM_ERRORS
from gpubench.parts.precision import PrecisionPlan, make_grad_scaler


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite: the model diverged (a learning rate too high,
    fp16 overflow, a bad custom model). Steps on NaN weights go on running, at a speed no real
    training job has, so the run fails instead of reporting them."""


def make_optimizer(model: nn.Module, name: str, lr: float, impl: str = "auto"
                   ) -> torch.optim.Optimizer:
    kwargs = {"auto": {}, "for_loop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[impl]
    try:
        if name == "adamw":
            return torch.optim.AdamW(model.parameters(), lr=lr, **kwargs)
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, **kwargs)
    except (RuntimeError, ValueError) as e:  # e.g. an older torch without this fused kernel
        raise ConfigError("bench.optimizer_impl", impl,
                          f"auto or for_loop here ({name}: {str(e).splitlines()[0]})") from e


def _no_sync(model: nn.Module):
    # DistributedDataParallel all-reduces gradients at every backward; on micro-batches that
    # do not step the optimizer that traffic is wasted, so DDP's no_sync() skips it there (the
    # gradients still accumulate locally). Other models have nothing to skip.
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if no_sync is not None else contextlib.nullcontext()


def _range(name: str, on: bool):
    # named ranges on the profiler's timeline, only while a profile is taken: a
    # record_function costs a dispatcher call even with no profiler listening, which the
    # measured windows must not pay
    if on:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


class TrainStep:
    """forward, loss, backward and, every `grad_accum_steps` calls, the optimizer step.

    Each call is one micro-batch: the phases count every micro-batch's images, and optimizer
    steps are micro-batches / grad_accum_steps. The loss is never read back unless
    `host_metrics_every` asks for it: `.item()` synchronizes the device and hides exactly the
    host/device overlap we measure, which is the cost that knob exists to show."""

    def __init__(
        self,
        model: nn.Module,
        plan: PrecisionPlan,
        device: str,
        optimizer: torch.optim.Optimizer,
        oom_above_batch: int | None = None,
        grad_accum_steps: int = 1,
        host_metrics_every: int = 0,
    ):
        self.model, self.plan, self.device, self.opt = model, plan, device, optimizer
        self.scaler = make_grad_scaler(plan, device)
        self.criterion = nn.CrossEntropyLoss()
        self.oom_above_batch = oom_above_batch
        self.accum = max(1, int(grad_accum_steps))
        self.metrics_every = max(0, int(host_metrics_every))
        self.micro_batches = 0
        self.optimizer_steps = 0
        self.host_metrics: dict[str, float] = {}  # the last loss/accuracy read on the host
        self.host_metrics_reads = 0
        self.ranges = False  # named profiler ranges (gpubench/profile.py turns them on)
        # the last micro-batch's loss, left on the device; read only by check_loss, after a sync
        self.last_loss: torch.Tensor | None = None
        self.finite_at = 0  # the micro-batch whose loss check_loss last found finite

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.oom_above_batch is not None and x.shape[0] > self.oom_above_batch:
            # fault injection, for testing the recovery path without a real device
            raise OOM_ERRORS[0](f"injected: batch {x.shape[0]} > fault.oom_above_batch")
        self.micro_batches += 1
        boundary = self.micro_batches % self.accum == 0
        sync = contextlib.nullcontext() if boundary else _no_sync(self.model)
        with sync:
            with _range("gpubench/forward", self.ranges), self.plan.autocast(self.device):
                logits = self.model(x)
                loss = self.criterion(logits, y)
            self.last_loss = loss  # a reference: no copy, no kernel, no sync
            if self.metrics_every and self.micro_batches % self.metrics_every == 0:
                self._read_metrics(loss, logits, y)
            if self.accum > 1:
                loss = loss / self.accum  # the accumulated gradient is the micro-batches' mean
            with _range("gpubench/backward", self.ranges):
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if not boundary:
            return
        with _range("gpubench/optimizer", self.ranges):
            if self.scaler is not None:
                # GradScaler.step reads found_inf back to the host: a per-step sync that real
                # fp16 training pays too, so it stays in the measurement
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.optimizer_steps += 1

    def check_loss(self, where: str) -> None:
        """Raise NonFiniteLoss if the last micro-batch's loss is NaN or infinite.

        Call it only right after a device sync (a window's closing edge): the loss is computed
        by then, so reading it waits for nothing. Never per step: an .item() there would
        synchronize every step and hide the very host/device overlap the phases measure. The
        last loss speaks for the window: NaN gradients make NaN weights, whose every later loss
        is NaN (a step that GradScaler skips for an fp16 overflow recovers, as in training)."""
        if self.last_loss is None:
            return
        value = float(self.last_loss.detach().float().item())
        if not math.isfinite(value):
            first, last = self.finite_at + 1, self.micro_batches
            when = f"at micro-batch {last}" if first == last else \
                f"between micro-batch {first} and {last}"
            raise NonFiniteLoss(f"the loss became {value} {when} ({where}): the model diverges "
                                "(a lower bench.lr, or check the model)")
        self.finite_at = self.micro_batches

    def _read_metrics(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """What many training loops do every k steps: the loss and the batch accuracy as Python
        floats. Each .item() waits for the device to finish everything queued so far."""
        with _range("gpubench/host_metrics", self.ranges), torch.no_grad():
            self.host_metrics = {
                "loss": float(loss.detach().float().item()),
                "accuracy": float((logits.argmax(dim=1) == y).float().mean().item()),
            }
        self.host_metrics_reads += 1


def step_figures(record, step: TrainStep | None) -> dict | None:
    """Beside images/sec (which counts every micro-batch): optimizer steps/sec of the headline
    phase (e2e, else compute) = micro-batches/sec / grad_accum_steps, and the step's counters."""
    if step is None:
        return None
    phase = record.phases.get("e2e") or record.phases.get("compute")
    rate = phase.images_per_sec if phase else None
    batch = phase.batch_size if phase else None
    # images_per_sec is summed over torchrun ranks; a micro-batch is one rank's batch
    micro = rate / batch / max(1, record.world_size) if rate and batch else None
    return {
        "grad_accum_steps": step.accum,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),  # as the run had it
        "micro_batches_per_sec": micro,
        "optimizer_steps_per_sec": micro / step.accum if micro else None,
        "micro_batches": step.micro_batches,
        "optimizer_steps": step.optimizer_steps,
        "host_metrics_every": step.metrics_every,
        "host_metrics_reads": step.host_metrics_reads,
        "host_metrics_last": step.host_metrics or None,
    }


def count_step_flops_split(model: nn.Module, plan: PrecisionPlan, device: str, x, y
                           ) -> dict[str, float] | None:
    """FLOPs of one forward+backward on this batch, counted once by torch's FlopCounterMode
    (2 per multiply-add), as {"conv", "matmul", "total"}: convolutions and matmuls can run at
    different maths (PyTorch's defaults: TF32 convolutions, fp32 matmuls), so MFU's peak needs
    the split. None if the counter cannot run this model.

    These are the model's FLOPs, the numerator of MFU: with model.checkpointing the stages are
    counted without their recomputation (which the device does run: hardware FLOPs would add
    about one forward of each checkpointed stage), so checkpointing shows as a lower MFU at the
    same model, as the time it costs."""
    from torch.utils.flop_counter import FlopCounterMode

    crit = nn.CrossEntropyLoss()
    try:
        counter = FlopCounterMode(display=False)
        with counter, without_recompute(model):
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
