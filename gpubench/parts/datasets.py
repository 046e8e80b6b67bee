"""Datasets, each through a real transform path (the loader phase costs what a training job's
does): synthetic pools, fake_jpeg bytes, imagefolder, cifar10; and samples that do not decode."""

from __future__ import annotations

import io
import math
import os
import pickle
import re
from pathlib import Path

import torch
from torch.utils.data import Dataset

from gpubench.config.errors import ConfigError
from gpubench.config.footprint import source_size  # noqa: F401 (the RAM rules use it too)

JPEG_MAGIC = b"\xff\xd8\xff"
FAIL_PREFIX = "dataset.on_corrupt=fail: "
SKIP_PREFIX = "dataset.on_corrupt=skip: "


class WorkerError(Exception):
    """torch re-raises a worker's error with its traceback as text: str() keeps its last line."""

    PREFIXES: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = super().__str__()
        found = re.findall(f"(?:{'|'.join(map(re.escape, self.PREFIXES))}).*", text)
        return found[-1].strip() if found else text


class CorruptImage(WorkerError):
    """A sample that does not decode (on_corrupt=fail), or with skip no substitute either."""

    PREFIXES = (FAIL_PREFIX, SKIP_PREFIX)


def corrupt(path: str, why: object) -> CorruptImage:
    return CorruptImage(f"{FAIL_PREFIX}cannot decode {path}: {why}")


def nothing_decodes(tried: int, path: str, why: object) -> CorruptImage:
    return CorruptImage(f"{SKIP_PREFIX}{tried} files tried in a row do not decode (e.g. "
                        f"{path}: {why}); dataset.root must hold decodable images")


# on_corrupt=skip replaces a sample so batches keep their size (a smaller one would re-run cuDNN's
# autotune or recompile); at most this many tries, then the run fails (all-corrupt must not hang)
MAX_SUBSTITUTES = 32
# a large prime hop, not the next file: corrupt files cluster (one bad class folder)
SUBSTITUTE_HOP = 1_000_003


class Substituted(tuple):
    """A sample standing in for `skipped` ones that did not decode."""

    skipped: int = 0


def substitute_order(i: int, n: int, tries: int) -> list[int]:
    """Indices tried for sample i: itself, then others, all distinct, at most `tries`."""
    hop = SUBSTITUTE_HOP % n if n > 1 and math.gcd(SUBSTITUTE_HOP, n) == 1 else 1
    return [(i + k * hop) % n for k in range(min(tries, n))]


