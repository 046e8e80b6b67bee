"""Hydra's `range(start, stop, step)` excludes its end, as Python's: its last point, for the
config's range checks and the search space."""

from __future__ import annotations

import math

# what a range must be (the config's checks and the search space say it alike)
NOT_EMPTY = ("a range that is not empty: range(a,b[,step]) with a < b for a positive step (b "
             "excluded, as in Python), a > b for a negative one")


def range_last(start: float, stop: float, step: float) -> float | None:
    """None when empty or its step is 0."""
    if not step:
        return None
    n = math.ceil((stop - start) / step)
    return start + (n - 1) * step if n > 0 else None
