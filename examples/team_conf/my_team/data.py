"""The team's data pipeline: a Dataset reading its own shard format, its own transform and its
own collate function. gpubench builds each from the config (dataset._target_ + dataset.kwargs,
dataset.transform, dataset.collate) and measures them as the team trains with them.

Here the "shards" are .npz files of HWC uint8 images and int labels, written once by
`write_shards` (a stand-in for LMDB, WebDataset tar shards or parquet): reading them costs real
file I/O and decompression per sample.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate


def write_shards(root: str | Path, shards: int = 2, per_shard: int = 32, size: int = 40,
                 num_classes: int = 10, seed: int = 0) -> Path:
    """Write `shards` compressed .npz files of `per_shard` images each under `root`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s in range(shards):
        images = rng.integers(0, 256, (per_shard, size, size, 3), dtype=np.uint8)
        labels = rng.integers(0, num_classes, per_shard)
        np.savez_compressed(root / f"shard-{s:05d}.npz", images=images, labels=labels)
    return root


class ShardDataset(Dataset):
    """Samples from the .npz shards under `root`: (HWC uint8 numpy image, int label), as the
    gpubench sample contract allows. A worker opens a shard the first time it needs it."""

    def __init__(self, root: str, cache_shards: bool = True):
        self.files = sorted(Path(root).expanduser().glob("shard-*.npz"))
        if not self.files:
            raise FileNotFoundError(f"no shard-*.npz under {root} (see write_shards)")
        sizes = []
        for f in self.files:
            with np.load(f) as z:
                sizes.append(len(z["labels"]))
        self.starts = np.cumsum([0, *sizes]).tolist()
        self.cache_shards = cache_shards
        self._open: dict[int, dict] = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def _shard(self, k: int) -> dict:
        if k in self._open:
            return self._open[k]
        with np.load(self.files[k]) as z:
            shard = {"images": z["images"], "labels": z["labels"]}
        if self.cache_shards:
            self._open[k] = shard
        return shard

    def __getitem__(self, i: int):
        k = bisect.bisect_right(self.starts, i) - 1
        shard = self._shard(k)
        j = i - self.starts[k]
        return shard["images"][j], int(shard["labels"][j])


class CenterCropNormalize:
    """The team's own transform: centre crop to `size`, scale to [0, 1], normalize. Takes the
    CHW uint8 tensor gpubench hands it, returns float CHW."""

    def __init__(self, size: int, mean: float = 0.5, std: float = 0.25):
        self.size, self.mean, self.std = size, mean, std

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        _, h, w = image.shape
        top, left = (h - self.size) // 2, (w - self.size) // 2
        x = image[:, top:top + self.size, left:left + self.size].float().div_(255)
        return x.sub_(self.mean).div_(self.std)


def collate(batch):
    """The team's collate: default_collate, labels as int64 (what cross-entropy takes)."""
    images, labels = default_collate(batch)
    return images, labels.long()
