"""The team's own Dataset (`dataset=custom`), transform and collate. Every sample is held to
docs/data.md's contract (type tests, no copy), sample 0 at build: a broken one is a line first."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from gpubench.config.errors import ConfigError
from gpubench.config.settings import Settings, check_sampled, node_set, plain
from gpubench.parts import targets
from gpubench.parts.datasets import WorkerError

CONTRACT = ("__getitem__ returning (image, label): image a uint8 CHW/HWC tensor or array with 3 "
            "channels, a float CHW tensor in [0, 1] or a PIL image; label an int in "
            "[0, dataset.num_classes) (see docs/data.md)")
CONTRACT_PREFIX = "dataset=custom sample contract: "


class SampleContractError(WorkerError, ValueError):
    PREFIXES = (CONTRACT_PREFIX,)


def _describe(x: Any) -> str:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return f"{type(x).__name__} {tuple(x.shape)} {x.dtype}"
    return type(x).__name__


def _broken(where: str, what: str) -> SampleContractError:
    return SampleContractError(f"{CONTRACT_PREFIX}{where}: {what}")


def as_chw(image: Any, where: str) -> Any:
    """The image as the transforms take it: a CHW tensor (uint8 or float), or the PIL image."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = torch.from_numpy(np.ascontiguousarray(image))
    if isinstance(image, Image.Image):
        return image.convert("RGB") if image.mode != "RGB" else image
    if not isinstance(image, torch.Tensor):
        raise _broken(where, f"image is {_describe(image)}; expected a tensor, a numpy array "
                      "or a PIL image")
    if image.ndim == 3 and image.shape[0] != 3 and image.shape[-1] == 3:
        if image.dtype != torch.uint8:
            raise _broken(where, f"a float image must be CHW (got {_describe(image)})")
        return image.permute(2, 0, 1)  # HWC -> CHW, a view: the transform copies anyway
    if image.ndim == 3 and image.shape[0] == 3 and (
            image.dtype == torch.uint8 or image.is_floating_point()):
        return image
    raise _broken(where, f"image is {_describe(image)}; expected uint8 CHW/HWC or float CHW "
                  "with 3 channels")


def as_label(label: Any, num_classes: int, where: str) -> int:
    # a 0-d tensor or array, or a numpy scalar, is one if it holds an int
    one = isinstance(label, (torch.Tensor, np.ndarray, np.generic)) and label.ndim == 0
    value = label.item() if one else label
    if not isinstance(value, int) or isinstance(value, bool):
        raise _broken(where, f"label is {_describe(label)} ({label!r:.40}); expected an int "
                      "class index")
    if not 0 <= value < num_classes:
        raise _broken(where, f"label {value} is outside [0, {num_classes}) (raise "
                      "dataset.num_classes)")
    return value


class TeamDataset(Dataset):
    """The team's Dataset, each sample held to the contract and transformed."""

    def __init__(self, inner: Dataset, transform, num_classes: int, name: str):
        self.inner, self.transform = inner, transform
        self.num_classes, self.name = num_classes, name

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        sample = self.inner[i]
        where = f"{self.name}[{i}]"
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            length = f" of length {len(sample)}" if isinstance(sample, (tuple, list)) else ""
            raise SampleContractError(f"{CONTRACT_PREFIX}{where} returned {_describe(sample)}"
                                      f"{length}; expected (image, label)")
        image, label = sample
        return self.transform(as_chw(image, where)), as_label(label, self.num_classes, where)


def _instantiate(node: dict, key: str, allowed: str):
    """The callable an instantiate node makes, every _target_ in it checked first."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    targets.callable_node(node, key)
    try:  # a DictConfig again, as instantiate reads it from a composed config
        made = instantiate(OmegaConf.create(plain(node)))
    except Exception as e:  # an import error or bad arguments: one line naming the key
        why = targets.cause(e.__cause__ or e, typed=False, limit=300)
        raise ConfigError(f"{key}._target_", node.get("_target_"),
                          f"an importable callable taking the given keys ({why})") from e
    if not callable(made):
        raise ConfigError(f"{key}._target_", node["_target_"], allowed)
    return made


def build(s: Settings, default_transform, info: dict) -> Dataset:
    """The team's dataset, checked on sample 0; `default_transform`: a built-in dataset's."""
    dset, target = s.dataset, s.dataset._target_
    own_tf = node_set(dset.transform)
    cls = targets.dataset_class(target)  # checked before it is called: a config is code
    kwargs = plain(dset.kwargs)  # a writable copy, lists as lists
    try:
        inner = cls(**kwargs)
    except TypeError as e:
        raise ConfigError("dataset.kwargs", kwargs, f"arguments {target} accepts ({e})") from e
    if not hasattr(inner, "__len__"):  # torch's Dataset has __getitem__ but no __len__
        raise ConfigError("dataset._target_", target, "a map-style Dataset with __len__")
    transform = _instantiate(dset.transform, "dataset.transform", "a callable transform, or a "
                             "factory returning one (_partial_: true for a plain function)"
                             ) if own_tf else default_transform
    own = s.step.name == "custom"  # the samples as they are, for the team's collate and loss
    ds = inner if own else TeamDataset(inner, transform, dset.num_classes, cls.__name__)
    try:
        n = len(ds)  # len() takes a count up to sys.maxsize, not below 0
    except (OverflowError, ValueError, TypeError) as e:
        raise ConfigError("dataset._target_", target, f"a Dataset whose __len__ is its number "
                          f"of samples ({e})") from e
    if n == 0:
        raise ConfigError("dataset.kwargs", kwargs, f"arguments giving {target} samples (it has "
                          "none)")
    check_sampled(n, "dataset._target_", target)  # the sampler's order fits in RAM
    try:
        ds[0]  # in the main process: a broken contract is one line before any measuring
    except SampleContractError as e:
        raise ConfigError("dataset._target_", target, f"a Dataset {CONTRACT} ({e})") from e
    info.update(samples=n, target=str(target),
                transform=str(dset.transform["_target_"]) if own_tf else
                "none: step=custom" if own else "gpubench")
    return ds


def collate(s: Settings, own: bool):
    """The team's collate; with `own` samples (step=custom) its or torch's; None: gpubench's."""
    node = s.dataset.collate  # set on dataset=custom only (settings' rules)
    fn = _instantiate(node, "dataset.collate", "a collate function (a list of (image, label) -> "
                      "(images, labels)); _partial_: true for a plain function"
                      ) if node_set(node) else None
    if own:
        return TeamCollate(fn or default_collate, pairs=False)
    return TeamCollate(fn) if fn is not None else None


class TeamCollate:
    """The team's collate giving (batch, 0 skipped), the batch held to (images, labels) tensors
    unless `pairs` is off. Module-level: spawn can pickle it."""

    def __init__(self, fn, pairs: bool = True):
        self.fn, self.pairs = fn, pairs

    def __call__(self, batch):
        out = self.fn(batch)
        if not self.pairs:
            return out, 0
        if not (isinstance(out, (tuple, list)) and len(out) == 2
                and all(isinstance(t, torch.Tensor) for t in out)):
            raise SampleContractError(f"{CONTRACT_PREFIX}dataset.collate returned "
                                      f"{_describe(out)}; expected (images, labels) tensors")
        return (out[0], out[1]), 0
