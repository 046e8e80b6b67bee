"""The compute and loader checks: each window of gpubench's own run of the phase is followed by one
of the plain loop on the same batch or DataLoader, so a shared machine's drift hits both."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gpubench.analysis.noise import MIN_LOAD_WINDOW_S
from gpubench.check import plain
from gpubench.check.rules import Judgement, agree, skipped
from gpubench.config.settings import Settings
from gpubench.core.pipe import batches_in_flight
from gpubench.core.record import Status
from gpubench.run.runner import Benchmark


def phase_config(cfg: DictConfig, phases: list[str], **bench) -> DictConfig:
    """The user's config measuring `phases` with `bench` keys set, no FLOP count or profile."""
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

    def measure(self) -> None:  # replaces Benchmark.measure's loop; run() still wraps it
        self.build()
        for i in range(self.repeats):
            ws = self.run_phase(self.phase)
            self._settle(ws)
            work, warm = self._plain_work(i == 0)
            # as many steps as gpubench's window took (bench.min_window_s can lengthen it)
            steps = ws.steps or self.steps_per_window
            images, seconds = plain.timed(work, steps, self.device, warm)
            self.plain.append(images / seconds)
            if i + 1 < self.repeats:
                self._settle(ws)
        self.record.skipped_samples = self.pipe.skipped
        self._plain_step = None  # the plain model goes before the run's own release collects

    def _settle(self, ws) -> None:
        """Workers deliver in bursts: each window opens with every batch in flight made (waiting
        that long, and half again), so a short one times no burst more or less."""
        ld = self.settings.loader
        if self.phase == "loader" and ld.num_workers and ws.steps:
            time.sleep(1.5 * batches_in_flight(ld.num_workers, ld.prefetch_factor)
                       * ws.seconds / ws.steps)

    def _plain_work(self, first: bool) -> tuple[Callable[[], int], int]:
        """The plain loop's work for one window, and its untimed steps before it."""
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
    """gpubench's phase against the plain loop's. Loader windows last MIN_LOAD_WINDOW_S on a
    CPU too: a 40 ms one timed the workers' bursts, not their rate (ratios 0.94 to 1.27)."""
    if phase == "loader" and s.dataset.name == "device_synthetic":
        return skipped("loader", "no DataLoader with dataset=device_synthetic")
    longer = phase == "loader" and s.bench.min_window_s < MIN_LOAD_WINDOW_S
    bench = Alternated(cfg, out / phase, phase,
                       **({"min_window_s": MIN_LOAD_WINDOW_S} if longer else {}))
    if (interrupted := bench.run()) is not None:
        raise interrupted
    rec = bench.record
    if rec.status is not Status.ok:
        return Judgement(phase, False, {}, f"the run ended {rec.status}: {rec.error}")
    return agree(phase, [w.images_per_sec for w in bench.windows.get(phase, [])], bench.plain)
