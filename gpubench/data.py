"""The data side: datasets, the DataLoader, and moving a batch onto the device.

Every dataset goes through a real transform path, so the loader phase costs what a training
job's data side costs: random uint8 pools (synthetic), PIL-decoded JPEG bytes (fake_jpeg), files
on disk (imagefolder, cifar10). `device_synthetic` is the exception on purpose: one batch already
on the device, zero data cost, the compute bound.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import os
import pickle
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from gpubench.augment import DeviceAugment, DeviceDecode, cpu_fixed_size, cpu_train_transform
from gpubench.config import ConfigError, _enum_value

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"


def source_size(image_size: int) -> int:
    """Stored image side before the random crop (256 for 224, as in ImageNet training)."""
    return int(round(image_size * 8 / 7))


# ------------------------------------------------------------------------------ bad input


FAIL_PREFIX = "dataset.on_corrupt=fail: "
SKIP_PREFIX = "dataset.on_corrupt=skip: "


class CorruptImage(Exception):
    """A sample that does not decode, with dataset.on_corrupt=fail; or, with skip, a dataset
    in which no substitute decodes either (an all-corrupt folder must fail, never hang).

    Raised in a DataLoader worker, torch re-raises it in the main process built from the
    worker's whole traceback text; str() keeps the one line that names the file.
    """

    def __str__(self) -> str:
        text = super().__str__()
        for line in reversed(text.splitlines()):
            for prefix in (FAIL_PREFIX, SKIP_PREFIX):
                if prefix in line:
                    return line[line.index(prefix) :].strip()
        return text


def corrupt(path: str, why: object) -> CorruptImage:
    return CorruptImage(f"{FAIL_PREFIX}cannot decode {path}: {why}")


def nothing_decodes(tried: int, path: str, why: object) -> CorruptImage:
    return CorruptImage(
        f"{SKIP_PREFIX}{tried} files tried in a row do not decode (e.g. {path}: {why}); "
        "dataset.root must hold decodable images"
    )


# With on_corrupt=skip a sample that does not decode is replaced by another one, so batches
# keep their size (a smaller batch inside a measured window would re-run cuDNN's autotune or
# recompile a compiled model). At most this many are tried per sample, then the run fails: a
# folder whose files are all corrupt must end, with the count and one example path.
MAX_SUBSTITUTES = 32
# Substitutes hop through the dataset by a large prime, not to the next file: corrupt files
# cluster (one bad class folder, one truncated copy job), prime hops spread over the folder.
SUBSTITUTE_HOP = 1_000_003


class Substituted(tuple):
    """A sample standing in for `skipped` samples that did not decode (read by the collate,
    which runs in the same worker: the attribute never needs to be pickled)."""

    skipped: int = 0


def substitute_order(i: int, n: int, tries: int) -> list[int]:
    """Indices tried for sample i: itself, then others, all distinct, at most `tries`."""
    hop = SUBSTITUTE_HOP % n if n > 1 and math.gcd(SUBSTITUTE_HOP, n) == 1 else 1
    return [(i + k * hop) % n for k in range(min(tries, n))]


# ------------------------------------------------------------------------------ datasets


class SyntheticDataset(Dataset):
    """A pool of random uint8 images made once on the host; each sample goes through the
    transform like a decoded image would."""

    def __init__(self, n: int, size: int, num_classes: int, transform, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


# The in-memory pools stand in for a large dataset: an epoch of 512 images would end every few
# batches, and each epoch end drains the workers' prefetch queue, a stall a real dataset of a
# million images has once an hour. So the pool is cycled through one long epoch.
IN_MEMORY_POOLS = ("synthetic", "fake_jpeg")
CYCLED_EPOCH = 1_000_000


class Cycled(Dataset):
    """A pool of samples seen as one epoch of `length`: sample i is pool[i % len(pool)]."""

    def __init__(self, pool: Dataset, length: int):
        self.pool, self.length, self.n = pool, length, len(pool)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.pool[i % self.n]


def _smooth_image(size: int, g: torch.Generator) -> torch.Tensor:
    # Low-frequency colour fields plus grain: JPEG size and decode cost close to a photo's,
    # where pure noise would be several times larger and slower to decode.
    coarse = torch.rand((1, 3, 8, 8), generator=g) * 255
    img = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic")
    img = img + torch.randn((1, 3, size, size), generator=g) * 12
    return img.clamp(0, 255).to(torch.uint8)[0]


def encode_jpeg_pool(n: int, size: int, quality: int, seed: int) -> list[bytes]:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pool = []
    for _ in range(n):
        arr = _smooth_image(size, g).permute(1, 2, 0).numpy()
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
        pool.append(buf.getvalue())
    return pool


def _jpeg_tensor(data: bytes) -> torch.Tensor:
    # The host only checks the JPEG start marker: decoding is the device's job here, and a
    # non-JPEG (PNG in an image folder, say) would fail there anyway, without a file name.
    if not data.startswith(JPEG_MAGIC):
        raise ValueError("not a JPEG (dataset.decode_on=device reads JPEG files only)")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class JpegBytesDataset(Dataset):
    """In-memory JPEG bytes: decoded per sample with PIL, or (raw) handed on as bytes for
    device decode, as (bytes, label, name)."""

    def __init__(self, blobs: list[bytes], labels: list[int], transform, raw: bool = False):
        self.blobs, self.labels, self.transform, self.raw = blobs, labels, transform, raw

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        if self.raw:
            return _jpeg_tensor(self.blobs[i]), self.labels[i], f"fake_jpeg[{i}]"
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i])).convert("RGB")
        return self.transform(img), self.labels[i]


class ImageFiles(Dataset):
    """(path, label) samples read from disk; a file that fails to decode is replaced by another
    file and counted (on_corrupt=skip; see MAX_SUBSTITUTES) or stops the run naming the file
    (on_corrupt=fail), never a hang."""

    def __init__(self, samples: list[tuple[str, int]], transform, on_corrupt: str, raw=False):
        self.samples, self.transform, self.on_corrupt, self.raw = samples, transform, on_corrupt, raw

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, i: int):
        path, label = self.samples[i]
        if self.raw:
            with open(path, "rb") as f:
                return _jpeg_tensor(f.read()), label, path
        from PIL import Image

        with Image.open(path) as im:
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
                    raise corrupt(self.samples[j][0], e) from e
                first_error = first_error or (self.samples[j][0], e)
                continue
            sample.skipped = skipped
            return sample
        raise nothing_decodes(len(order), *first_error)


def scan_imagefolder(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(path, class index) for every image under root/<class>/ (nested folders too), classes
    sorted by name as torchvision's ImageFolder does; hidden folders are not classes."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    if not root.is_dir():
        raise ConfigError("dataset.root", str(root), "an existing folder")
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise ConfigError(
            "dataset.root", str(root), "a folder of class sub-folders of images (none found)"
        )
    samples = []
    for idx, c in enumerate(classes):
        for dirpath, dirnames, files in os.walk(root / c, followlinks=True):
            dirnames.sort()
            for f in sorted(files):
                if f.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, f), idx))
    if not samples:
        raise ConfigError(
            "dataset.root", str(root), "class sub-folders holding image files (all are empty)"
        )
    return samples, classes


def mean_file_bytes(paths: list[str], sample: int = 1000) -> float:
    """Mean file size from an even sample of the files: a stat per file of a million-image
    folder would cost seconds before the run even starts."""
    step = max(1, len(paths) // sample)
    picked = paths[::step]
    return sum(os.path.getsize(p) for p in picked) / len(picked)


# --- CIFAR-10 in its python-pickle format (cifar-10-batches-py/)
#
# Read here rather than by torchvision.datasets.CIFAR10: that class checks every file's md5
# against the official download (`_check_integrity`) and refuses anything else, a re-export or
# a subset included. The format is the same: each data_batch_N is a pickled dict with "data"
# (N x 3072 uint8, channel-planar 32x32) and "labels"; batches.meta holds "label_names".
# Like torchvision, this unpickles the files: read only CIFAR folders you trust.

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


def _cifar_error(root: Path, what: str) -> ConfigError:
    return ConfigError("dataset.root", str(root), f"a CIFAR-10 python folder ({what})")


def read_cifar10(root: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The training split as (uint8 [N,3,32,32], int64 labels [N], class names). `root` is the
    folder holding cifar-10-batches-py/ (torchvision's convention) or that folder itself."""
    import numpy as np

    folder = root / CIFAR_DIR if (root / CIFAR_DIR).is_dir() else root
    missing = [n for n in CIFAR_TRAIN if not (folder / n).is_file()]
    if missing:
        raise _cifar_error(root, f"{CIFAR_DIR}/ lacks {', '.join(missing)}")
    images, labels = [], []
    for name in CIFAR_TRAIN:
        try:
            with open(folder / name, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            data = np.asarray(entry["data"], dtype=np.uint8)
            ys = entry["labels"] if "labels" in entry else entry["fine_labels"]
        except Exception as e:
            raise _cifar_error(root, f"{name} does not read: {type(e).__name__}: {e}") from e
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(ys) != len(data):
            raise _cifar_error(root, f"{name}: data {data.shape} vs {len(ys)} labels")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.extend(ys)
    classes = [str(i) for i in range(max(labels, default=-1) + 1)]
    meta = folder / "batches.meta"
    if meta.is_file():
        with open(meta, "rb") as f:
            classes = list(pickle.load(f, encoding="latin1").get("label_names", classes))
    x = torch.from_numpy(np.concatenate(images)).contiguous()
    return x, torch.as_tensor(labels, dtype=torch.int64), classes


class TensorImages(Dataset):
    """uint8 images held in one tensor (CIFAR arrays or a preload cache); per step only the
    augmentation runs. The tensor lives in shared memory so workers read it without copies."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


# ------------------------------------------------------------------------------ batches


class JpegBatch(NamedTuple):
    """Raw JPEG bytes of a batch as ONE flat uint8 tensor plus offsets (image i is
    data[offsets[i]:offsets[i+1]]), with names for error lines.

    One tensor, not one per image: each tensor a worker sends to the main process is a shared
    memory segment with its own file descriptor, so per-image tensors cost a segment per image
    (slow, and "too many open files" at large batches); this costs one per batch."""

    data: torch.Tensor
    offsets: torch.Tensor
    names: list[str]

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.names)

    def blobs(self) -> list[torch.Tensor]:
        """Per-image views of the flat tensor (no copy): contiguous 1-D uint8, what
        decode_jpeg takes."""
        o = self.offsets.tolist()
        return [self.data[o[i] : o[i + 1]] for i in range(len(o) - 1)]


def _flat_bytes(blobs: list[torch.Tensor]) -> torch.Tensor:
    out = None
    if get_worker_info() is not None:
        # as default_collate does: inside a worker, write straight into shared memory, so
        # sending the batch to the main process costs no extra copy
        n, elem = sum(b.numel() for b in blobs), blobs[0]
        out = elem.new(elem._typed_storage()._new_shared(n, device=elem.device)).resize_(n)
    return torch.cat(blobs, out=out)


def collate_skipping(batch):
    """(x, y, skipped): the samples that decoded, collated, and how many failed to decode
    (substituted by others, or None where a dataset gives up on a sample).

    default_collate is used for the tensors on purpose: inside a worker it stacks straight
    into shared memory, where a plain torch.stack would cost one more copy per batch on its
    way to the main process.
    """
    kept = [b for b in batch if b is not None]
    skipped = len(batch) - len(kept) + sum(getattr(b, "skipped", 0) for b in kept)
    if not kept:
        return None, None, skipped
    if len(kept[0]) == 3:  # raw JPEG bytes for device decode
        blobs, ys, names = zip(*kept, strict=True)
        lengths = torch.tensor([0] + [b.numel() for b in blobs], dtype=torch.int64)
        return (JpegBatch(_flat_bytes(list(blobs)), lengths.cumsum(0), list(names)),
                torch.as_tensor(ys), skipped)
    x, y = default_collate([tuple(b) for b in kept])
    return x, y, skipped


# ------------------------------------------------------------------------------ preload


def preload_bytes_needed(n: int, size: int) -> int:
    return n * 3 * size * size


def preload(
    ds: Dataset, size: int, num_workers: int, loader_kwargs: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """Decode every sample once into a shared uint8 [N,3,S,S] tensor (reference article 000,
    Method 1). Refuses, before decoding anything, when it would not fit in free RAM.
    Returns (images, labels, seconds, samples skipped as corrupt)."""
    import psutil

    n = len(ds)
    need = preload_bytes_needed(n, size)
    free = psutil.virtual_memory().available
    # 80%: the run itself (model, optimizer, worker batches) needs the rest
    if need > 0.8 * free:
        raise ConfigError(
            "dataset.preload",
            True,
            f"false here (the cache of {n} images at {size} px needs {need / 2**30:.2f} GiB "
            f"and only {free / 2**30:.2f} GiB of RAM is free; lower dataset.image_size or use "
            "a smaller folder)",
        )
    t0 = time.perf_counter()
    # Shared memory from the start: forked workers then read the cache in place, with no
    # per-worker copy (a plain tensor would be copied when first pickled to a spawned worker).
    images = torch.empty((n, 3, size, size), dtype=torch.uint8).share_memory_()
    labels = torch.empty((n,), dtype=torch.int64).share_memory_()
    loader = DataLoader(
        ds, batch_size=64, num_workers=num_workers, collate_fn=collate_skipping,
        **(loader_kwargs or {}),
    )
    i = skipped = 0
    for x, y, s in loader:
        skipped += s
        if x is None:
            continue
        images[i : i + len(y)] = x
        labels[i : i + len(y)] = y
        i += len(y)
    return images[:i], labels[:i], time.perf_counter() - t0, skipped


# ------------------------------------------------------------------------------ pipeline


@dataclass
class Pipeline:
    """What the phases need from the data side."""

    loader: DataLoader | None
    to_device: Callable  # (batch) -> (x, y) on the device, ready for the model, or None
    device_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]  # for the compute phase
    info: dict = field(default_factory=dict)
    skipped: int = 0
    epoch: int = 0  # epochs started (DistributedSampler.set_epoch)
    empty_in_a_row: int = 0  # batches in a row in which nothing decoded
    # live loader iterators (weak: an abandoned one must still be collected, which is what
    # stops its workers), so shutdown() can stop the workers of those still alive
    _iters: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)

    def batches(self) -> Iterator:
        """Endless batches: a phase may need more than one epoch of a small dataset."""
        if self.loader is None:  # device_synthetic: the fixed device batch, zero data cost
            batch = self.device_batch()
            while True:
                yield batch
        while True:
            sampler = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                # DistributedSampler shuffles by seed + epoch: without this every epoch would
                # repeat the first one's order, as training jobs that forget it do not
                sampler.set_epoch(self.epoch)
            self.epoch += 1
            it = iter(self.loader)
            self._iters.add(it)
            yield from it

    def shutdown(self) -> None:
        its = list(self._iters)
        persistent = getattr(self.loader, "_iterator", None)
        if persistent is not None:
            its.append(persistent)
        for it in its:
            stop = getattr(it, "_shutdown_workers", None)
            if stop is not None:
                stop()


def _set_threads(threads: int, worker_id: int) -> None:
    torch.set_num_threads(threads)


def loader_settings(ld: DictConfig, device: str) -> dict:
    """DataLoader keyword arguments from the loader config (batch size and sampling aside)."""
    workers = int(ld.num_workers)
    kwargs: dict = dict(num_workers=workers, pin_memory=bool(ld.pin_memory) and device == "cuda")
    if workers == 0:  # the DataLoader rejects the worker-only options without workers
        return kwargs
    ctx = ld.multiprocessing_context
    if ctx is not None:
        methods = torch.multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ConfigError("loader.multiprocessing_context", ctx, f"null or one of {methods}")
    kwargs.update(
        prefetch_factor=ld.prefetch_factor,
        persistent_workers=bool(ld.persistent_workers),
        multiprocessing_context=ctx,
    )
    threads = int(ld.get("worker_threads", 1))
    if threads != 1:
        # torch already gives each worker one thread (N workers each spawning a thread per
        # core would oversubscribe the host); only a different wish needs an init function,
        # a module-level partial so spawn/forkserver workers can unpickle it
        kwargs["worker_init_fn"] = functools.partial(_set_threads, threads)
    return kwargs


def _build_dataset(cfg: DictConfig, src: int, cpu_tf, raw: bool, info: dict) -> Dataset:
    ds_cfg = cfg.dataset
    kind = _enum_value(ds_cfg.name)
    ncls, seed = int(ds_cfg.num_classes), int(cfg.bench.seed)
    if kind == "synthetic":
        return SyntheticDataset(int(ds_cfg.num_samples), src, ncls, cpu_tf, seed)
    if kind == "fake_jpeg":
        t0 = time.perf_counter()
        blobs = encode_jpeg_pool(int(ds_cfg.num_samples), src, int(ds_cfg.jpeg_quality), seed)
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, ncls, (len(blobs),), generator=g).tolist()
        info["jpeg_pool_seconds"] = time.perf_counter() - t0
        info["jpeg_mean_bytes"] = sum(map(len, blobs)) / len(blobs)
        return JpegBytesDataset(blobs, labels, cpu_tf, raw=raw)
    root = Path(os.path.expanduser(str(ds_cfg.root)))
    if kind == "imagefolder":
        samples, classes = scan_imagefolder(root)
        _check_classes(cfg, len(classes), f"class folders in {root}")
        info.update(files=len(samples), classes=len(classes), root=str(root))
        info["mean_file_bytes"] = mean_file_bytes([p for p, _ in samples])
        return ImageFiles(samples, cpu_tf, _enum_value(ds_cfg.on_corrupt), raw=raw)
    if kind == "cifar10":
        images, labels, classes = read_cifar10(root)
        _check_classes(cfg, max(len(classes), int(labels.max()) + 1), f"CIFAR-10 labels in {root}")
        info.update(samples=len(labels), classes=len(classes), root=str(root))
        return TensorImages(images, labels, cpu_tf)
    raise ConfigError(  # unreachable: the Enum admits nothing else
        "dataset.name", kind, "synthetic, device_synthetic, fake_jpeg, imagefolder, cifar10"
    )


def _check_classes(cfg: DictConfig, n: int, where: str) -> None:
    # a label at or past the classifier's width fails deep inside the loss (a device-side
    # assert on CUDA): say so before any work instead
    for key, value in (
        ("dataset.num_classes", cfg.dataset.num_classes),
        ("model.num_classes", cfg.model.get("num_classes")),
    ):
        if value is not None and int(value) < n:
            raise ConfigError(key, int(value), f">= {n} ({where})")


def refill(x: torch.Tensor, y: torch.Tensor, failed: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of len(y) again after the images at `failed` did not decode: the decoded ones
    (x, in order) are repeated to fill the gaps, with their labels, so the step never sees a
    smaller batch (which would re-run cuDNN's autotune or recompile inside the window)."""
    bad = set(failed)
    y_ok = y[[i for i in range(len(y)) if i not in bad]]
    fill = [i % len(y_ok) for i in range(len(y))]
    return x[fill], y_ok[fill]


def build_pipeline(cfg: DictConfig, device: str, shard: tuple[int, int] | None = None) -> Pipeline:
    """The data side of one run. `shard=(rank, world)` under torchrun: each rank loads its own
    share of the dataset (DistributedSampler), as data-parallel training does."""
    ds_cfg, ld = cfg.dataset, cfg.loader
    kind = _enum_value(ds_cfg.name)
    size = int(ds_cfg.image_size)
    src = source_size(size)
    bs = int(ld.batch_size)
    on_device_aug = _enum_value(ds_cfg.augment_on) == "device"
    device_decode = _enum_value(ds_cfg.decode_on) == "device"
    on_corrupt = _enum_value(ds_cfg.on_corrupt)
    seed = int(cfg.bench.seed)
    info: dict = {"dataset": kind}

    if kind == "device_synthetic":
        ncls = int(ds_cfg.num_classes)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn((bs, 3, size, size), generator=g).to(device)
        y = torch.randint(0, ncls, (bs,), generator=g).to(device)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        x = x.contiguous(memory_format=fmt)
        return Pipeline(loader=None, to_device=lambda b: b, device_batch=lambda: (x, y), info=info)

    if ds_cfg.preload and device_decode:
        raise ConfigError(
            "dataset.preload", True, "false with decode_on=device (the cache holds decoded pixels)"
        )
    settings = loader_settings(ld, device)
    if device_decode:
        # nvJPEG reads the JPEG bytes from host memory through its own pinned staging
        # buffers: pinning them here would cost a page-locked copy for nothing (the labels
        # are pinned on their own in to_device)
        settings["pin_memory"] = False
    # Host-side transform: the full train augmentation, or decode-to-fixed-size when the cache
    # (preload) or the device (augment_on=device) takes the uint8 images
    fixed_tf, train_tf = cpu_fixed_size(src), cpu_train_transform(size)
    ds = _build_dataset(cfg, src, fixed_tf if (on_device_aug or ds_cfg.preload) else train_tf,
                        device_decode, info)
    skipped_at_build = 0
    if ds_cfg.preload:
        preload_kw = {k: v for k, v in settings.items() if k in ("multiprocessing_context",)}
        images, labels, secs, skipped_at_build = preload(ds, src, settings["num_workers"], preload_kw)
        info.update(preload_seconds=secs, preload_bytes=images.numel(),
                    preload_skipped=skipped_at_build)
        ds = TensorImages(images, labels, fixed_tf if on_device_aug else train_tf)

    if kind in IN_MEMORY_POOLS:
        ds = Cycled(ds, max(len(ds), CYCLED_EPOCH))
    if len(ds) < bs and ld.drop_last:
        raise ConfigError("loader.batch_size", bs, f"<= {len(ds)} (the dataset size) with drop_last")
    sampler = None
    if shard is not None and shard[1] > 1:
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(ds, num_replicas=shard[1], rank=shard[0], shuffle=True,
                                     seed=seed, drop_last=True)
    loader = DataLoader(
        ds,
        batch_size=bs,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=bool(ld.drop_last),
        collate_fn=collate_skipping,
        # seeds the shuffle order and each worker's torch/random/numpy seeds: reproducible
        generator=torch.Generator().manual_seed(seed),
        **settings,
    )
    pin = settings["pin_memory"]
    decode = DeviceDecode(src, device) if device_decode else None
    augment = DeviceAugment(size, device, seed) if (on_device_aug or device_decode) else None
    channels_last = bool(cfg.channels_last)
    # to_device and device_batch close over the pipeline (skip counts): set just below
    pipe = Pipeline(loader=loader, to_device=None, device_batch=None, info=info,
                    skipped=skipped_at_build)

    def decode_on_device(jpegs: JpegBatch, y: torch.Tensor):
        x, failed = decode(jpegs.blobs())
        if failed:
            if on_corrupt == "fail":
                raise corrupt(jpegs.names[failed[0]], "the device JPEG decoder refused it")
            pipe.skipped += len(failed)
            if x is None:
                pipe.empty_in_a_row += 1
                if pipe.empty_in_a_row * len(jpegs) >= MAX_SUBSTITUTES:
                    raise nothing_decodes(pipe.empty_in_a_row * len(jpegs), jpegs.names[0],
                                          "the device JPEG decoder refused it")
                return None, None
            x, y = refill(x, y, failed)
        pipe.empty_in_a_row = 0
        return x, y

    def to_device(batch):
        x, y, skipped = batch
        pipe.skipped += skipped
        if x is None:
            return None
        if decode is not None:
            x, y = decode_on_device(x, y)
            if x is None:
                return None
            if device == "cuda":
                # the bytes are read by nvJPEG from host memory (no pinning, see above), but
                # the labels are pinned here so their copy is asynchronous like the images':
                # from pageable memory .to() would block the host until the copy is done.
                # Safe to let go of the pinned tensor at once: the caching host allocator
                # records an event on the copy's stream and reuses the block only after it.
                y = y.pin_memory().to(device, non_blocking=True)
            else:
                y = y.to(device)
        else:
            # non_blocking only pays off from pinned memory; from pageable memory the copy is
            # synchronous either way
            x = x.to(device, non_blocking=pin)
            y = y.to(device, non_blocking=pin)
        if augment is not None:
            x = augment(x)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    fixed: list = []

    def device_batch():
        # the compute phase's batch: one real batch from this pipeline, kept on the device
        if not fixed:
            for batch in pipe.batches():
                moved = to_device(batch)
                if moved is not None:
                    fixed.append(moved)
                    break
        return fixed[0]

    pipe.to_device, pipe.device_batch = to_device, device_batch
    info.update(
        samples=len(ds.pool) if isinstance(ds, Cycled) else len(ds),
        num_workers=settings["num_workers"],
        decode_on="device" if device_decode else "cpu",
        augment_on="device" if augment is not None else "cpu",
        batches_per_epoch=math.floor(len(ds) / bs) if ld.drop_last else math.ceil(len(ds) / bs),
    )
    return pipe
