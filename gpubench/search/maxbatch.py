"""The largest batch size whose peak memory stays under memory.ceiling x (1 - memory.reserve).

`find_max_batch` is the search itself (doubling, then bisection) over any `fits(batch)`;
`run_max_batch` measures each probe as a short job and returns the result (sweep's max_batch.json);
the Hydra sweeper shows it. Nothing here prints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from gpubench.config.errors import ConfigError
from gpubench.core.record import Rung, RunRecord
from gpubench.search.jobs import Jobs
from gpubench.search.space import SearchSpace

log = logging.getLogger("gpubench.sweep")


@dataclass
class Probe:
    batch_size: int
    fits: bool


def find_max_batch(
    fits: Callable[[int], bool], start: int, limit: int
) -> tuple[int | None, list[Probe]]:
    """Largest batch size in [1, limit] for which `fits(b)`, assuming memory grows with batch
    size: double from `start` until the first batch that does not fit (or halve down if `start`
    already does not), then bisect between the last fit and the first miss. Returns the size
    (None if even 1 does not fit) and the probes in the order they ran."""
    if start < 1 or limit < 1:
        raise ValueError("start and limit must be >= 1")
    probes: list[Probe] = []

    def probe(b: int) -> bool:
        ok = bool(fits(b))
        probes.append(Probe(b, ok))
        return ok

    b = min(start, limit)
    lo, hi = (b, None) if probe(b) else (None, b)
    while lo is not None and hi is None:  # grow
        if lo >= limit:
            return lo, probes
        b = min(lo * 2, limit)
        lo, hi = (b, None) if probe(b) else (lo, b)
    while lo is None:  # shrink
        if hi <= 1:
            return None, probes
        b = hi // 2
        lo, hi = (b, hi) if probe(b) else (None, b)
    while hi - lo > 1:  # bisect: lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    return lo, probes


def start_batch(cfg: DictConfig, start: int | None) -> int:
    """The first probe: the configured start, else the run's own batch size as the runner
    sizes it (by device when null: gpubench.config.settings.sizes). Sizing only: the sweeper may run
    where the jobs' device is not (a login node without a GPU launching to GPU nodes), and
    each probe job applies every rule on its own machine."""
    if start is not None:
        return int(start)
    from gpubench.config.settings import sizes

    return sizes(cfg)[2]


def check_memory(cfg: DictConfig) -> tuple[float, float]:
    """(memory.ceiling, memory.reserve), checked against their ranges before any probe: the
    search's threshold is made of them."""
    from gpubench.config.schema import check_ranges

    check_ranges(cfg, only=("memory.ceiling", "memory.reserve"))
    return float(cfg.memory.ceiling), float(cfg.memory.reserve)


def run_max_batch(jobs: Jobs, space: SearchSpace, cfg: DictConfig, start: int | None,
                  limit: int, overrides: list[str]) -> dict:
    """Probe batch sizes as jobs; the result as max_batch.json stores it."""
    if space.params:
        raise ConfigError("hydra.sweeper.mode", "max_batch", "fixed overrides only: it searches "
                          "loader.batch_size itself (swept: "
                          f"{', '.join(p.name for p in space.params)})")
    ceiling, reserve = check_memory(cfg)
    first = start_batch(cfg, start)
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
            jobs.count_failure(f"probe batch {b}", rec.error)
        return ok

    best, _ = find_max_batch(fits, first, int(limit))
    return {
        "max_batch": best,
        "memory_ceiling": ceiling,
        "reserve": reserve,
        "threshold": ceiling * (1.0 - reserve),
        "limit_reached": best == int(limit),
        "probes": [
            {"batch_size": b, "fits": rec.fits_under(reserve), "status": str(rec.status),
             "peak_memory_fraction": rec.peak_memory_fraction, "dir": str(rec.dir)}
            for b, rec in found
        ],
    }


def summary_lines(result: dict) -> list[str]:
    """What a user reads at the end of a max-batch search."""
    best, ceiling, reserve = result["max_batch"], result["memory_ceiling"], result["reserve"]
    if best is None:
        return ["max batch: none fits"]
    note = " (max_batch.limit reached)" if result["limit_reached"] else ""
    ups = [b for b in (2 ** i for i in range(2, 16)) if b < best][-3:] + [best]
    return [f"max batch under {ceiling:.0%} x (1 - {reserve:.0%}) of device memory: {best}{note}",
            "use it as the upper bound of a search, e.g.  "
            f"'loader.batch_size=choice({','.join(map(str, ups))})'"]
