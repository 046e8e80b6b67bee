"""One training step, shared by the compute and e2e phases (and by nothing else, so the two
phases measure exactly the same work), and the loss it trains on: step=classification's
cross-entropy or the team's own function (step=custom, `Loss`)."""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from gpubench.config.errors import ConfigError
from gpubench.parts import targets
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
        if impl == "auto":  # torch's own choice: not a setting to blame
            raise
        raise ConfigError("bench.optimizer_impl", impl,
                          f"auto or for_loop here ({name}: {str(e).splitlines()[0]})") from e


def images_in(batch) -> int:
    """Samples in a batch: the first dimension of its first tensor (a pair's images, a
    dict's first entry)."""
    return int(next(t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)).shape[0])


class Loss:
    """How a batch becomes the loss: cross-entropy on the model's logits (step=classification),
    or the team's function `fn` (step=custom): fn(model(inputs), targets) for an (inputs,
    targets) batch (step.takes=output), fn(model, batch) for a model that computes its own loss
    (step.takes=batch, the batch a tuple or a dict). `target`: step._target_, named by the one
    line a loss that is no scalar tensor gets."""

    def __init__(self, fn=None, takes: str = "output", target: str | None = None):
        self.fn = fn if fn is not None else nn.CrossEntropyLoss()
        self.takes, self.target = takes, target

    def __call__(self, model: nn.Module, batch) -> tuple[torch.Tensor, Any]:
        """(loss, the model's output; None where the team's function ran the model)."""
        if self.takes == "batch":
            out, loss = None, self.fn(model, batch)
        else:
            x, y = self.pair(batch)
            out = model(x)
            loss = self.fn(out, y)
        if self.target is not None:
            self.check(loss)
        return loss, out

    def pair(self, batch) -> tuple[Any, Any]:
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            return batch[0], batch[1]
        raise ConfigError("step.takes", self.takes, f"batch for batches that are not (inputs, "
                          f"targets) pairs (this one is a {type(batch).__name__})")

    def check(self, loss: Any) -> None:
        """A scalar tensor, what backward() takes: shape and type only, no device sync."""
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1
                and loss.is_floating_point()):
            got = (f"a {loss.dtype} tensor of shape {tuple(loss.shape)}"
                   if isinstance(loss, torch.Tensor) else type(loss).__name__)
            raise ConfigError("step._target_", self.target,
                              f"{targets.LOSS} (it returned {got})")


def make_loss(step) -> Loss:
    """The run's loss from its step settings; the team's target resolved and checked before
    it is called (gpubench.parts.targets: a config is code)."""
    if step.name != "custom":
        return Loss()
    fn = targets.loss_function(step._target_)
    return Loss(fn() if inspect.isclass(fn) else fn, step.takes, step._target_)


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
        loss: Loss | None = None,
        mark_step=None,
    ):
        self.model, self.plan, self.device, self.opt = model, plan, device, optimizer
        self.scaler = make_grad_scaler(plan, device)
        self.loss = loss or Loss()
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
        self.mark_step = mark_step  # models.step_marker: a new iteration for CUDA-graph trees

    def __call__(self, *batch) -> None:
        """One micro-batch: the batch on the device, as one argument (a pair or the team's
        dict) or as (x, y)."""
        batch = batch[0] if len(batch) == 1 else batch
        if self.oom_above_batch is not None and images_in(batch) > self.oom_above_batch:
            # fault injection, for testing the recovery path without a real device
            raise OOM_ERRORS[0](f"injected: batch {images_in(batch)} > fault.oom_above_batch")
        if self.mark_step is not None and self.micro_batches % self.accum == 0:
            # a new optimizer step: the last one's graph outputs (its gradients were handed to
            # the optimizer and set to None) are dead; a host-side counter, no kernel, no sync
            self.mark_step()
        self.micro_batches += 1
        boundary = self.micro_batches % self.accum == 0
        sync = contextlib.nullcontext() if boundary else _no_sync(self.model)
        with sync:
            with _range("gpubench/forward", self.ranges), self.plan.autocast(self.device):
                loss, out = self.loss(self.model, batch)
            self.last_loss = loss  # a reference: no copy, no kernel, no sync
            if self.metrics_every and self.micro_batches % self.metrics_every == 0:
                self._read_metrics(loss, out, batch)
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
            if last <= self.accum:  # its forward ran on the initial weights: no divergence
                raise NonFiniteLoss(f"the loss was {value} {when} ({where}), before any weight "
                                    "update: the batches (check the dataset's images and "
                                    "labels) or the model's forward give non-finite values")
            raise NonFiniteLoss(f"the loss became {value} {when} ({where}): the model diverges "
                                "(a lower bench.lr, or check the model)")
        self.finite_at = self.micro_batches

    def _read_metrics(self, loss: torch.Tensor, out, batch) -> None:
        """What many training loops do every k steps: the loss and (a classifier's) batch
        accuracy as Python floats. Each .item() waits for the device to finish everything
        queued so far."""
        with _range("gpubench/host_metrics", self.ranges), torch.no_grad():
            self.host_metrics = {"loss": float(loss.detach().float().item())}
            if self.loss.target is None:  # step=classification: logits against labels
                y = batch[1]
                self.host_metrics["accuracy"] = float(
                    (out.argmax(dim=1) == y).float().mean().item())
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


def count_step_flops_split(model: nn.Module, plan: PrecisionPlan, device: str, *batch,
                           loss: Loss | None = None) -> dict[str, float] | None:
    """FLOPs of one forward+backward on this batch (one argument, or x, y) with the run's
    `loss` (cross-entropy when None), counted once by torch's FlopCounterMode
    (2 per multiply-add), as {"conv", "matmul", "total"}: convolutions and matmuls can run at
    different maths (PyTorch's defaults: TF32 convolutions, fp32 matmuls), so MFU's peak needs
    the split. None if the counter cannot run this model.

    These are the model's FLOPs, the numerator of MFU: with model.checkpointing the stages are
    counted without their recomputation (which the device does run: hardware FLOPs would add
    about one forward of each checkpointed stage), so checkpointing shows as a lower MFU at the
    same model, as the time it costs."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = batch[0] if len(batch) == 1 else batch
    loss_of = loss or Loss()
    try:
        counter = FlopCounterMode(display=False)
        with counter, without_recompute(model):
            with plan.autocast(device):
                value = loss_of(model, batch)[0]
            value.backward()
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


def count_step_flops(model: nn.Module, plan: PrecisionPlan, device: str, *batch,
                     loss: Loss | None = None) -> float | None:
    """Total FLOPs of one forward+backward (see count_step_flops_split)."""
    split = count_step_flops_split(model, plan, device, *batch, loss=loss)
    return split["total"] if split else None
