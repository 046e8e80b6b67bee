"""The data side of a run: the loader (DataLoader or thread workers), preload, and the device side
(copy, nvJPEG decode, augment). A loader yields (batch or None if nothing decoded, samples that
did not decode); step=custom on dataset=custom: the batch the team's collate makes."""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, default_collate

from gpubench.config import settings
from gpubench.config.errors import ConfigError
from gpubench.config.settings import Loader, Settings
from gpubench.core.pipe import batches_in_flight
from gpubench.parts import custom_data, datasets
from gpubench.parts.augment import DeviceAugment, DeviceDecode, cpu_fixed_size, cpu_train_transform
from gpubench.parts.datasets import CorruptImage, Cycled, TensorImages  # noqa: F401 (runner's)
from gpubench.parts.oom import pin_host
from gpubench.parts.targets import cause


class JpegBatch(NamedTuple):
    """A batch's JPEG bytes as ONE flat uint8 tensor plus offsets (each tensor a worker sends
    costs a file descriptor: one per image gives "too many open files"), names for errors."""

    data: torch.Tensor
    offsets: torch.Tensor
    names: list[str]

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.names)

    def blobs(self) -> list[torch.Tensor]:  # per-image 1-D views, what decode_jpeg takes
        return list(self.data.tensor_split(self.offsets[1:-1].tolist()))


def collate_skipping(batch):
    """((x, y), skipped): the samples that decoded, collated, and how many did not."""
    kept = [b for b in batch if b is not None]
    skipped = len(batch) - len(kept) + sum(getattr(b, "skipped", 0) for b in kept)
    if not kept:
        return None, skipped
    if len(kept[0]) != 3:
        return tuple(default_collate([tuple(b) for b in kept])), skipped
    blobs, ys, names = zip(*kept, strict=True)  # raw JPEG bytes for device decode
    sizes, out = [b.numel() for b in blobs], None
    if torch.utils.data.get_worker_info() is not None:
        # as default_collate does: inside a worker, straight into shared memory (no extra copy)
        shared = blobs[0]._typed_storage()._new_shared(sum(sizes), device=blobs[0].device)
        out = blobs[0].new(shared).resize_(sum(sizes))
    offsets = torch.tensor([0, *sizes], dtype=torch.int64).cumsum(0)
    jpegs = JpegBatch(torch.cat(blobs, out=out), offsets, list(names))
    return (jpegs, torch.as_tensor(ys)), skipped


class ThreadLoader:
    """loader.worker_type=thread: a DataLoader's epochs from `workers` threads (torchdata.nodes),
    as many batches held ahead. Each runs one torch thread (torchdata/nodes/_apply_udf.py, a
    per-thread OpenMP setting): the training thread keeps its own."""

    def __init__(self, dataset: Dataset, sampler: Sampler, batch_size: int, drop_last: bool,
                 collate: Callable[[list], Any], workers: int, prefetch: int | None,
                 in_order: bool = True, pin: bool = False):
        try:  # not installed, or needing a newer torch
            import torchdata.nodes as tn
        except Exception as e:
            raise ConfigError("loader.worker_type", "thread", f"process here: thread workers need "
                              f"torchdata.nodes (pip install torchdata) with torch "
                              f"{torch.__version__} ({cause(e)})") from e
        self.dataset, self.collate = dataset, collate
        self._tids: set[int] = set()
        node = tn.Batcher(tn.SamplerWrapper(sampler), batch_size=batch_size, drop_last=drop_last)
        node = tn.ParallelMapper(node, self._batch, num_workers=workers, in_order=in_order,
                                 method="thread", max_concurrent=workers)
        if pin:  # "cuda": the pinning thread sets this process's device (torchrun's rank)
            node = tn.PinMemory(node, "cuda")
        ready = batches_in_flight(workers, prefetch) - workers
        if ready > 0:
            node = tn.Prefetcher(node, prefetch_factor=ready)
        self.root, self.loader = node, tn.Loader(node)

    def _batch(self, indices: list[int]):  # a worker's job: one batch, read and collated
        self._tids.add(threading.get_native_id())
        return self.collate([self.dataset[i] for i in indices])

    def __iter__(self) -> Iterator:
        self._tids.clear()  # a new epoch starts new threads
        return iter(self.loader)

    def worker_tids(self) -> set[int]:  # this epoch's
        return set(self._tids)

    def shutdown(self) -> None:
        """Stop every thread, sources first. torchdata 0.11 has no public close: this does what
        a collected iterator does (torchdata/nodes/map.py: _ParallelMapperIter.__del__)."""
        chain, node = [], self.root
        while node is not None:
            chain.append(node)
            node = getattr(node, "source", None)
        for node in reversed(chain):
            it = getattr(node, "_it", None)
            while it is not None and not hasattr(it, "_shutdown"):
                it = getattr(it, "_it", None)  # ParallelMapper holds its iterator one level down
            if it is not None:
                it._shutdown()


