"""sweep.json: what a sweep did (keys: `_TYPES`), written after every job. `study` names one
search across its workers; `worker` is its writer's host:pid. Last writer wins: one sweep dir
per worker (docs/scaling.md)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from gpubench.core.files import read_json, write_json
from gpubench.core.record import find_runs, load
from gpubench.core.stats import count
from gpubench.core.uris import SQLITE_PREFIX, sqlite_path

MANIFEST = "sweep.json"
PIPES_FILE = "pipes.json"  # sweep=pipes: the path its search took (gpubench.search.pipes)
log = logging.getLogger("gpubench.sweep")


def absolute_storage(url: str | None) -> str | None:
    """A relative sqlite URL made absolute (its folder created): found from any working dir."""
    path = sqlite_path(url) if url else None
    if path is None or path.is_absolute():
        return url
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLITE_PREFIX + str(path)


# each key's type in the sweep.json gpubench writes (null allowed); `jobs` is always there
_TYPES = {"mode": str, "started_at": str, "worker": str, "study_name": str, "storage": str,
          "study": str, "pipes_study": str, "n_trials": int, "measured_trials": int,
          "jobs": list, "studies": list, "best": dict, "max_batch": dict, "pipes": dict,
          "aborted": str}
# what a damaged sweep.json still names: the study its trials are in
_SALVAGED = re.compile(r'"(mode|study_name|storage|study)":\s*("(?:[^"\\]|\\.)*")')


def problem(sweep_dir: Path) -> str | None:
    """Why a sweep.json is not one gpubench wrote (cut short, edited by hand), or None (it is,
    or there is none): every reader checks it, so a file of another shape is never half read."""
    path = Path(sweep_dir) / MANIFEST
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        return "not valid JSON" if data is None else "not a JSON object"
    for k, t in _TYPES.items():
        if data.get(k) is not None and not isinstance(data[k], t):
            return f"{k}: not a {t.__name__}"
    if not isinstance(data.get("jobs"), list):
        return "no list of jobs"
    if not all(isinstance(j, dict) and isinstance(j.get("dir"), str)
               and isinstance(j.get("num"), int) for j in data["jobs"]):
        return "a job without its dir and num"
    if not all(isinstance(n, str) for n in data.get("studies") or []):
        return "studies: not a list of names"
    return None


def read(sweep_dir: Path) -> dict:
    """sweep.json; of a damaged one, the study it names (from what is left of its text)."""
    path = Path(sweep_dir) / MANIFEST
    if problem(sweep_dir) is None:
        return read_json(path) or {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    # the first of each wins (the top level comes first)
    return {k: json.loads(v) for k, v in reversed(_SALVAGED.findall(text))}


def reserve_job_dir(sweep_dir: Path, n: int = 1) -> int:
    """The first of n consecutive free job numbers, their folders created after those there (a
    resume never overwrites a job). mkdir is atomic, so two processes never get one number (the
    loser tries again; an empty folder it made may stay behind)."""
    while True:
        nums = [int(p.name) for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        first = max(nums, default=-1) + 1
        with contextlib.suppress(FileExistsError):
            for i in range(n):
                (sweep_dir / str(first + i)).mkdir()
            return first


class Manifest:
    """sweep.json of one sweep dir; earlier invocations' jobs are kept (resume)."""

    def __init__(self, sweep_dir: Path, mode: str) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.path = self.sweep_dir / MANIFEST
        self.jobs: list[dict] = list(read(self.sweep_dir).get("jobs", []))
        self.data: dict[str, Any] = {"mode": mode, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                     "worker": f"{socket.gethostname()}:{os.getpid()}"}
        why = problem(self.sweep_dir)
        self.recovered = why is not None
        if not self.recovered:
            return
        # damaged: kept as sweep.json.damaged[.n], its jobs read back (`from_study`: trials)
        copy, n = self.path.with_name(MANIFEST + ".damaged"), 1
        while copy.exists():
            copy, n = self.path.with_name(f"{MANIFEST}.damaged.{n}"), n + 1
        shutil.copyfile(self.path, copy)
        for d in find_runs(self.sweep_dir):
            if d.parent == self.sweep_dir and d.name.isdigit():
                rec = load(d)  # None when its results.json is damaged too: the study tells
                self.jobs.append({"num": int(d.name), "dir": str(d),
                                  "rung": rec.rung.value if rec else None,
                                  "status": str(rec.status) if rec else None})
        log.warning("%s is damaged (%s): kept as %s; %s read back from their folders",
                    self.path, why, copy.name, count(len(self.jobs), "job"))

    def from_study(self, study) -> None:
        """The trial of each job read back after damage (the folders the study's trials name)."""
        if not self.recovered:
            return
        by_dir = {str(t.user_attrs[k]): t for t in study.get_trials(deepcopy=False)
                  for k in ("dir", "screen_dir") if t.user_attrs.get(k)}
        matched = [job for job in self.jobs if job["dir"] in by_dir]
        for job in matched:
            t = by_dir[job["dir"]]
            job |= {"trial": t.number, "rung": job["rung"] or t.user_attrs.get("rung"),
                    "status": job["status"] or t.user_attrs.get("status")}
        log.warning("%s: %d of %s matched to their trials in study %s", self.path,
                    len(matched), count(len(self.jobs), "job"), study.study_name)
        self.save()

    def update(self, **kw: Any) -> None:
        self.data.update(kw)
        self.save()

    def save(self) -> None:
        write_json(self.path, {**self.data, "jobs": self.jobs})
