"""The compute and loader checks: gpubench's phase against the plain loop (gpubench.check.plain),
window for window, alternated in one process.

gpubench's side is its own run (`runner.Benchmark`, as `measure_run` drives it: build, windows
with warm-up, edge syncs, the sampler, the record) with `bench.phases` set to the one phase;
only the loop over the windows is changed, so that after each of gpubench's windows the plain
loop times one of its own on the same batch (compute) or the same DataLoader (loader). A drift
of a shared machine then hits both alike, and each round gives one ratio (rules.agree).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gpubench.analysis.noise import MIN_LOAD_WINDOW_S
from gpubench.check import plain
from gpubench.check.rules import Judgement, agree, skipped
from gpubench.config.settings import Settings
from gpubench.core.pipe import batches_in_flight
from gpubench.core.record import Status
from gpubench.run.runner import Benchmark


def phase_config(cfg: DictConfig, phase: str) -> DictConfig:
    """The user's config measuring one phase; no FLOP count (MFU is not checked here, and
    counting costs a forward and backward while building)."""
    out = copy.deepcopy(cfg)
    OmegaConf.update(out, "bench.phases", [phase])
    OmegaConf.update(out, "bench.flops", False)
    OmegaConf.update(out, "bench.profile", False)
    return out


class Alternated(Benchmark):
    """A gpubench run of one phase whose every window is followed by one of the plain loop."""

    def __init__(self, cfg: DictConfig, out: Path, phase: str):
        super().__init__(phase_config(cfg, phase), out)
        self.phase = phase
        self.plain: list[float] = []  # the plain loop's images/sec, window by window
        self._plain_step: plain.PlainStep | None = None

    def measure(self) -> None:  # replaces Benchmark.measure's loop; run() still wraps it
        self.build()
        window = self._compute_window if self.phase == "compute" else self._loader_window
        for i in range(self.repeats):
            ws = self.run_phase(self.phase)
            self._settle(ws)
            # as many steps as gpubench's window took (bench.min_window_s can lengthen it)
            self.plain.append(window(i == 0, ws.steps or self.steps_per_window))
            if i + 1 < self.repeats:
                self._settle(ws)
        self.record.skipped_samples = self.pipe.skipped
        self._plain_step = None  # the plain model goes before the run's own release collects

    def _settle(self, ws) -> None:
        """Loader workers deliver in bursts (each finishes a batch at about the same time),
        so a window of a few batches times one burst more or less depending on how the queue
        stood when it opened. Each window, gpubench's and the plain loop's, opens on the same
        state: the workers idle, every batch in flight made (waiting for them to make that
        many, with half again to spare), then drained."""
        ld = self.settings.loader
        if self.phase == "loader" and ld.num_workers and ws.steps:
            time.sleep(1.5 * batches_in_flight(ld.num_workers, ld.prefetch_factor)
                       * ws.seconds / ws.steps)

    def _compute_window(self, first: bool, steps: int) -> float:
        s = self.settings
        if first:
            self._plain_step = plain.PlainStep(s, *self.pipe.device_batch())
        # warmed as gpubench's own window is (at least one step: the model sat idle while
        # gpubench's window ran)
        warm = max(1, self._window_steps("compute", first)[0])
        images, seconds = plain.timed(self._plain_step, steps, self.device, warm)
        return images / seconds

    def _loader_window(self, first: bool, steps: int) -> float:
        s, pipe = self.settings, self.pipe
        # the same DataLoader and its live iterator (gpubench's endless pass over it): a second
        # iterator would start a second set of workers, or reset the persistent one
        fetch = self.functions["loader"][0]
        side = pipe.side
        if side.decode is not None or side.augment is not None:
            # device-side decode/augment: the plain loop runs gpubench's own device work
            def move(batch) -> int:
                moved = pipe.to_device(batch)
                return 0 if moved is None else int(moved[1].shape[0])
        else:
            move = plain.plain_copy(self.device, side.pin, s.channels_last)
        # drained as gpubench's own later windows are (runner._window_steps): what the workers
        # made while the two loops were apart would flatter the window
        drain = self._window_steps("loader", False)[0]
        images, seconds = plain.timed(lambda: move(fetch()), steps, self.device, drain)
        return images / seconds


def compare(cfg: DictConfig, out: Path, s: Settings, phase: str) -> Judgement:
    """gpubench's compute phase against the plain training step on the same batch, or its
    loader phase against a plain loop over the same DataLoader in windows of at least
    MIN_LOAD_WINDOW_S. A CPU run's windows have no least length (bench.min_window_s null acts
    as 0 there): a loader window of 16 small batches lasted about 40 ms, a few scheduler ticks
    of the 2-core machine its workers share with the main process, and timed when the workers'
    bursts fell rather than their rate (ratios 0.94 to 1.27 on one machine from run to run)."""
    if phase == "loader" and s.dataset.name == "device_synthetic":
        return skipped("loader", "no DataLoader with dataset=device_synthetic")
    if phase == "loader" and s.bench.min_window_s < MIN_LOAD_WINDOW_S:
        cfg = copy.deepcopy(cfg)
        OmegaConf.update(cfg, "bench.min_window_s", MIN_LOAD_WINDOW_S)
    bench = Alternated(cfg, out / phase, phase)
    interrupted = bench.run()
    if interrupted is not None:
        raise interrupted
    rec = bench.record
    if rec.status is not Status.ok:
        return Judgement(phase, False, {}, f"the run ended {rec.status}: {rec.error}")
    return agree(phase, [w.images_per_sec for w in bench.windows.get(phase, [])], bench.plain)