def preload(ds: Dataset, size: int, num_workers: int, context: str | None = None,
            threads: bool = False) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """Decode every sample once into a shared uint8 [N,3,S,S] tensor (workers read it in place,
    no per-worker copy). Returns (images, labels, seconds, samples skipped as corrupt)."""
    n = len(ds)
    settings.check_preload_fits(n, size)  # a resource check: the length is known only here
    t0 = time.perf_counter()
    images = torch.empty((n, 3, size, size), dtype=torch.uint8).share_memory_()
    labels = torch.empty((n,), dtype=torch.int64).share_memory_()
    if threads and num_workers:
        loader = ThreadLoader(ds, torch.utils.data.SequentialSampler(ds), 64, False,
                              collate_skipping, num_workers, None)
    else:
        loader = DataLoader(ds, batch_size=64, num_workers=num_workers,
                            collate_fn=collate_skipping, multiprocessing_context=context)
    i = skipped = 0
    for batch, s in loader:
        skipped += s
        if batch is not None:
            x, y = batch
            images[i : i + len(y)], labels[i : i + len(y)] = x, y
            i += len(y)
    return images[:i], labels[:i], time.perf_counter() - t0, skipped


def refill(x: torch.Tensor, y: torch.Tensor, failed: list[int]) -> tuple[torch.Tensor, ...]:
    """A batch of len(y) again: the decoded images and labels repeat over the gaps at `failed`."""
    y_ok = y[[i for i in range(len(y)) if i not in failed]]
    fill = [i % len(y_ok) for i in range(len(y))]
    return x[fill], y_ok[fill]


@dataclass
class DeviceSide:
    """How a host batch becomes the model's input: a copy or nvJPEG decode, GPU augmentation."""

    device: str
    pin: bool  # the loader pins its batches: the copy can be non-blocking
    channels_last: bool
    decode: DeviceDecode | None = None  # dataset.decode_on=device
    augment: DeviceAugment | None = None  # dataset.augment_on=device (or decode_on=device)

    def copy(self, batch):
        # non_blocking only pays off from pinned memory (from pageable it is synchronous anyway)
        return tree_map_only(torch.Tensor, lambda t: t.to(self.device, non_blocking=self.pin),
                             batch)

    def labels(self, y: torch.Tensor) -> torch.Tensor:  # of a batch decoded on the device
        if self.device != "cuda":
            return y.to(self.device)
        # pinned so the copy is asynchronous; the pinned tensor may go at once: the caching host
        # allocator reuses its block only after an event recorded on the copy's stream
        return pin_host(y).to(self.device, non_blocking=True)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        if self.augment is not None:
            x = self.augment(x)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x


