"""The verdict check: two runs built so that their narrowest pipe is known, measured by gpubench
end to end (`measure_run`, all three phases), whose verdict must name it.

- data: the user's model, batch and precision reading `PacedImages` (each sample `delay_s` late)
  through `dataset=custom`, with one loader worker prefetching one batch (none where the user's
  loader has none). A batch takes DATA_STALL x the plain step: the loader delivers a quarter of
  what compute takes, data-bound. One worker delivers evenly (several finish together, in
  bursts a short window may or may not catch), so the drain before each window costs 2 batches.
- step: the user's config with `fault.stall_every=1`: every compute/e2e step sleeps STEP_STALL x
  the slower of the plain step and batch (run/runner.py, Faults): compute-bound.

Without loader workers e2e is the sum of loading and stepping, and tracks the narrower pipe
above the rule's 85% only when that one is much the longer: both stalls are SERIAL_STALL x then.
The margins are wide on purpose: a shared machine that slows one window of compute 3x leaves
the data case's loader/compute ratio under the rule's 0.9 line.

Judged is the rule (analysis.verdict.classify) on the run's figures, not the run's own verdict:
its validity checks call any run of fewer than 6 windows inconclusive, and these keep to 3 (their
stalls are what they cost). A run those checks call disturbed whose figures miss the answer is
not judged (rules.verdict_case).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset

from gpubench.analysis.verdict import classify
from gpubench.check.rules import Judgement, skipped, verdict_case
from gpubench.config.schema import FaultConfig
from gpubench.config.settings import Settings
from gpubench.core.pipe import batches_in_flight
from gpubench.core.record import PHASE_NAMES, Flaw, RunRecord, Status
from gpubench.run.runner import measure_run
from gpubench.run.summary import rule_figures

DATA_STALL = 4.0
STEP_STALL = 2.0
SERIAL_STALL = 20.0
# the least stall: below it a sleep's overshoot and the loop's fixed costs (a tiny model's step
# takes a millisecond) are no longer small beside it
MIN_STALL_S = 0.05
WINDOWS = 3


class PacedImages(Dataset):
    """Random uint8 CHW images held in memory, each sample returned `delay_s` late: a data
    source of known speed. Long (`length`) so no epoch ends inside a window."""

    def __init__(self, size: int, delay_s: float, classes: int = 1, length: int = 100_000,
                 pool: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (pool, 3, size, size), dtype=torch.uint8, generator=g)
        self.delay_s, self.classes, self.length = delay_s, classes, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)  # the slow source this case is built on
        return self.images[i % len(self.images)], i % self.classes


def _short(cfg: DictConfig, workers: int, prefetch: int | None) -> DictConfig:
    """The user's config measured in WINDOWS short windows, with none of the user's faults:
    windows of a multiple of the workers (they deliver in bursts of one batch each), the first
    opened after as many steps as gpubench re-warms the later ones with (the batches in flight
    drained, and one more)."""
    out = copy.deepcopy(cfg)
    per_window = max(2, workers)
    warm = max(2, batches_in_flight(workers, prefetch) + 1)
    OmegaConf.update(out, "fault", OmegaConf.structured(FaultConfig()), merge=False)
    for key, value in (("bench.phases", list(PHASE_NAMES)), ("bench.repeats", WINDOWS),
                       ("bench.steps", WINDOWS * per_window), ("bench.warmup_steps", warm),
                       ("bench.warmup_max_steps", warm), ("bench.flops", False),
                       ("bench.profile", False)):
        OmegaConf.update(out, key, value)
    return out


def data_case(cfg: DictConfig, s: Settings, step_s: float) -> tuple[DictConfig, float]:
    """(config, seconds each batch is late) of the data-bound case."""
    workers = min(1, s.loader.num_workers)
    prefetch = 1 if workers else None
    late = max(MIN_STALL_S, (DATA_STALL if workers else SERIAL_STALL) * step_s)
    out = _short(cfg, workers, prefetch)
    if workers:
        OmegaConf.update(out, "loader.num_workers", workers)
        OmegaConf.update(out, "loader.prefetch_factor", prefetch)
    delay = late / s.loader.batch_size  # the worker (or the main process) makes whole batches
    dataset = {"name": "custom", "_target_": f"{__name__}.PacedImages",
               "kwargs": {"size": s.dataset.image_size, "delay_s": delay,
                          "classes": s.dataset.num_classes, "seed": s.bench.seed},
               "transform": {}, "collate": {}, "root": None, "preload": False,
               "augment_on": "cpu", "decode_on": "cpu", "image_size": s.dataset.image_size}
    for key, value in dataset.items():
        OmegaConf.update(out, f"dataset.{key}", value, merge=False)
    return out, late


def step_case(cfg: DictConfig, s: Settings, step_s: float, batch_s: float | None
              ) -> tuple[DictConfig, float]:
    """(config, seconds each step stalls) of the compute-bound case."""
    ld = s.loader
    stall = max(MIN_STALL_S,
                (STEP_STALL if ld.num_workers else SERIAL_STALL) * max(step_s, batch_s or 0.0))
    out = _short(cfg, ld.num_workers, ld.prefetch_factor)
    OmegaConf.update(out, "fault.stall_every", 1)
    OmegaConf.update(out, "fault.stall_s", stall)
    return out, stall


# the validity reasons these short runs always give by design (3 windows give a 75% interval;
# windows shorter than the batches in flight)
BY_DESIGN = (Flaw.few_windows, Flaw.queue)


def disturbed(rec: RunRecord) -> list[str]:
    """The run's validity reasons (run/summary.py) less those its short design gives: what is
    left says something disturbed it (other processes, interrupted steps, throttling)."""
    return [r.text for r in rec.noise_reasons if r.kind not in BY_DESIGN]


def _run(name: str, expected: str, case: DictConfig, out: Path, what: str) -> Judgement:
    rec = measure_run(case, out / name).record
    if rec.status is not Status.ok:
        return Judgement(name, False, {}, f"{what}: the run ended {rec.status}: {rec.error}")
    v = classify(**rule_figures(rec))  # as the run's own verdict reads them, less the checks
    figures = {n: rec.phase_figure(n)[0] for n in PHASE_NAMES}
    if v.ratio is not None:
        figures.update(ratio=v.ratio.value, ratio_lo=v.ratio.lo, ratio_hi=v.ratio.hi)
    answer = v.bottleneck if v.leaning is None else f"{v.bottleneck} (leaning {v.leaning})"
    j = verdict_case(name, expected, answer, v.reason, figures, disturbed(rec))
    return Judgement(j.name, j.passed, j.figures, f"{what}: {j.detail}")


def verdict_checks(cfg: DictConfig, s: Settings, out: Path, step_s: float | None,
                   batch_s: float | None) -> list[Judgement]:
    """The two cases, sized from the plain loops' step and batch times (seconds)."""
    if step_s is None or not math.isfinite(step_s):
        why = "the compute check measured no plain step time to size the stalls from"
        return [skipped("data-stall", why), skipped("step-stall", why)]
    data, late = data_case(cfg, s, step_s)
    step, stall = step_case(cfg, s, step_s, batch_s)
    return [_run("data-stall", "data", data, out, f"each batch {late * 1e3:.0f} ms late"),
            _run("step-stall", "compute", step, out, f"each step stalled {stall * 1e3:.0f} ms")]
