"""Arithmetic of the input pipe, written once: how many batches the loader holds ready, and the
most a training step can reach when the loader's device work runs on its stream."""

from __future__ import annotations

# torch.utils.data.DataLoader's prefetch_factor when it is left unset (None) with workers
TORCH_PREFETCH_FACTOR = 2


def batches_in_flight(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches the loader's workers hold made ahead of the consumer: each worker prefetches
    `prefetch_factor` batches; with 0 workers the main process makes each batch when asked."""
    if not num_workers:
        return 0
    return num_workers * (prefetch_factor or TORCH_PREFETCH_FACTOR)


def serial_rate(rate: float, seconds_per_image: float) -> float:
    """Images/s of a stage running at `rate` when `seconds_per_image` more work runs one after
    the other with it (on the same stream): 1 / (1/rate + d)."""
    return 1.0 / (1.0 / rate + seconds_per_image)
