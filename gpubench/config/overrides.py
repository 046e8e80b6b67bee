"""Config values as Hydra override text (the sweeper's sampled values, the report's overrides)."""

from __future__ import annotations

from typing import Any


def format_value(v: Any) -> str:
    """A sampled Python value as Hydra override text."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)
