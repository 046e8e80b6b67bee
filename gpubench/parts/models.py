"""The model (a torchvision classifier, the `tiny` test CNN or the team's `model._target_`),
activation checkpointing, memory format and torch.compile."""

from __future__ import annotations

import contextlib
import gc
import inspect
import re
import sys

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from gpubench.config.errors import ConfigError
from gpubench.config.settings import CHECKPOINT_WIRED, Settings, check_classes, plain
from gpubench.core.stats import count
from gpubench.parts import targets
from gpubench.parts.oom import is_oom


class TinyNet(nn.Module):
    """A very small CNN (conv, norm, pooling, a classifier): a CPU test step takes ms."""

    def __init__(self, num_classes: int = 10, width: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def build_model(s: Settings) -> nn.Module:
    m, n = s.model, s.model.num_classes
    kwargs = plain(m.kwargs)  # a writable copy, lists as lists: the settings stay as resolved
    if m._target_:
        cls = targets.model_class(m._target_)  # checked before it is called: a config is code
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):  # no signature to read: pass it
            params = {"num_classes": None}
        if "num_classes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs.setdefault("num_classes", n)
        return cls(**kwargs)
    if m.name == "tiny":
        model = TinyNet(num_classes=n, **kwargs)
    else:
        import torchvision

        if str(m.name).startswith("vit_"):
            # a ViT constructor's argument, in whole patches (torchvision's assert names no key)
            size = kwargs.setdefault("image_size", s.dataset.image_size)
            found = re.fullmatch(r"vit_[a-z]+_(\d+)", m.name)
            patch = int(found[1]) if found else 1
            if size % patch:
                key = ("dataset.image_size" if size == s.dataset.image_size
                       else "model.kwargs.image_size")
                raise ConfigError(key, size, f"a multiple of {patch} with model.name={m.name} (its "
                                  f"patch size), e.g. {max(patch, size // patch * patch)}")
        model = torchvision.models.get_model(m.name, weights=None, num_classes=n, **kwargs)
    if m.checkpointing:
        apply_checkpointing(model, m.name)
    return model


def check_output(model: nn.Module, batch, s: Settings, loss=None) -> None:
    """One forward (step=custom: the team's loss) on up to two images of the first batch, before
    any phase; eval mode for one image (batch norm cannot train on one)."""
    m, ds = s.model, s.dataset
    key, value = ("model._target_", m._target_) if m._target_ else ("model.name", m.name)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(key, value, "a model with parameters to train (it has none)")
    # one sync, once, before any phase: the first batch's images (every float tensor of it)
    if not all(bool(torch.isfinite(t).all()) for t in tree_leaves(batch)
               if isinstance(t, torch.Tensor) and t.is_floating_point()):
        raise ConfigError(*(("dataset._target_", ds._target_) if ds._target_ else
                            ("dataset.name", ds.name)),
                          "a dataset whose images are finite numbers (the first batch holds NaN "
                          "or infinity)")
    if loss is not None and loss.target is not None:
        try:
            with torch.no_grad():
                loss(model, batch)
        except Exception as e:
            if isinstance(e, ConfigError) or is_oom(e, s.device):
                raise
            raise ConfigError("step._target_", loss.target, "a loss that runs on this run's "
                              f"model and batches ({targets.cause(e)})") from e
        return
    x = batch if isinstance(batch, torch.Tensor) else batch[0]
    took = (f"with dataset={ds.name} batches of {tuple(x.shape[1:])} "
            f"(dataset.image_size={ds.image_size})")
    probe = x[:2]
    was_training = model.training
    model.train(len(probe) > 1)
    try:
        with torch.no_grad():
            out = model(probe)
    except Exception as e:
        if is_oom(e, str(x.device.type)):  # two images that do not fit: the run's OOM, not input
            raise
        raise ConfigError(key, value, f"a model whose forward runs {took} "
                          f"({targets.cause(e)})") from e
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != len(probe):
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else \
            type(out).__name__ + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise ConfigError(key, value, f"a model whose forward returns one logits tensor (batch, "
                          f"classes) {took}; it returned {got} for {count(len(probe), 'image')}")
    check_classes(int(out.shape[-1]), ds.num_classes, *(("model._target_", m._target_)
                  if m._target_ else ("model.num_classes", m.num_classes)))


class Checkpointed(nn.Module):
    """A stage recomputed in backward (use_reentrant=False, as PyTorch recommends for compile
    and DDP; the RNG state is restored for dropout's mask)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.recompute = True  # off only while the model's FLOPs are counted (without_recompute)

    def forward(self, *args):
        if self.recompute and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self.inner, *args, use_reentrant=False)
        return self.inner(*args)


def apply_checkpointing(model: nn.Module, name: str) -> None:
    """Wrap the model's stages in `Checkpointed`, in place (stem and head: small activations)."""
    stages = []
    if hasattr(model, "layer4"):  # torchvision ResNet, Wide ResNet, ResNeXt
        stages = [(model, f"layer{i}") for i in range(1, 5)]
    elif hasattr(model, "encoder") and hasattr(model.encoder, "layers"):  # VisionTransformer
        stages = [(model.encoder.layers, n) for n, _ in model.encoder.layers.named_children()]
    elif isinstance(model, TinyNet):
        stages = [(model, "features")]
    if not stages:  # settings.resolve admits only the names wired here; this guards a mismatch
        raise ConfigError("model.checkpointing", True, f"false for {name} ({CHECKPOINT_WIRED})")
    for parent, attr in stages:
        setattr(parent, attr, Checkpointed(getattr(parent, attr)))


@contextlib.contextmanager
def without_recompute(model: nn.Module):
    """No recomputation while FLOPs are counted: MFU divides the model's, not the hardware's."""
    stages = [m for m in model.modules() if isinstance(m, Checkpointed)]
    for m in stages:
        m.recompute = False
    try:
        yield model
    finally:
        for m in stages:
            m.recompute = True


def prepare_model(model: nn.Module, device: str, channels_last: bool) -> nn.Module:
    fmt = torch.channels_last if channels_last else torch.preserve_format
    return model.to(device, memory_format=fmt).train()


def reset_compile_state(device: str) -> None:
    """Forget torch.compile's state as a new process would (Hydra's basic launcher runs a multirun
    in one): dynamo's caches (new batch sizes recompile, then run eager at the limit) and
    CUDA-graph pools empty_cache() cannot release (later trials would look bigger)."""
    if "torch._dynamo" not in sys.modules:
        return
    torch._dynamo.reset()
    if device == "cuda" and torch.cuda.is_initialized():
        # reset() leaves the trees before torch 2.6 or so (they came with 2.0)
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()  # idempotent: a no-op where reset() already did it
        gc.collect()  # the freed pools' blocks go back to the caching allocator, then the device
        torch.cuda.empty_cache()


# torch.compile's modes that record CUDA graphs: a training loop marks each iteration's start, or
# a backward can read an output a later replay overwrote ("accessing tensor output of CUDAGraphs
# that has been overwritten by a subsequent run": an H100 with torch 2.11, docs/gpu.md)
GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


def step_marker(mode: str):  # what a step calls before each forward of a model compiled so
    return torch.compiler.cudagraph_mark_step_begin if mode in GRAPH_MODES else None


def maybe_compile(model: nn.Module, mode: str) -> nn.Module:  # mode: Settings.compile, or "off"
    # a clean compile state, compiled or not: an eager run must not carry earlier graph pools
    reset_compile_state(str(next(model.parameters(), torch.empty(0)).device.type))
    if mode == "off":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)  # at warm-up's 1st step
