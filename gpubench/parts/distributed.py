"""Under torchrun: one process per GPU, DDP, a sharded loader; only rank 0 writes, prints and logs
(without torchrun every method is a no-op). A failed rank must not leave the others in a
collective until NCCL's watchdog (10 minutes): it `announce`s its error in the process group's
store and runs no more collectives; a `watch` thread on every rank polls that key and ends the
process (its main thread may be blocked in C++); `agree` all-reduces a failed flag; a short
timeout is the last resort."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as tdist

from gpubench.config.errors import ConfigError
from gpubench.core.exits import ExitCode

log = logging.getLogger(__name__)

# Longer than any legitimate gap between two collectives (a slow rank's compile or cuDNN
# autotune), far shorter than NCCL's 10 minutes; GPUBENCH_DIST_TIMEOUT_S for longer compiles.
PROCESS_GROUP_TIMEOUT_S = 180.0
TIMEOUT_ENV = "GPUBENCH_DIST_TIMEOUT_S"
FAILED_KEY = "gpubench/failed"
ACK_KEY = "gpubench/failure_seen"
ACK_WAIT_S = 5.0
WATCH_EVERY_S = 0.25


def fault_hits(fault_rank: int | None, rank: int) -> bool:  # fault.rank null: every rank
    return fault_rank is None or int(fault_rank) == rank


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False
    device: str = "cpu"
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _watcher: threading.Thread | None = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def gather(self, value):  # every rank's value, in rank order, on all ranks
        if not self.enabled:
            return [value]
        out: list = [None] * self.world
        tdist.all_gather_object(out, value)
        return out

    def _reduce(self, value: int, op) -> int:
        """One integer all-reduced (NCCL: device tensors only, gloo host ones). On NCCL `.item()`
        waits for the work queued on the current stream: a device sync, only where unmeasured."""
        dev = torch.device("cuda", self.local_rank) if self.device == "cuda" else "cpu"
        t = torch.tensor([int(value)], dtype=torch.int64, device=dev)
        tdist.all_reduce(t, op=op)
        return int(t.item())

    def all_done(self, done: bool) -> bool:
        """Collective: True only when every rank says done (warm-up): a rank that stopped a step
        early would sit in `barrier()` while the others are in DDP's all-reduce."""
        return bool(self._reduce(done, tdist.ReduceOp.MIN) if self.enabled else done)

    def most(self, n: int) -> int:  # collective: the largest of the ranks' `n`
        return self._reduce(n, tdist.ReduceOp.MAX) if self.enabled else int(n)

    def agree(self, error: str | None) -> str | None:
        """Collective: None if no rank failed, else the first failed rank's "rank R: its error"."""
        if not self.enabled:
            return error
        if not self.most(error is not None):
            return None
        return next(f"rank {r}: {e}" for r, e in enumerate(self.gather(error)) if e is not None)

    def announce(self, status: str, error: str) -> None:
        """Tell the other ranks through the store that this rank failed, and wait (bounded) for
        them to record it: torchrun stops every worker once one exits with an error."""
        if not (self.enabled and tdist.is_initialized()):
            return
        self._stop.set()  # not ended by a peer's news meanwhile (all get Ctrl-C at once)
        try:
            store = tdist.distributed_c10d._get_default_store()
            store.set(FAILED_KEY, f"{status}|rank {self.rank}: {error}")
            acks = [f"{ACK_KEY}/{r}" for r in range(self.world) if r != self.rank]
            store.wait(acks, timedelta(seconds=ACK_WAIT_S))
        except Exception as e:  # a peer already gone, or the store's host
            log.debug("failure announced without every acknowledgement: %s", e)

    def watch(self, on_failure: Callable[[str, str], None]) -> None:
        """A thread ending this process when another rank announces a failure, after
        `on_failure(status, message)` has recorded it ("oom", "rank R: its error")."""
        if not self.enabled or self._watcher is not None:
            return
        store = tdist.distributed_c10d._get_default_store()

        def poll() -> None:
            while not self._stop.wait(WATCH_EVERY_S):
                try:
                    if not store.check([FAILED_KEY]):
                        continue
                    status, _, message = store.get(FAILED_KEY).decode().partition("|")
                except Exception:  # the store went away: the run is ending anyway
                    return
                if message.startswith(f"rank {self.rank}:") or self._stop.is_set():
                    return  # our own failure: the main thread is handling it
                log.error("another rank failed (%s): ending this rank", message)
                try:
                    on_failure(status, message)
                finally:
                    try:
                        store.set(f"{ACK_KEY}/{self.rank}", "1")
                    finally:
                        # the main thread sits in a collective that will never complete
                        os._exit(ExitCode.PEER_FAILED)

        self._watcher = threading.Thread(target=poll, name="gpubench-peers", daemon=True)
        self._watcher.start()

    def wrap(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.local_rank] if device == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2 * WATCH_EVERY_S + 1)
            self._watcher = None
        if self.owns_group and tdist.is_initialized():
            tdist.destroy_process_group()


def timeout_s() -> float:  # checked as a config key is (a raw ValueError named nothing)
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return PROCESS_GROUP_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise ConfigError(TIMEOUT_ENV, raw, "a number of seconds > 0")
    return value


def from_env(device: str) -> Dist:
    """Join torchrun's process group (NCCL on GPUs, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        # from here on "cuda" means this rank's GPU for every allocation and NVML lookup
        torch.cuda.set_device(local)
    owns = not tdist.is_initialized()
    if owns:
        # the timeout bounds every collective: gloo raises; NCCL's watchdog aborts and ends the
        # process (TORCH_NCCL_ASYNC_ERROR_HANDLING, on by default since torch 2.2)
        tdist.init_process_group("nccl" if device == "cuda" else "gloo",
                                 timeout=timedelta(seconds=timeout_s()))
    return Dist(rank, world, local, owns, device)
