"""Running under torchrun: one process per GPU, DistributedDataParallel, a sharded loader.

gpubench schedules nothing itself: `torchrun --nproc_per_node=N -m gpubench ...` starts the
processes and sets RANK / WORLD_SIZE / LOCAL_RANK; each process measures its own windows,
opened together (a barrier), and the run's throughput is all images over the slowest rank's
window. Only rank 0 writes results.json, prints and logs to MLflow. Without torchrun
(WORLD_SIZE unset or 1) every function here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def gather(self, value: float) -> list[float]:
        """The value of every rank, in rank order (the same list on all ranks)."""
        if not self.enabled:
            return [value]
        out: list = [None] * self.world
        tdist.all_gather_object(out, value)
        return out

    def wrap(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.local_rank] if device == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def close(self) -> None:
        if self.owns_group and tdist.is_initialized():
            tdist.destroy_process_group()


def from_env(device: str) -> Dist:
    """Join the process group torchrun set up the environment for (NCCL on GPUs, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        # from here on "cuda" means this rank's GPU for every allocation and NVML lookup
        torch.cuda.set_device(local)
    owns = not tdist.is_initialized()
    if owns:
        tdist.init_process_group("nccl" if device == "cuda" else "gloo")
    return Dist(rank, world, local, owns)