class TensorImages(Dataset):
    """uint8 images in one tensor (CIFAR, a preload cache, a synthetic pool), transformed."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


def synthetic(n: int, size: int, num_classes: int, transform, seed: int) -> TensorImages:
    g = torch.Generator().manual_seed(seed)  # random uint8 images, transformed as decoded ones
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    return TensorImages(images, torch.randint(0, num_classes, (n,), generator=g), transform)


# The in-memory pools stand in for a large dataset, cycled through one long epoch: each epoch end
# drains the workers' prefetch queue, a stall a real dataset has once an hour.
IN_MEMORY_POOLS = ("synthetic", "fake_jpeg")
CYCLED_EPOCH = 1_000_000


class Cycled(Dataset):
    """A pool seen as one epoch of `length`."""

    def __init__(self, pool: Dataset, length: int):
        self.pool, self.length, self.n = pool, length, len(pool)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.pool[i % self.n]


def encode_jpeg_pool(n: int, size: int, quality: int, seed: int) -> list[bytes]:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pool = []
    for _ in range(n):
        # low-frequency colour fields plus grain: size and decode cost near a photo's (pure
        # noise is several times larger and slower)
        coarse = torch.rand((1, 3, 8, 8), generator=g) * 255
        img = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic")
        img = img + torch.randn((1, 3, size, size), generator=g) * 12
        buf = io.BytesIO()
        arr = img.clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).numpy()
        Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
        pool.append(buf.getvalue())
    return pool


class ImageFiles(Dataset):
    """(path or JPEG bytes, label) samples decoded with PIL, or (raw) handed on as (bytes, label,
    name) for device decode; one that fails is replaced (on_corrupt=skip) or named (fail)."""

    def __init__(self, samples: list[tuple[str | bytes, int]], transform, on_corrupt: str,
                 raw=False):
        self.samples, self.transform, self.on_corrupt = samples, transform, on_corrupt
        self.raw = raw

    def __len__(self) -> int:
        return len(self.samples)

    def _name(self, i: int) -> str:
        src = self.samples[i][0]
        return f"fake_jpeg[{i}]" if isinstance(src, bytes) else src

    def _load(self, i: int):
        src, label = self.samples[i]
        if self.raw:
            data = src if isinstance(src, bytes) else Path(src).read_bytes()
            # the start marker only (decoding is the device's): a PNG would fail there unnamed
            if not data.startswith(JPEG_MAGIC):
                raise ValueError("not a JPEG (dataset.decode_on=device reads JPEG files only)")
            return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, self._name(i)
        from PIL import Image

        with Image.open(io.BytesIO(src) if isinstance(src, bytes) else src) as im:
            img = im.convert("RGB")  # forces the full decode: truncation shows up here
        return self.transform(img), label

    def __getitem__(self, i: int):
        order = substitute_order(i, len(self.samples), MAX_SUBSTITUTES)
        first_error = None
        for skipped, j in enumerate(order):
            try:
                sample = Substituted(self._load(j))
            except Exception as e:  # PIL raises several types for truncated / non-image files
                if self.on_corrupt == "fail":
                    raise corrupt(self._name(j), e) from e
                first_error = first_error or (self._name(j), e)
                continue
            sample.skipped = skipped
            return sample
        raise nothing_decodes(len(order), *first_error)


def scan_imagefolder(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(path, class index) of each image under root/<class>/ (ImageFolder's rules, none hidden)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    if not root.is_dir():
        raise ConfigError("dataset.root", str(root), "an existing folder")
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise ConfigError("dataset.root", str(root),
                          "a folder of class sub-folders of images (none found)")
    samples = make_dataset(str(root), {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS,
                           allow_empty=True)  # an empty class is allowed, all empty are not
    if not samples:
        raise ConfigError("dataset.root", str(root),
                          "class sub-folders holding image files (all are empty)")
    return samples, classes


def mean_file_bytes(paths: list[str], sample: int = 1000) -> float:
    """Mean file size from an even sample of the files (a stat each of a million costs seconds)."""
    picked = paths[:: max(1, len(paths) // sample)]
    return sum(os.path.getsize(p) for p in picked) / len(picked)


# Read here: torchvision's CIFAR10 refuses a file whose md5 is not the official one (a subset).
# Unpickled as torchvision does: trusted folders only.
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


def read_cifar10(root: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The training split (uint8 [N,3,32,32], int64 labels, names) of root or its CIFAR_DIR."""
    import numpy as np

    def error(what: str) -> ConfigError:
        return ConfigError("dataset.root", str(root), f"a CIFAR-10 python folder ({what})")

    folder = root / CIFAR_DIR if (root / CIFAR_DIR).is_dir() else root
    missing = [n for n in CIFAR_TRAIN if not (folder / n).is_file()]
    if missing:
        raise error(f"{CIFAR_DIR}/ lacks {', '.join(missing)}")
    images, labels = [], []
    for name in CIFAR_TRAIN:
        try:
            with open(folder / name, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            data = np.asarray(entry["data"], dtype=np.uint8)
            ys = entry["labels"] if "labels" in entry else entry["fine_labels"]
        except Exception as e:
            raise error(f"{name} does not read: {type(e).__name__}: {e}") from e
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(ys) != len(data):
            raise error(f"{name}: data {data.shape} vs {len(ys)} labels")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.extend(ys)
    classes = [str(i) for i in range(max(labels, default=-1) + 1)]
    meta = folder / "batches.meta"
    if meta.is_file():
        with open(meta, "rb") as f:
            classes = list(pickle.load(f, encoding="latin1").get("label_names", classes))
    x = torch.from_numpy(np.concatenate(images)).contiguous()
    return x, torch.as_tensor(labels, dtype=torch.int64), classes
