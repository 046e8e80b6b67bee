"""The largest batch size whose peak memory stays under memory.ceiling x (1 - memory.reserve):
`find_max_batch` searches any `fits(batch)`; `run_max_batch` measures each probe as a job."""

from __future__ import annotations

import logging
from collections import namedtuple
from collections.abc import Callable

from omegaconf import DictConfig

from gpubench.config.errors import ConfigError
from gpubench.core.record import Rung, RunRecord, Status
from gpubench.search.jobs import Jobs
from gpubench.search.space import SearchSpace

log = logging.getLogger("gpubench.sweep")
Probe = namedtuple("Probe", "batch_size fits")


def find_max_batch(fits: Callable[[int], bool], start: int, limit: int
                   ) -> tuple[int | None, list[Probe]]:
    """Largest batch size in [1, limit] for which `fits(b)` (None if even 1 misses), and the
    probes: double from `start` up to the first miss (or halve while it misses), then bisect."""
    if start < 1 or limit < 1:
        raise ValueError("start and limit must be >= 1")
    probes: list[Probe] = []
    lo, hi, b = 0, None, min(start, limit)  # lo fits (0: none yet), hi misses (None: none yet)
    while True:
        probes.append(Probe(b, bool(fits(b))))
        lo, hi = (b, hi) if probes[-1].fits else (lo, b)
        if hi is None and lo < limit:  # grow
            b = min(lo * 2, limit)
        elif hi is not None and lo == 0 and hi > 1:  # shrink
            b = hi // 2
        elif hi is not None and lo and hi - lo > 1:  # bisect
            b = (lo + hi) // 2
        else:
            return lo or None, probes


def start_batch(cfg: DictConfig, start: int | None) -> int:
    """The first probe: the configured start, else the run's own batch size (settings.sizes).
    Sizing only: the sweeper may run where the jobs' device is not (a login node)."""
    if start is not None:
        return int(start)
    from gpubench.config.settings import sizes

    return sizes(cfg)[2]


def run_max_batch(jobs: Jobs, space: SearchSpace, cfg: DictConfig, start: int | None,
                  limit: int, overrides: list[str]) -> dict:
    """Probe batch sizes as jobs; the result as max_batch.json stores it."""
    if space.params:
        raise ConfigError("hydra.sweeper.mode", "max_batch", "fixed overrides only: it searches "
                          "loader.batch_size itself (swept: "
                          f"{', '.join(p.name for p in space.params)})")
    from gpubench.config.schema import check_ranges

    # the threshold is made of these: checked against their ranges before any probe
    check_ranges(cfg, only=("memory.ceiling", "memory.reserve"))
    ceiling, reserve = float(cfg.memory.ceiling), float(cfg.memory.reserve)
    found: list[tuple[int, RunRecord]] = []

    def fits(b: int) -> bool:
        rec = jobs.launch([space.overrides({}, [*overrides, f"loader.batch_size={b}"])],
                          [{"rung": Rung.probe, "batch_size": b}])[0]
        found.append((b, rec))
        ok = rec.fits_under(reserve)
        mem = "?" if rec.peak_memory_fraction is None else f"{rec.peak_memory_fraction:.1%}"
        log.info("batch %d: %s, peak memory %s -> %s", b, rec.status, mem,
                 "fits" if ok else "does not fit")
        if rec.status.crashed:
            jobs.count_failure(f"probe batch {b}", rec)
        return ok

    best, _ = find_max_batch(fits, start_batch(cfg, start), int(limit))
    if best is None and set(jobs.outcomes) == {Status.refused}:
        jobs.check_measured()  # every probe refused as bad input: its line, not "none fits"
    return {"max_batch": best, "memory_ceiling": ceiling, "reserve": reserve,
            "threshold": ceiling * (1.0 - reserve), "limit_reached": best == int(limit),
            "probes": [{"batch_size": b, "fits": rec.fits_under(reserve),
                        "status": str(rec.status), "peak_memory_fraction": rec.peak_memory_fraction,
                        "dir": str(rec.dir)} for b, rec in found],
            # the last probe that read its memory (a refused one read none: "the device")
            "memory_of": next((rec.memory_of for _, rec in reversed(found)
                               if rec.memory_source is not None), "the device")}


def summary_lines(result: dict) -> list[str]:  # at the end of a max-batch search
    best, ceiling, reserve = result["max_batch"], result["memory_ceiling"], result["reserve"]
    if best is None:
        return ["max batch: none fits"]
    note = " (max_batch.limit reached)" if result["limit_reached"] else ""
    ups = [b for b in (2 ** i for i in range(2, 16)) if b < best][-3:] + [best]
    of = result.get("memory_of", "the device")
    return [f"max batch under {ceiling:.0%} x (1 - {reserve:.0%}) of {of}: {best}{note}",
            "use it as the upper bound of a search, e.g.  "
            f"'loader.batch_size=choice({','.join(map(str, ups))})'"]
