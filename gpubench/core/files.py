"""File helpers (no torch import): atomic, masked writes (`write_text`), never through a
symbolic link (`refuse_link`, `check_no_links`); locks (`try_lock`) and `retry`."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock, Timeout

from gpubench.core.secrets import mask_secrets

T = TypeVar("T")
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)  # permissions, a read-only mount


def json_safe(v: Any) -> Any:
    """NaN and inf are not JSON: stored as null (a figure not measured)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


class WriteError(OSError):
    """A file that could not be written: one line, the path, the reason and the free space."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def refusal(path: str | Path, e: OSError) -> str:
    why = e.strerror or type(e).__name__
    if e.errno in READ_ONLY:
        return f"{path} is read-only ({why.split(' (')[0]})"
    return f"cannot write {path} ({why})"


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(json_safe(data), indent=2, allow_nan=False,
                                default=lambda o: o.value if isinstance(o, Enum) else str(o)))


def write_text(path: str | Path, text: str) -> Path:
    """Write a file gpubench owns, masked, then rename (a kill mid-write leaves the previous
    file); returns its path. A failed write (a full disk) removes the temporary: WriteError."""
    path = refuse_link(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a leftover (or a link) of this name
        with open(tmp, "x", encoding="utf-8") as f:  # "x": never through an existing file
            f.write(mask_secrets(text))
            f.flush()
            os.fsync(f.fileno())  # before the rename: after a power loss, the old file or the new
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(e.errno, f"{e.strerror or e} ({free_space(path.parent)})",
                         str(path)) from e
    return path


def free_space(path: Path) -> str:
    """Free space where `path` is: the first folder up the tree that answers."""
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            return f"{shutil.disk_usage(p).free / 2**20:.1f} MiB free on its filesystem"
    return "free space unknown"


def refuse_link(path: str | Path) -> Path:
    path = Path(path)
    if path.is_symlink():
        raise LinkError(errno.EEXIST, f"a symbolic link (to {os.readlink(path)}); gpubench does "
                        "not write through links: remove it", str(path))
    return path


def open_own(path: str | Path, mode: str = "w", **kw):
    """A file written in place (the GPU log, a picture): O_NOFOLLOW refuses a link put there
    after `refuse_link` looked (ELOOP)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    return open(os.open(refuse_link(path), flags, 0o644), mode, **kw)


def read_json(path: Path) -> dict | None:
    """None when missing or not (yet) valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def damaged(path: str | Path) -> bool:
    """There but not a JSON object (cut short by a crash, edited by hand)."""
    return Path(path).is_file() and not isinstance(read_json(path), dict)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'loader': {'batch_size': 8}} -> {'loader.batch_size': 8}; empty dicts stay as values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out |= flatten(v, key) if isinstance(v, dict) and v else {key: v}
    return out


class LinkError(OSError):
    """A path gpubench will not follow or write through: a folder it was given may hold links
    elsewhere (`traces -> /home/me/private`), and following them would upload or overwrite files
    nobody pointed it at. Readers keep to `inside`."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def inside(path: str | Path, root: str | Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except (ValueError, OSError, RuntimeError):  # outside, unreadable, or a link loop
        return False
    return True


def check_no_links(folder: str | Path, root: str | Path | None = None) -> Path:
    """`folder` (under `root`, default itself) made absolute, when reached without a link out
    of `root` and holding none; else LinkError naming the first offending path."""
    folder = Path(folder).absolute()
    root = folder if root is None else Path(root).absolute()
    q = root
    for part in folder.relative_to(root).parts:  # a component may be a link, if it stays inside
        q = q / part
        if q.is_symlink() and not inside(q, root):
            raise LinkError(errno.EXDEV, f"a symbolic link out of {root} (to {q.resolve()}); "
                            "gpubench writes only inside the folder it was given", str(q))
    for dirpath, dirnames, names in os.walk(folder):  # followlinks=False
        for n in sorted(dirnames + names):
            if (p := Path(dirpath) / n).is_symlink():
                raise LinkError(errno.EEXIST, f"a symbolic link (to {os.readlink(p)}) where "
                                "gpubench writes its own files; remove it, or write elsewhere",
                                str(p))
    return folder


# filelock's locks are fcntl.flock on POSIX: the kernel releases one when its holder ends (kill
# -9 too), so a dead holder never blocks. filelock 4.2.12 (_unix.py) opens with O_NOFOLLOW and
# without O_TRUNC: a link there is refused (ELOOP), a claimer that loses never empties the
# holder's note; a lock won on a file unlinked meanwhile is retried (_finalize_locked_fd).
def try_lock(path: str | Path, note: str = "") -> FileLock | None:
    """`path`'s lock, or None while another holds it; `note` (who holds it) written in."""
    def write_note(fd: int) -> None:
        os.ftruncate(fd, os.pwrite(fd, note.encode(), 0))

    lock = FileLock(refuse_link(path), thread_local=False, on_acquired=write_note)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return None
    return lock


def retry(fn: Callable[[], T], attempts: int, wait_s: float,
          errors: type[BaseException] | tuple[type[BaseException], ...] = Exception,
          sleep: Callable[[float], Any] = time.sleep) -> T:
    """`fn()`, `attempts` times in all while it raises `errors`, waiting wait_s, 2 wait_s, ...
    (another process creating the same database collides once)."""
    for n in range(1, attempts):
        try:
            return fn()
        except errors:
            sleep(wait_s * n)
    return fn()


def mask_files(paths) -> None:
    for p in map(Path, paths):
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if mask_secrets(text) != text:
            write_text(p, text)
