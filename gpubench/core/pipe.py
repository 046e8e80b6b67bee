"""Arithmetic of the input pipe: the batches the loader holds ready, and the most a step can
reach when the loader's device work runs on its stream."""

from __future__ import annotations

from gpubench.core.stats import Est

# torch.utils.data.DataLoader's prefetch_factor when it is left unset (None) with workers
TORCH_PREFETCH_FACTOR = 2
# a loader window spans at least this many times the batches in flight: those made before it
# began then weigh a third of it at most (one window of 2 batches read 1,025,764 img/s)
QUEUE_WINDOWS = 3


def batches_in_flight(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches the workers hold made ahead (0 workers: the main process makes each when asked)."""
    return num_workers * (prefetch_factor or TORCH_PREFETCH_FACTOR) if num_workers else 0


def loader_window_steps(steps: int, num_workers: int, prefetch_factor: int | None) -> int:
    return max(steps, QUEUE_WINDOWS * batches_in_flight(num_workers, prefetch_factor))


def serial_rate(rate: float, seconds_per_image: float) -> float:
    """Images/s of a stage at `rate` plus `seconds_per_image` of serial work."""
    return 1.0 / (1.0 / rate + seconds_per_image)


def serial_bound(rate: Est, seconds_per_image: Est) -> Est:
    """serial_rate on intervals: its low end from the slower ends of both."""
    return Est(serial_rate(rate.value, seconds_per_image.value),
               serial_rate(rate.lo, seconds_per_image.hi), serial_rate(rate.hi, seconds_per_image.lo))
