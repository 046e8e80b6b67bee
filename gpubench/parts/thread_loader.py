"""loader.worker_type=thread: the run's Dataset, sampler and collate read by `loader.num_workers`
threads of the main process, through torchdata.nodes, where torch's DataLoader starts processes.

A worker makes whole batches, as a DataLoader worker does: the sampler's indices are cut into
batches (Batcher), and each thread reads its batch's samples and collates them
(ParallelMapper(method="thread")); a pinning thread follows on CUDA (PinMemory), then a queue
of ready batches (Prefetcher). The batches held ahead are the DataLoader's,
core.pipe.batches_in_flight: `num_workers` being made (the mapper's max_concurrent) and
`num_workers x (prefetch_factor - 1)` ready, so the runner's re-warm drains them alike.

What threads change: no process to start or fork (start-up), no copy of the batch between
processes, one address space (no per-worker RSS); and the Python parts of `__getitem__` share
one interpreter lock, so a pure-Python transform scales worse than with processes, while PIL's
decode and torch's ops release it. torchdata's worker threads each run one torch thread
(torchdata/nodes/_apply_udf.py calls torch.set_num_threads(1) in each): an OpenMP setting of
the calling thread, so the training thread keeps its own (ATen/ParallelOpenMP.cpp:
get_num_threads returns omp_get_max_threads(), a per-thread value).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from gpubench.config.errors import ConfigError
from gpubench.core.pipe import batches_in_flight


def nodes():
    """torchdata.nodes, or one line naming loader.worker_type where it does not import (not
    installed, or a torchdata that needs a newer torch than this one)."""
    try:
        import torchdata.nodes as tn
    except Exception as e:
        cause = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError("loader.worker_type", "thread", f"process here: thread workers need "
                          f"torchdata.nodes (pip install torchdata) with torch "
                          f"{torch.__version__} ({cause})") from e
    return tn


class ThreadLoader:
    """Batches from `dataset` in `sampler`'s order (with `in_order`), one epoch per iter(), as a
    DataLoader gives them; `workers` threads (at least 1), `prefetch` batches each ahead."""

    def __init__(self, dataset: Dataset, sampler: Sampler, batch_size: int, drop_last: bool,
                 collate: Callable[[list], Any], workers: int, prefetch: int | None,
                 in_order: bool = True, pin: bool = False):
        tn = nodes()
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

    def _batch(self, indices: list[int]):
        """A worker's job: one batch, read and collated in the worker thread."""
        self._tids.add(threading.get_native_id())
        return self.collate([self.dataset[i] for i in indices])

    def __iter__(self) -> Iterator:
        self._tids.clear()  # a new epoch starts new threads
        return iter(self.loader)

    def worker_tids(self) -> set[int]:
        """The native ids of the threads that made this epoch's batches (the loader's share of
        the process's CPU, read per thread: /proc/self/task/<tid>)."""
        return set(self._tids)

    def shutdown(self) -> None:
        """Stop every thread now, sources first (a stopped source ends the thread reading it).
        torchdata 0.11 has no public close: each node's iterator stops its threads when
        collected (torchdata/nodes/map.py: _ParallelMapperIter._shutdown and
        _SingleThreadedMapper._shutdown, called from __del__); this calls the same."""
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