@dataclass
class Pipeline:
    """Endless batches, each moved to the device, and one kept there for the compute phase."""

    loader: DataLoader | ThreadLoader | None  # None: device_synthetic
    side: DeviceSide | None  # None: the batches are on the device already (device_synthetic)
    info: dict = field(default_factory=dict)
    on_corrupt: str = "skip"
    skipped: int = 0
    epoch: int = 0  # epochs started (DistributedSampler.set_epoch)
    empty_in_a_row: int = 0  # batches in a row in which nothing decoded
    fixed: tuple[torch.Tensor, torch.Tensor] | None = None  # the compute phase's batch
    # live loader iterators for shutdown() (weak: collecting an abandoned one stops its workers)
    _iters: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)

    def batches(self) -> Iterator:  # endless: a phase may need several epochs
        if self.loader is None:  # device_synthetic: the fixed device batch, zero data cost
            yield from itertools.repeat(self.device_batch())
        while True:
            sampler = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):  # DistributedSampler: a new order each epoch
                sampler.set_epoch(self.epoch)
            self.epoch += 1
            it = iter(self.loader)
            self._iters.add(it)
            yield from it

    def to_device(self, item, after_decode: Callable[[], None] | None = None):
        """A loader's `(batch, skipped)` on the device (None: nothing decoded)."""
        if self.side is None:
            return item
        batch, skipped = item
        self.skipped += skipped
        if batch is None:
            return None
        if self.side.decode is not None:
            x, y = self._decode(*batch, after_decode)
            if x is None:
                return None
            y = self.side.labels(y)
        else:
            batch = self.side.copy(batch)
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2
                    and isinstance(batch[0], torch.Tensor)):
                return batch  # the team's own batch: as its collate made it
            x, y = batch
        return self.side.finish(x), y

    def _decode(self, jpegs: JpegBatch, y: torch.Tensor, after_decode=None):
        """nvJPEG decode; images it refuses are refilled or fail the run (dataset.on_corrupt)."""
        x, failed = self.side.decode(jpegs.blobs(), after_decode)
        why = "the device JPEG decoder refused it"
        if failed and self.on_corrupt == "fail":
            raise datasets.corrupt(jpegs.names[failed[0]], why)
        self.skipped += len(failed)
        if x is None:
            self.empty_in_a_row += 1
            tried = self.empty_in_a_row * len(jpegs)
            if tried >= datasets.MAX_SUBSTITUTES:
                raise datasets.nothing_decodes(tried, jpegs.names[0], why)
            return None, None
        self.empty_in_a_row = 0
        return refill(x, y, failed) if failed else (x, y)

    def device_batch(self):  # the compute phase's: one real batch, kept on the device
        if self.fixed is None:
            self.fixed = next(m for m in map(self.to_device, self.batches()) if m is not None)
        return self.fixed

    def _live_iters(self) -> list:
        persistent = getattr(self.loader, "_iterator", None)
        return [*self._iters, *([persistent] if persistent is not None else [])]

    def worker_pids(self) -> set[int]:  # not other children (torch.compile's workers)
        return {w.pid for it in self._live_iters() for w in getattr(it, "_workers", ())
                if w.pid is not None}

    def worker_tids(self) -> set[int]:  # loader.worker_type=thread
        return getattr(self.loader, "worker_tids", set)()

    def shutdown(self) -> None:
        if isinstance(self.loader, ThreadLoader):
            return self.loader.shutdown()
        for it in self._live_iters():
            getattr(it, "_shutdown_workers", lambda: None)()


def _set_threads(threads: int, worker_id: int) -> None:
    torch.set_num_threads(threads)


def loader_settings(ld: Loader, device: str) -> dict:
    """DataLoader keyword arguments (batch size and sampling aside)."""
    kwargs: dict = dict(num_workers=ld.num_workers, pin_memory=ld.pin_memory and device == "cuda")
    if ld.num_workers == 0:  # the DataLoader rejects the worker-only options without workers
        return kwargs
    if not ld.in_order and ld.worker_type == "process":
        if "in_order" not in inspect.signature(DataLoader.__init__).parameters:  # torch < 2.6
            raise ConfigError("loader.in_order", False, f"true with process workers on torch "
                              f"{torch.__version__} (its DataLoader has no in_order before 2.6), "
                              "or loader.worker_type=thread")
        kwargs["in_order"] = False
    kwargs.update(prefetch_factor=ld.prefetch_factor, persistent_workers=ld.persistent_workers,
                  multiprocessing_context=ld.multiprocessing_context)
    if ld.worker_threads != 1:
        # torch gives each worker one thread already; a module-level partial pickles for spawn
        kwargs["worker_init_fn"] = functools.partial(_set_threads, ld.worker_threads)
    return kwargs


