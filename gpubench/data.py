"""The data side: datasets, the DataLoader, and moving a batch onto the device.

Every dataset goes through a real transform path, so the loader phase costs what a training
job's data side costs: random uint8 pools (synthetic), PIL-decoded JPEG bytes (fake_jpeg), files
on disk (imagefolder, cifar10). `device_synthetic` is the exception on purpose: one batch already
on the device, zero data cost, the compute bound.
"""

from __future__ import annotations

import io
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from gpubench.augment import DeviceAugment, DeviceDecode, cpu_fixed_size, cpu_train_transform
from gpubench.config import ConfigError, _enum_value

log = logging.getLogger(__name__)


def source_size(image_size: int) -> int:
    """Stored image side before the random crop (256 for 224, as in ImageNet training)."""
    return int(round(image_size * 8 / 7))


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


class JpegBytesDataset(Dataset):
    """In-memory JPEG bytes: decoded per sample (PIL, or kept as bytes for device decode)."""

    def __init__(self, blobs: list[bytes], labels: list[int], transform, raw: bool = False):
        self.blobs, self.labels, self.transform, self.raw = blobs, labels, transform, raw

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        if self.raw:
            return torch.frombuffer(bytearray(self.blobs[i]), dtype=torch.uint8), self.labels[i]
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i])).convert("RGB")
        return self.transform(img), self.labels[i]


class CorruptImage(Exception):
    pass


class ImageFiles(Dataset):
    """(path, label) samples read from disk; a file that fails to decode is skipped and counted
    (on_corrupt=skip) or stops the run naming the file (on_corrupt=fail), never a hang."""

    def __init__(self, samples: list[tuple[str, int]], transform, on_corrupt: str, raw=False):
        self.samples, self.transform, self.on_corrupt, self.raw = samples, transform, on_corrupt, raw

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        try:
            if self.raw:
                from torchvision.io import read_file

                return read_file(path), label
            from PIL import Image

            with Image.open(path) as im:
                img = im.convert("RGB")
            return self.transform(img), label
        except Exception as e:  # PIL raises several types for truncated / non-image files
            if self.on_corrupt == "fail":
                raise CorruptImage(f"dataset.on_corrupt=fail: cannot decode {path}: {e}") from e
            return None


def scan_imagefolder(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    if not root.is_dir():
        raise ConfigError("dataset.root", str(root), "an existing folder")
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    if not classes:
        raise ConfigError("dataset.root", str(root), "a folder of class sub-folders (none found)")
    samples = []
    for idx, c in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(root / c, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, f), idx))
    if not samples:
        raise ConfigError("dataset.root", str(root), "class sub-folders holding image files (all empty)")
    return samples, classes


def load_cifar10(root: Path):
    from torchvision.datasets import CIFAR10

    try:
        return CIFAR10(str(root), train=True, download=False)
    except RuntimeError as e:
        raise ConfigError(
            "dataset.root", str(root), "a folder holding cifar-10-batches-py/ (never downloaded)"
        ) from e


class TensorImages(Dataset):
    """uint8 images held in one tensor (CIFAR arrays or a preload cache); per step only the
    augmentation runs. The tensor lives in shared memory so workers read it without copies."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


def collate_skipping(batch):
    """Default collate over the samples that decoded; the third item counts the skipped ones."""
    kept = [b for b in batch if b is not None]
    skipped = len(batch) - len(kept)
    if not kept:
        return None, None, skipped
    xs, ys = zip(*kept, strict=True)
    if isinstance(xs[0], torch.Tensor) and all(x.shape == xs[0].shape for x in xs):
        x = torch.stack(xs)
    else:  # raw JPEG bytes of different lengths, for device decode
        x = list(xs)
    return x, torch.as_tensor(ys), skipped


# ------------------------------------------------------------------------------ preload


def preload(ds: Dataset, size: int, num_workers: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Decode every sample once into a shared uint8 [N,3,S,S] tensor (reference article 000,
    Method 1). Refuses, before decoding anything, when it would not fit in free RAM."""
    import psutil

    n = len(ds)
    need = n * 3 * size * size
    free = psutil.virtual_memory().available
    if need > 0.8 * free:
        raise ConfigError(
            "dataset.preload",
            True,
            f"false: the cache needs {need / 2**30:.2f} GiB and only {free / 2**30:.2f} GiB is "
            "free (lower dataset.image_size or use a subset)",
        )
    t0 = time.perf_counter()
    images = torch.empty((n, 3, size, size), dtype=torch.uint8).share_memory_()
    labels = torch.empty((n,), dtype=torch.int64).share_memory_()
    loader = DataLoader(ds, batch_size=64, num_workers=num_workers, collate_fn=collate_skipping)
    i = 0
    for x, y, _ in loader:
        if x is None:
            continue
        images[i : i + len(y)] = x
        labels[i : i + len(y)] = y
        i += len(y)
    return images[:i], labels[:i], time.perf_counter() - t0


# ------------------------------------------------------------------------------ pipeline


@dataclass
class Pipeline:
    """What the phases need from the data side."""

    loader: DataLoader | None
    to_device: Callable  # (batch) -> (x, y) on the device, ready for the model
    device_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]  # for the compute phase
    info: dict = field(default_factory=dict)
    skipped: int = 0

    def batches(self) -> Iterator:
        """Endless batches: a phase may need more than one epoch of a small dataset."""
        if self.loader is None:  # device_synthetic: the fixed device batch, zero data cost
            batch = self.device_batch()
            while True:
                yield batch
        while True:
            for batch in self.loader:
                yield batch

    def shutdown(self) -> None:
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def _worker_init(threads: int):
    def init(worker_id: int) -> None:
        # one torch thread per worker: N workers each spawning a thread per core oversubscribe
        # the host and read as a slow loader
        torch.set_num_threads(threads)

    return init


