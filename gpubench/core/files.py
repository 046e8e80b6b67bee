"""Small file helpers shared by the runner, tracking, the sweeper and the report. No torch
import here: tracking and the report load without it.

`write_json` and `write_text` are how gpubench writes a file: atomically, and masked
(gpubench.core.secrets.mask_secrets): a tracking URI or a storage URL may carry a password, and
no file gpubench writes holds one."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from enum import Enum
from pathlib import Path
from typing import Any

from gpubench.core.secrets import mask_secrets


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


class WriteError(OSError):
    """A file that could not be written: one line naming the path, the reason and the free space
    where it was going (a full disk is the usual cause)."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def free_space(path: Path) -> str:
    """Free space on the filesystem holding `path`, for error lines."""
    for p in (Path(path), *Path(path).parents):
        try:
            return f"{shutil.disk_usage(p).free / 2**20:.1f} MiB free on its filesystem"
        except OSError:
            continue
    return "free space unknown"


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON (NaN and inf as null), written as `write_text` writes."""
    write_text(path, json.dumps(finite(data), indent=2, default=_default, allow_nan=False))


def write_text(path: Path, text: str) -> None:
    """Write-then-rename, masked: a kill mid-write leaves the previous complete file, never half
    of one, and no password reaches the disk.

    The temporary file is unique to this process (two writers never share one) and is removed
    when the write fails (a full disk, a file size limit), so no `.tmp` is ever left behind;
    the error is a WriteError naming the path and the free space."""
    path = Path(path)
    text = mask_secrets(text)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            # on disk before the rename: after a power loss the file is the old or the new one
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(e.errno, f"{e.strerror or e} ({free_space(path.parent)})", str(path)) from e


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
