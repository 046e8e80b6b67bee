"""One training step, the same for the compute and e2e phases, and its loss."""

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
    """The training loss became NaN or infinite: steps on NaN weights run at a speed no real
    training job has, so the run fails instead of reporting them."""


def make_optimizer(model: nn.Module, name: str, lr: float, impl: str = "auto"
                   ) -> torch.optim.Optimizer:
    kwargs = {"auto": {}, "for_loop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[impl]
    if name != "adamw":
        kwargs["momentum"] = 0.9
    try:
        return (torch.optim.AdamW if name == "adamw" else torch.optim.SGD)(
            model.parameters(), lr=lr, **kwargs)
    except (RuntimeError, ValueError) as e:  # e.g. an older torch without this fused kernel
        if impl == "auto":  # torch's own choice: not a setting to blame
            raise
        raise ConfigError("bench.optimizer_impl", impl,
                          f"auto or for_loop here ({name}: {str(e).splitlines()[0]})") from e


def images_in(batch) -> int:
    return int(next(t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)).shape[0])


class Loss:
    """Cross-entropy on the logits, or the team's `fn` (step=custom, `target`):
    fn(model(inputs), targets) (step.takes=output) or fn(model, batch) (step.takes=batch)."""

    def __init__(self, fn=None, takes: str = "output", target: str | None = None):
        self.fn = fn if fn is not None else nn.CrossEntropyLoss()
        self.takes, self.target = takes, target

    def __call__(self, model: nn.Module, batch) -> tuple[torch.Tensor, Any]:
        """(loss, the model's output: None where the team's function ran the model)."""
        out = None
        if self.takes == "batch":
            loss = self.fn(model, batch)
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            out = model(batch[0])
            loss = self.fn(out, batch[1])
        else:
            raise ConfigError("step.takes", self.takes, f"batch for batches that are not "
                              f"(inputs, targets) pairs (this one is a {type(batch).__name__})")
        # a scalar tensor, what backward() takes: shape and type only, no device sync
        if self.target is not None and not (isinstance(loss, torch.Tensor)
                                            and loss.numel() == 1 and loss.is_floating_point()):
            got = (f"a {loss.dtype} tensor of shape {tuple(loss.shape)}"
                   if isinstance(loss, torch.Tensor) else type(loss).__name__)
            raise ConfigError("step._target_", self.target, f"{targets.LOSS} (it returned {got})")
        return loss, out


def make_loss(step) -> Loss:  # the team's target checked before it is called
    if step.name != "custom":
        return Loss()
    fn = targets.loss_function(step._target_)
    return Loss(fn() if inspect.isclass(fn) else fn, step.takes, step._target_)


def _range(name: str, on: bool):
    # only while a profile is taken: a record_function costs a dispatcher call even unheard
    return torch.profiler.record_function(name) if on else contextlib.nullcontext()


class TrainStep:
    """forward, loss, backward and, every `grad_accum_steps` micro-batches, the optimizer step.
    The loss is read back only as `host_metrics_every` asks: `.item()` syncs the device."""

    def __init__(self, model: nn.Module, plan: PrecisionPlan, device: str,
                 optimizer: torch.optim.Optimizer, oom_above_batch: int | None = None,
                 grad_accum_steps: int = 1, host_metrics_every: int = 0,
                 loss: Loss | None = None, mark_step=None):
        self.model, self.plan, self.device, self.opt = model, plan, device, optimizer
        self.scaler = make_grad_scaler(plan, device)
        self.loss = loss or Loss()
        self.oom_above_batch = oom_above_batch
        self.accum, self.metrics_every = grad_accum_steps, host_metrics_every  # schema-ranged
        self.micro_batches = self.optimizer_steps = self.host_metrics_reads = 0
        self.host_metrics: dict[str, float] = {}  # the last loss/accuracy read on the host
        self.ranges = False  # named profiler ranges (gpubench/profile.py turns them on)
        self.last_loss: torch.Tensor | None = None  # on the device; check_loss reads it
        self.finite_at = 0  # the micro-batch whose loss check_loss last found finite
        self.mark_step = mark_step  # models.step_marker: a new iteration for CUDA-graph trees

    def __call__(self, *batch) -> None:  # one micro-batch, as one argument or as (x, y)
        batch = batch[0] if len(batch) == 1 else batch
        if self.oom_above_batch is not None and images_in(batch) > self.oom_above_batch:
            # fault injection: the recovery path tested without a real device
            raise OOM_ERRORS[0](f"injected: batch {images_in(batch)} > fault.oom_above_batch")
        if self.mark_step is not None and self.micro_batches % self.accum == 0:
            # a new optimizer step: the last one's graph outputs are dead; a host-side counter
            self.mark_step()
        self.micro_batches += 1
        boundary = self.micro_batches % self.accum == 0
        # DDP all-reduces at every backward: no_sync() skips it where the optimizer does not step
        no_sync = None if boundary else getattr(self.model, "no_sync", None)
        with no_sync() if no_sync is not None else contextlib.nullcontext():
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
                # GradScaler.step reads found_inf back: a per-step sync real fp16 training pays
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.optimizer_steps += 1

    def check_loss(self, where: str) -> None:
        """Raise NonFiniteLoss if the last micro-batch's loss (it speaks for the window: NaN
        weights stay NaN) is not finite. Only right after a device sync: the read waits for none."""
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
        """The loss and (a classifier's) accuracy as Python floats, as many training loops read
        every k steps: each .item() is a device sync, the cost shown."""
        with _range("gpubench/host_metrics", self.ranges), torch.no_grad():
            self.host_metrics = {"loss": float(loss.detach().float().item())}
            if self.loss.target is None:  # step=classification: logits against labels
                hits = (out.argmax(dim=1) == batch[1]).float().mean()
                self.host_metrics["accuracy"] = float(hits.item())
        self.host_metrics_reads += 1


def step_figures(record, step: TrainStep | None) -> dict | None:  # rates of e2e, else compute
    if step is None:
        return None
    phase = record.phases.get("e2e") or record.phases.get("compute")
    rate, batch = (phase.images_per_sec, phase.batch_size) if phase else (None, None)
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
    """FLOPs of one forward+backward without recomputation as {"conv", "matmul", "total"} (MFU's
    peak: they can run at different maths); None if FlopCounterMode cannot run this model."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = batch[0] if len(batch) == 1 else batch
    try:
        counter = FlopCounterMode(display=False)
        with counter, without_recompute(model):
            with plan.autocast(device):
                value = (loss or Loss())(model, batch)[0]
            value.backward()
        counts = counter.get_flop_counts().get("Global", {})
    except Exception:
        return None
    finally:
        model.zero_grad(set_to_none=True)
    # the convolution ops are cuDNN's math; the rest (mm, addmm, bmm, attention) cuBLAS's
    conv = float(sum(v for op, v in counts.items() if "conv" in str(op)))
    total = float(sum(counts.values()))
    return {"conv": conv, "matmul": total - conv, "total": total}
