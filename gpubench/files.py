"""Small file helpers shared by the runner, tracking, the sweeper and the report. No torch
import here: tracking and the report load without it."""

from __future__ import annotations

import json
import math
import os
from enum import Enum
from pathlib import Path
from typing import Any


def _default(o):
    return o.value if isinstance(o, Enum) else str(o)


def finite(v: Any) -> Any:
    """NaN and inf are not JSON: stored as null (a figure that could not be measured)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def write_json(path: Path, data: Any) -> None:
    """Write-then-rename: a kill mid-write leaves the previous complete file, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(data), indent=2, default=_default, allow_nan=False))
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """The file's JSON object, or None when it is missing or not (yet) valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'loader': {'batch_size': 8}} -> {'loader.batch_size': 8}; empty dicts stay as values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out
