"""Config values as Hydra override text (the sweeper's sampled values, the report's overrides)."""

from __future__ import annotations

from typing import Any


def format_value(v: Any) -> str:
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    return repr(v) if isinstance(v, float) else str(v)