def _build_dataset(s: Settings, src: int, cpu_tf, raw: bool, info: dict) -> Dataset:
    dset = s.dataset
    kind, ncls, seed = dset.name, dset.num_classes, s.bench.seed
    if kind == "synthetic":
        return datasets.synthetic(dset.num_samples, src, ncls, cpu_tf, seed)
    if kind == "custom":  # the team's own Dataset class (gpubench.parts.custom_data)
        return custom_data.build(s, cpu_tf, info)
    if kind == "fake_jpeg":
        t0 = time.perf_counter()
        blobs = datasets.encode_jpeg_pool(dset.num_samples, src, dset.jpeg_quality, seed)
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, ncls, (len(blobs),), generator=g).tolist()
        info.update(jpeg_pool_seconds=time.perf_counter() - t0,
                    jpeg_mean_bytes=sum(map(len, blobs)) / len(blobs))
        return datasets.ImageFiles(list(zip(blobs, labels, strict=True)), cpu_tf,
                                   dset.on_corrupt, raw=raw)
    root = Path(os.path.expanduser(str(dset.root)))
    if kind == "imagefolder":
        samples, classes = datasets.scan_imagefolder(root)
        settings.check_found_classes(s, len(classes), f"class folders in {root}")
        info.update(files=len(samples), classes=len(classes), root=str(root),
                    mean_file_bytes=datasets.mean_file_bytes([p for p, _ in samples]))
        return datasets.ImageFiles(samples, cpu_tf, dset.on_corrupt, raw=raw)
    images, labels, classes = datasets.read_cifar10(root)  # cifar10: the Enum admits nothing else
    settings.check_found_classes(s, max(len(classes), int(labels.max()) + 1),
                                 f"CIFAR-10 labels in {root}")
    info.update(samples=len(labels), classes=len(classes), root=str(root))
    return TensorImages(images, labels, cpu_tf)


def _host_dataset(s: Settings, loader_kw: dict, info: dict) -> tuple[Dataset, int]:
    """The loader's dataset, and the samples preload skipped as corrupt."""
    dset = s.dataset
    src = datasets.source_size(dset.image_size)
    on_device_aug = dset.augment_on == "device"
    fixed_tf, train_tf = cpu_fixed_size(src), cpu_train_transform(dset.image_size)
    ds = _build_dataset(s, src, fixed_tf if (on_device_aug or dset.preload) else train_tf,
                        dset.decode_on == "device", info)
    skipped = 0
    if dset.preload:
        images, labels, secs, skipped = preload(ds, src, loader_kw["num_workers"],
                                                loader_kw.get("multiprocessing_context"),
                                                s.loader.worker_type == "thread")
        info.update(preload_seconds=secs, preload_bytes=images.numel(), preload_skipped=skipped)
        ds = TensorImages(images, labels, fixed_tf if on_device_aug else train_tf)
    if dset.name in datasets.IN_MEMORY_POOLS:
        ds = Cycled(ds, max(len(ds), datasets.CYCLED_EPOCH))
    settings.check_batch_fits(s, len(ds))  # a resource check: the length is known only here
    return ds, skipped


