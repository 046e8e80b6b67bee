"""loader.worker_type=thread: `loader.num_workers` threads of this process make whole batches
through torchdata.nodes (Batcher, ParallelMapper, PinMemory on CUDA, Prefetcher), as many held
ahead as a DataLoader's. Each runs one torch thread (torchdata/nodes/_apply_udf.py:
torch.set_num_threads(1), a per-thread OpenMP setting): the training thread keeps its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from gpubench.config.errors import ConfigError
from gpubench.core.pipe import batches_in_flight
from gpubench.parts.targets import cause


class ThreadLoader:
    """Batches from `dataset` in `sampler`'s order (with `in_order`), one epoch per iter(), as a
    DataLoader gives them; `workers` threads (at least 1), `prefetch` batches each ahead."""

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
        self.root = node
        self.loader = tn.Loader(node)

    def _batch(self, indices: list[int]):  # a worker's job: one batch, read and collated
        self._tids.add(threading.get_native_id())
        return self.collate([self.dataset[i] for i in indices])

    def __iter__(self) -> Iterator:
        self._tids.clear()  # a new epoch starts new threads
        return iter(self.loader)

    def worker_tids(self) -> set[int]:  # the threads that made this epoch's batches
        return set(self._tids)

    def shutdown(self) -> None:
        """Stop every thread, sources first. torchdata 0.11 has no public close: this calls what
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