def build_pipeline(cfg: DictConfig, device: str) -> Pipeline:
    ds_cfg, ld = cfg.dataset, cfg.loader
    kind = _enum_value(ds_cfg.name)
    size = int(ds_cfg.image_size)
    src = source_size(size)
    bs = int(ld.batch_size)
    on_device_aug = _enum_value(ds_cfg.augment_on) == "device"
    device_decode = _enum_value(ds_cfg.decode_on) == "device"
    seed = int(cfg.bench.seed)
    info: dict = {"dataset": kind}
    ncls = int(ds_cfg.num_classes)

    if kind == "device_synthetic":
        g = torch.Generator().manual_seed(seed)
        x = torch.randn((bs, 3, size, size), generator=g).to(device)
        y = torch.randint(0, ncls, (bs,), generator=g).to(device)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        x = x.contiguous(memory_format=fmt)
        return Pipeline(loader=None, to_device=lambda b: b, device_batch=lambda: (x, y), info=info)

    # CPU-side transform: full train augmentation, or decode-to-fixed-size when the device
    # does the crop/flip/normalize (augment_on=device)
    cpu_tf = cpu_fixed_size(src) if (on_device_aug or ds_cfg.preload) else cpu_train_transform(size)
    raw = device_decode

    if kind == "synthetic":
        ds: Dataset = SyntheticDataset(int(ds_cfg.num_samples), src, ncls, cpu_tf, seed)
    elif kind == "fake_jpeg":
        t0 = time.perf_counter()
        blobs = encode_jpeg_pool(int(ds_cfg.num_samples), src, int(ds_cfg.jpeg_quality), seed)
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, ncls, (len(blobs),), generator=g).tolist()
        ds = JpegBytesDataset(blobs, labels, cpu_tf, raw=raw)
        info["jpeg_pool_seconds"] = time.perf_counter() - t0
        info["jpeg_mean_bytes"] = sum(map(len, blobs)) / len(blobs)
    elif kind == "imagefolder":
        root = Path(os.path.expanduser(str(ds_cfg.root)))
        samples, classes = scan_imagefolder(root)
        if len(classes) > ncls:
            raise ConfigError(
                "dataset.num_classes", ncls, f">= {len(classes)} (class folders in {root})"
            )
        ds = ImageFiles(samples, cpu_tf, _enum_value(ds_cfg.on_corrupt), raw=raw)
        info.update(files=len(samples), classes=len(classes), root=str(root))
        info["bytes_on_disk"] = sum(os.path.getsize(p) for p, _ in samples)
    elif kind == "cifar10":
        c = load_cifar10(Path(os.path.expanduser(str(ds_cfg.root))))
        images = torch.from_numpy(c.data).permute(0, 3, 1, 2).contiguous()
        labels = torch.as_tensor(c.targets)
        tf = cpu_fixed_size(src) if (on_device_aug or ds_cfg.preload) else cpu_train_transform(size)
        ds = TensorImages(images, labels, tf)
        info["samples"] = len(labels)
    else:  # unreachable: the Enum admits nothing else
        raise ConfigError("dataset.name", kind, "synthetic, device_synthetic, fake_jpeg, imagefolder, cifar10")

    if ds_cfg.preload:
        if raw:
            raise ConfigError("dataset.preload", True, "false with decode_on=device (nothing to decode on the host)")
        images, labels, secs = preload(ds, src, int(ld.num_workers))
        info.update(preload_seconds=secs, preload_bytes=images.numel())
        tf = cpu_fixed_size(src) if on_device_aug else cpu_train_transform(size)
        ds = TensorImages(images, labels, tf)

    pin = bool(ld.pin_memory) and device == "cuda"
    workers = int(ld.num_workers)
    kwargs = dict(
        batch_size=bs,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin,
        drop_last=bool(ld.drop_last),
        collate_fn=collate_skipping,
        generator=torch.Generator().manual_seed(seed),
    )
    if workers > 0:
        kwargs.update(
            prefetch_factor=ld.prefetch_factor,
            persistent_workers=bool(ld.persistent_workers),
            worker_init_fn=_worker_init(int(ld.worker_threads)),
            multiprocessing_context=ld.multiprocessing_context,
        )
    if len(ds) < bs and ld.drop_last:
        raise ConfigError("loader.batch_size", bs, f"<= {len(ds)} (the dataset size) with drop_last")
    loader = DataLoader(ds, **kwargs)

    decode = DeviceDecode(src, device) if device_decode else None
    augment = DeviceAugment(size, device, seed) if (on_device_aug or device_decode) else None
    channels_last = bool(cfg.channels_last)
    pipe = Pipeline(loader=loader, to_device=lambda b: b, device_batch=lambda: b, info=info)

    def to_device(batch):
        x, y, skipped = batch
        pipe.skipped += skipped
        if x is None:
            return None
        # non_blocking only pays off from pinned memory; from pageable memory the copy is
        # synchronous either way
        if decode is not None:
            x = decode(x)
        else:
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
    info["batches_per_epoch"] = math.floor(len(ds) / bs) if ld.drop_last else math.ceil(len(ds) / bs)
    return pipe