def own_samples(s: Settings) -> bool:
    """step=custom on dataset=custom (the keys acting on (image, label) samples refused)."""
    d = s.dataset
    if not (s.step.name == "custom" and d.name == "custom"):
        return False
    tf = d.transform
    for key, value, on in (("dataset.transform", settings.plain(tf), settings.node_set(tf)),
                           ("dataset.preload", True, d.preload),
                           ("dataset.augment_on", "device", d.augment_on == "device"),
                           ("dataset.decode_on", "device", d.decode_on == "device")):
        if on:
            raise ConfigError(key, value, "its default with step=custom on dataset=custom: "
                              "your Dataset's samples go to your collate and loss as they are")
    return True


def _data_loader(s: Settings, ds: Dataset, loader_kw: dict, shard: tuple[int, int] | None,
                 collate) -> DataLoader | ThreadLoader:
    ld, seed = s.loader, s.bench.seed
    g = torch.Generator().manual_seed(seed)  # the shuffle's and each worker process's seeds
    sampler: torch.utils.data.Sampler = torch.utils.data.RandomSampler(ds, generator=g)
    if shard is not None and shard[1] > 1:
        sampler = DistributedSampler(ds, num_replicas=shard[1], rank=shard[0], shuffle=True,
                                     seed=seed, drop_last=True)
    if ld.worker_type == "thread" and loader_kw["num_workers"]:
        return ThreadLoader(ds, sampler, ld.batch_size, ld.drop_last, collate,
                            loader_kw["num_workers"], ld.prefetch_factor, ld.in_order,
                            loader_kw["pin_memory"])
    return DataLoader(ds, batch_size=ld.batch_size, sampler=sampler, drop_last=ld.drop_last,
                      collate_fn=collate, generator=g, **loader_kw)


def build_pipeline(s: Settings, shard: tuple[int, int] | None = None) -> Pipeline:
    """The data side of one run. `shard`: (rank, world) under torchrun, a DistributedSampler."""
    # a sweep asks for more workers than torch suggests on purpose; set before the preload's
    # loader and the run's, not once at import: a caller's catch_warnings block would drop it
    warnings.filterwarnings("ignore", r"This DataLoader will create \d+ worker processes",
                            UserWarning)  # an identical filter replaces the one before it
    dset, device, bs = s.dataset, s.device, s.loader.batch_size
    info: dict = {"dataset": dset.name}
    if dset.name == "device_synthetic":  # one random batch made on the device
        g = torch.Generator().manual_seed(s.bench.seed)
        x = torch.randn((bs, 3, dset.image_size, dset.image_size), generator=g).to(device)
        y = torch.randint(0, dset.num_classes, (bs,), generator=g).to(device)
        fmt = torch.channels_last if s.channels_last else torch.contiguous_format
        return Pipeline(None, None, info, fixed=(x.contiguous(memory_format=fmt), y))
    own = own_samples(s)  # refuses gpubench's image handling on the team's own samples
    loader_kw = loader_settings(s.loader, device)
    decode = dset.decode_on == "device"
    if decode:
        # nvJPEG stages the JPEG bytes through its own pinned buffers: pinning them here would
        # cost a page-locked copy for nothing (DeviceSide.labels pins the labels)
        loader_kw["pin_memory"] = False
    ds, skipped = _host_dataset(s, loader_kw, info)
    augment = dset.augment_on == "device" or decode
    decoder = DeviceDecode(datasets.source_size(dset.image_size), device) if decode else None
    side = DeviceSide(device, loader_kw["pin_memory"], s.channels_last, decoder,
                      DeviceAugment(dset.image_size, device, s.bench.seed) if augment else None)
    info.update(samples=len(ds.pool) if isinstance(ds, Cycled) else len(ds),
                num_workers=loader_kw["num_workers"],
                decode_on="device" if decode else "cpu", augment_on="device" if augment else "cpu",
                batches_per_epoch=len(ds) // bs if s.loader.drop_last else -(-len(ds) // bs))
    collate = custom_data.collate(s, own) or collate_skipping
    return Pipeline(_data_loader(s, ds, loader_kw, shard, collate), side, info,
                    on_corrupt=dset.on_corrupt, skipped=skipped)
