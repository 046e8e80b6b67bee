"""The team's own data pipeline: `dataset=custom dataset._target_=my_team.data.MyDataset`.

gpubench builds the team's map-style Dataset class with `dataset.kwargs` (as `model._target_`
and `model.kwargs` work), optionally the team's transform (`dataset.transform`) and collate
function (`dataset.collate`), both Hydra instantiate nodes, and measures it through the same
loader, compute and e2e phases as the built-in datasets: the DataLoader, its workers and
pinning are gpubench's; what one sample costs is the team's.

The sample contract (docs/data.md): `__getitem__(i)` returns `(image, label)` where

- image is a uint8 tensor or numpy array, CHW or HWC with 3 channels (decoded pixels, as
  `torchvision.io.decode_image` or PIL give them), a float CHW tensor with values in [0, 1], or
  a PIL image;
- label is an int (a Python int, or a 0-d integer tensor or numpy integer) in
  [0, dataset.num_classes).

Without `dataset.transform` gpubench's train transform runs on the image (RandomResizedCrop to
`dataset.image_size`, flip, normalize), so `preload` and `augment_on=device` work unchanged.
With it, the team's transform takes the image (HWC arrays already turned into CHW tensors) and
must return a float CHW tensor; gpubench's transform is then not applied.

The Dataset class and every `_target_` of the transform and collate nodes are resolved and
checked before any is called (gpubench/parts/targets.py: a config is code).

Sample 0 is checked in the main process while the pipeline is built, so a Dataset that breaks
the contract stops the run with one line before anything is measured. Every later sample is
checked too (a few type tests, no copy), inside the workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gpubench.config.errors import ConfigError
from gpubench.config.settings import Dataset as DatasetSettings
from gpubench.config.settings import Settings, check_sampled, node_set, plain
from gpubench.parts import targets

CONTRACT = ("__getitem__ returning (image, label): image a uint8 CHW/HWC tensor or array with 3 "
            "channels, a float CHW tensor in [0, 1] or a PIL image; label an int in "
            "[0, dataset.num_classes) (see docs/data.md)")
CONTRACT_PREFIX = "dataset=custom sample contract: "


class SampleContractError(ValueError):
    """A sample that breaks the contract. Raised in a DataLoader worker, torch re-raises it in
    the main process built from the worker's whole traceback text; str() keeps the one line
    that says what was wrong."""

    def __str__(self) -> str:
        text = super().__str__()
        for line in reversed(text.splitlines()):
            if CONTRACT_PREFIX in line:
                return line[line.index(CONTRACT_PREFIX):].strip()
        return text


def _describe(x: Any) -> str:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return f"{type(x).__name__} {tuple(x.shape)} {x.dtype}"
    return type(x).__name__


def as_chw(image: Any, where: str) -> Any:
    """The image as the transforms take it: a CHW tensor (uint8 or float), or the PIL image.
    Raises SampleContractError naming what was found."""
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(np.ascontiguousarray(image))
    if isinstance(image, torch.Tensor):
        if image.ndim == 3 and image.shape[0] != 3 and image.shape[-1] == 3:
            if image.dtype != torch.uint8:
                raise SampleContractError(f"{CONTRACT_PREFIX}{where}: a float image must be CHW "
                                          f"(got {_describe(image)})")
            return image.permute(2, 0, 1)  # HWC -> CHW, a view: the transform copies anyway
        if image.ndim == 3 and image.shape[0] == 3 and (
                image.dtype == torch.uint8 or image.is_floating_point()):
            return image
        raise SampleContractError(f"{CONTRACT_PREFIX}{where}: image is {_describe(image)}; "
                                  "expected uint8 CHW/HWC or float CHW with 3 channels")
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - torchvision depends on Pillow
        Image = None
    if Image is not None and isinstance(image, Image.Image):
        return image.convert("RGB") if image.mode != "RGB" else image
    raise SampleContractError(f"{CONTRACT_PREFIX}{where}: image is {_describe(image)}; expected "
                              "a tensor, a numpy array or a PIL image")


def as_label(label: Any, num_classes: int, where: str) -> int:
    if isinstance(label, (torch.Tensor, np.ndarray)) and label.ndim == 0 and not (
            label.dtype.is_floating_point if isinstance(label, torch.Tensor)
            else np.issubdtype(label.dtype, np.floating)):
        label = label.item()
    if isinstance(label, np.integer):
        label = int(label)
    if not isinstance(label, int) or isinstance(label, bool):
        raise SampleContractError(f"{CONTRACT_PREFIX}{where}: label is {_describe(label)} "
                                  f"({label!r:.40}); expected an int class index")
    if not 0 <= label < num_classes:
        raise SampleContractError(f"{CONTRACT_PREFIX}{where}: label {label} is outside "
                                  f"[0, {num_classes}) (raise dataset.num_classes)")
    return label


class TeamDataset(Dataset):
    """The team's Dataset with the contract checked and the transform applied per sample; with
    `own` samples (step=custom) the samples as the Dataset returns them."""

    def __init__(self, inner: Dataset, transform, num_classes: int, name: str, own=False):
        self.inner, self.transform = inner, transform
        self.num_classes, self.name, self.own = num_classes, name, own

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        sample = self.inner[i]
        if self.own:  # step=custom: for the team's collate and loss (gpubench.parts.step.Loss)
            return sample
        where = f"{self.name}[{i}]"
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise SampleContractError(f"{CONTRACT_PREFIX}{where} returned {_describe(sample)}"
                                      f"{f' of length {len(sample)}' if isinstance(sample, (tuple, list)) else ''}; "
                                      "expected (image, label)")
        image, label = sample
        x = self.transform(as_chw(image, where))
        return x, as_label(label, self.num_classes, where)


def _instantiate(node: dict, key: str):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    targets.callable_node(node, key)  # every _target_ in it checked before any is called
    try:
        # a DictConfig again: instantiate reads `_target_`, `_partial_` and nested nodes from
        # it as from the composed config (the settings hold it as a read-only view)
        return instantiate(OmegaConf.create(plain(node)))
    except Exception as e:  # an import error or bad arguments: one line naming the key
        cause = " ".join(str(e.__cause__ or e).split())[:300]
        raise ConfigError(f"{key}._target_", node.get("_target_"),
                          f"an importable callable taking the given keys ({cause})") from e


def build(s: Settings, default_transform, info: dict) -> Dataset:
    """The team's dataset, checked on sample 0. `default_transform` is what gpubench would run
    on a built-in dataset's images (the train transform, or decode-to-fixed-size for preload
    and augment_on=device). dataset._target_ being set, and the transform's combinations, are
    settings.resolve's rules."""
    dset = s.dataset
    target = dset._target_
    own_tf = node_set(dset.transform)
    cls = targets.dataset_class(target)  # checked before it is called: a config is code
    kwargs = plain(dset.kwargs)  # a writable copy, lists as lists
    try:
        inner = cls(**kwargs)
    except TypeError as e:
        raise ConfigError("dataset.kwargs", kwargs, f"arguments {target} accepts ({e})") from e
    if not hasattr(inner, "__len__"):  # torch's Dataset has __getitem__ but no __len__
        raise ConfigError("dataset._target_", target, "a map-style Dataset with __len__")
    transform = _instantiate(dset.transform, "dataset.transform") if own_tf else default_transform
    if not callable(transform):
        raise ConfigError("dataset.transform._target_", dset.transform["_target_"],
                          "a callable transform, or a factory returning one (_partial_: true for "
                          "a plain function)")
    own = s.step.name == "custom"  # data.own_samples refused gpubench's image keys then
    ds = TeamDataset(inner, transform, dset.num_classes, cls.__name__, own)
    try:
        n = len(ds)  # len() takes a count up to sys.maxsize, not below 0
    except (OverflowError, ValueError, TypeError) as e:
        raise ConfigError("dataset._target_", target, f"a Dataset whose __len__ is its number "
                                                      f"of samples ({e})") from e
    if n == 0:
        raise ConfigError("dataset.kwargs", kwargs, f"arguments giving {target} samples (it has none)")
    check_sampled(n, "dataset._target_", target)  # the sampler's order fits in RAM
    try:
        ds[0]  # in the main process: a broken contract is one line before any measuring
    except SampleContractError as e:
        raise ConfigError("dataset._target_", target, f"a Dataset {CONTRACT} ({e})") from e
    info.update(samples=len(ds), target=str(target),
                transform=str(dset.transform["_target_"]) if own_tf else
                "none: step=custom" if own else "gpubench")
    return ds


def collate_fn(dataset: DatasetSettings):
    """The team's collate function (`dataset.collate`), or None for gpubench's own."""
    node = dataset.collate
    if dataset.name != "custom" or not node_set(node):
        return None
    fn = _instantiate(node, "dataset.collate")
    if not callable(fn):
        raise ConfigError("dataset.collate._target_", node["_target_"],
                          "a collate function (a list of (image, label) -> (images, labels)); "
                          "_partial_: true for a plain function")
    return TeamCollate(fn)


class TeamCollate:
    """The team's collate in the shape the pipeline takes: ((images, labels), samples skipped).
    A class at module level, so spawn/forkserver workers can unpickle it."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, batch):
        out = self.fn(batch)
        if not (isinstance(out, (tuple, list)) and len(out) == 2
                and all(isinstance(t, torch.Tensor) for t in out)):
            raise SampleContractError(f"{CONTRACT_PREFIX}dataset.collate returned "
                                      f"{_describe(out)}; expected (images, labels) tensors")
        return (out[0], out[1]), 0
