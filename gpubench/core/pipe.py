"""Arithmetic of the input pipe, written once: the batches the loader holds ready, and the most
a step can reach when the loader's device work runs on its stream."""

from __future__ import annotations

# torch.utils.data.DataLoader's prefetch_factor when it is left unset (None) with workers
TORCH_PREFETCH_FACTOR = 2
# a loader window spans at least this many times the batches in flight: batches made before it
# began, and the bursts workers deliver them in (they finish together), then weigh a third of
# it at most, where a window of fewer batches than are in flight can time the queue alone
# (gpubench.analysis.noise.queue_checks: one window of 2 batches read 1,025,764 img/s)
QUEUE_WINDOWS = 3


def batches_in_flight(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches the loader's workers hold made ahead of the consumer: each worker prefetches
    `prefetch_factor` batches; with 0 workers the main process makes each batch when asked."""
    if not num_workers:
        return 0
    return num_workers * (prefetch_factor or TORCH_PREFETCH_FACTOR)


def loader_window_steps(steps: int, num_workers: int, prefetch_factor: int | None) -> int:
    """`steps` (bench.steps' share of a window), or QUEUE_WINDOWS times the batches in flight
    when more: the window length gpubench chooses is never why a loader window timed the queue."""
    return max(steps, QUEUE_WINDOWS * batches_in_flight(num_workers, prefetch_factor))


def serial_rate(rate: float, seconds_per_image: float) -> float:
    """Images/s of a stage running at `rate` when `seconds_per_image` more work runs one after
    the other with it (on the same stream): 1 / (1/rate + d)."""
    return 1.0 / (1.0 / rate + seconds_per_image)
