"""sweep.json: what a gpubench sweep did, written after every job so a crash loses nothing.

Keys: `mode` (optuna | max_batch), `started_at`, `worker` (host:pid of the process that writes
it), `study_name`, `storage` and `study` (the tag value that names one search across all its
workers: MLflow runs and reports group by it), `n_trials`, `jobs` (one entry per job: `num`,
`dir`, `trial`, `rung`, `status`), `best`, `max_batch`, `measured_trials`, `aborted`.

One sweep dir belongs to one worker at a time (Hydra's default dir has a per-second timestamp,
so workers started in the same second share it): job folders are reserved with an atomic mkdir,
so two processes never write into one job folder, while the manifest itself is last-writer-wins.
Give each worker its own `hydra.sweep.dir` (docs/scaling.md).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from gpubench.core.files import read_json, write_json
from gpubench.core.uris import SQLITE_PREFIX, sqlite_path

MANIFEST = "sweep.json"


def absolute_storage(url: str | None) -> str | None:
    """A relative sqlite URL made absolute (and its folder created), so the study is found again
    from the sweep manifest whatever the reader's working directory."""
    path = sqlite_path(url) if url else None
    if path is None or path.is_absolute():
        return url
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLITE_PREFIX + str(path)


def read(sweep_dir: Path) -> dict:
    return read_json(Path(sweep_dir) / MANIFEST) or {}


def reserve_job_dir(sweep_dir: Path) -> int:
    """The next free job number, its folder created here: numbers continue after the folders
    already there (a resumed sweep must not overwrite earlier jobs), and mkdir is atomic, so
    two processes sharing a sweep dir never get the same number."""
    while True:
        nums = [int(p.name) for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        n = max(nums, default=-1) + 1
        try:
            (sweep_dir / str(n)).mkdir()
            return n
        except FileExistsError:
            continue


class Manifest:
    """sweep.json of one sweep dir; earlier invocations' jobs are kept (resume)."""

    def __init__(self, sweep_dir: Path, mode: str) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.path = self.sweep_dir / MANIFEST
        self.jobs: list[dict] = list(read(self.sweep_dir).get("jobs", []))
        self.data: dict[str, Any] = {
            "mode": mode, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "worker": f"{socket.gethostname()}:{os.getpid()}",
        }

    def update(self, **kw: Any) -> None:
        self.data.update(kw)
        self.save()

    def add_job(self, num: int, out_dir: Path, status: str, **labels: Any) -> None:
        self.jobs.append({"num": num, "dir": str(out_dir), **labels, "status": status})

    def save(self) -> None:
        write_json(self.path, {**self.data, "jobs": self.jobs})
