"""The checks that run gpubench itself. compute and loader: each gpubench window alternates with
one of the plain loop on the same batch or DataLoader, so a machine's drift hits both. The verdict
check: two runs with a known narrowest pipe. data: `PacedImages` through at most one worker
(several deliver in bursts), each batch DATA_STALL x the plain step late; step: every step stalled
STEP_STALL x the slower of the two; SERIAL_STALL for both without workers (e2e is their sum).
Judged is the rule (classify): the run's own verdict calls runs under 6 windows inconclusive."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset

from gpubench.analysis.verdict import classify
from gpubench.check import plain
from gpubench.check.rules import Judgement, agree, skipped, verdict_case
from gpubench.config.schema import FaultConfig
from gpubench.config.settings import Settings
from gpubench.core.pipe import batches_in_flight
from gpubench.core.record import MIN_WINDOW_S, PHASE_NAMES, Flaw, RunRecord, Status
from gpubench.run.runner import Benchmark, measure_run
from gpubench.run.summary import rule_figures

DATA_STALL, STEP_STALL, SERIAL_STALL = 4.0, 2.0, 20.0
# below it a sleep's overshoot and the loop's costs (a tiny model's 1 ms step) are not small
MIN_STALL_S = 0.05
WINDOWS = 3
# validity reasons of the short design: 3 windows, shorter than the batches in flight
BY_DESIGN = (Flaw.few_windows, Flaw.queue)


def phase_config(cfg: DictConfig, phases: list[str], **bench) -> DictConfig:
    out = copy.deepcopy(cfg)
    for key, value in {"phases": phases, "flops": False, "profile": False, **bench}.items():
        OmegaConf.update(out, f"bench.{key}", value)
    return out


class Alternated(Benchmark):
    def __init__(self, cfg: DictConfig, out: Path, phase: str, **bench):
        super().__init__(phase_config(cfg, [phase], **bench), out)
        self.phase = phase
        self.plain: list[float] = []  # the plain loop's images/sec, window by window
        self._plain_step: plain.PlainStep | None = None

    def measure(self) -> None:  # replaces Benchmark.measure's loop
        self.build()
        for i in range(self.repeats):
            ws = self.run_phase(self.phase)
            self._settle(ws)
            work, warm = self._plain_work(i == 0)
            # as many steps as gpubench's window took (bench.min_window_s can lengthen it; a
            # window times one at least)
            images, seconds = plain.timed(work, ws.steps, self.device, warm)
            self.plain.append(images / seconds)
            if i + 1 < self.repeats:
                self._settle(ws)
        self.record.skipped_samples = self.pipe.skipped
        self._plain_step = None  # the plain model goes before the run's own release collects

    def _settle(self, ws) -> None:
        """Workers deliver in bursts: each window opens with every batch in flight made (waiting
        1.5 x that long), so a short one times no burst more or less."""
        ld = self.settings.loader
        if self.phase == "loader" and ld.num_workers and ws.steps:
            time.sleep(1.5 * batches_in_flight(ld.num_workers, ld.prefetch_factor)
                       * ws.seconds / ws.steps)

    def _plain_work(self, first: bool) -> tuple[Callable[[], int], int]:
        """The plain loop's work for one window, and its untimed steps."""
        if self.phase == "compute":
            if first:
                self._plain_step = plain.PlainStep(self.settings, *self.pipe.device_batch())
            # warmed as gpubench's window is, at least one step (the model sat idle meanwhile)
            return self._plain_step, max(1, self._window_steps("compute", first)[0])
        pipe, side = self.pipe, self.pipe.side
        # gpubench's live iterator: a second one would start more workers, or reset persistent
        fetch = self.functions["loader"][0]
        if side.decode is not None or side.augment is not None:
            # device-side decode/augment: the plain loop runs gpubench's own device work
            def move(batch) -> int:
                moved = pipe.to_device(batch)
                return 0 if moved is None else int(moved[1].shape[0])
        else:
            move = plain.plain_copy(self.device, side.pin, self.settings.channels_last)
        # drained as gpubench's later windows are: what the workers made meanwhile would flatter
        return (lambda: move(fetch())), self._window_steps("loader", False)[0]


def compare(cfg: DictConfig, out: Path, s: Settings, phase: str) -> Judgement:
    """gpubench's phase against the plain loop's. Loader windows last MIN_WINDOW_S on a CPU too:
    a 40 ms one timed the workers' bursts, not their rate (ratios 0.94 to 1.27)."""
    if phase == "loader" and s.dataset.name == "device_synthetic":
        return skipped("loader", "no DataLoader with dataset=device_synthetic")
    longer = phase == "loader" and s.bench.min_window_s < MIN_WINDOW_S
    bench = Alternated(cfg, out / phase, phase,
                       **({"min_window_s": MIN_WINDOW_S} if longer else {}))
    if (interrupted := bench.run()) is not None:
        raise interrupted
    rec = bench.record
    if rec.status is not Status.ok:
        return Judgement(phase, False, {}, f"the run ended {rec.status}: {rec.error}")
    return agree(phase, [w.images_per_sec for w in bench.windows.get(phase, [])], bench.plain)


class PacedImages(Dataset):
    """In-memory random uint8 CHW images, each `delay_s` late: a source of known speed."""

    def __init__(self, size: int, delay_s: float, classes: int = 1, length: int = 100_000,
                 pool: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (pool, 3, size, size), dtype=torch.uint8, generator=g)
        self.delay_s, self.classes, self.length = delay_s, classes, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)
        return self.images[i % len(self.images)], i % self.classes


def _short(cfg: DictConfig, workers: int, prefetch: int | None) -> DictConfig:
    """The user's config in WINDOWS windows of a multiple of the workers, without faults."""
    warm = max(2, batches_in_flight(workers, prefetch) + 1)
    out = phase_config(cfg, list(PHASE_NAMES), repeats=WINDOWS, steps=WINDOWS * max(2, workers),
                       warmup_steps=warm, warmup_max_steps=warm)
    OmegaConf.update(out, "fault", OmegaConf.structured(FaultConfig()), merge=False)
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


def disturbed(rec: RunRecord) -> list[str]:
    """The run's validity reasons less those of its design: what disturbed it."""
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
    return replace(j, detail=f"{what}: {j.detail}")


def verdict_checks(cfg: DictConfig, s: Settings, out: Path, step_s: float | None,
                   batch_s: float | None) -> list[Judgement]:
    """The two cases, sized from the plain loops' step and batch seconds."""
    if step_s is None or not math.isfinite(step_s):
        why = "the compute check measured no plain step time to size the stalls from"
        return [skipped("data-stall", why), skipped("step-stall", why)]
    data, late = data_case(cfg, s, step_s)
    step, stall = step_case(cfg, s, step_s, batch_s)
    return [_run("data-stall", "data", data, out, f"each batch {late * 1e3:.0f} ms late"),
            _run("step-stall", "compute", step, out, f"each step stalled {stall * 1e3:.0f} ms")]
