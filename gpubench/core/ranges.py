"""Hydra's `range(start, stop, step)`: the end is excluded, as in Python. The config's range
checks and the search space both need its last point; it is computed here only."""

from __future__ import annotations

import math


def range_last(start: float, stop: float, step: float) -> float | None:
    """The last value `range(start, stop, step)` yields (stop excluded), None when the range is
    empty or its step is 0."""
    if not step:
        return None
    n = math.ceil((stop - start) / step)
    return start + (n - 1) * step if n > 0 else None
