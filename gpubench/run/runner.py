"""One benchmark run: build once, measure the phases in interleaved windows (loader, compute, e2e,
loader, ...: a slow drift hits every phase alike; the windows give an interval). results.json is
written before any work, after every window and before any tracking: nothing measured is lost."""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from gpubench.config.errors import ConfigError
from gpubench.config.settings import Fault, check_resources, plain, resolve, window_cap_s
from gpubench.core.files import check_no_links
from gpubench.core.pipe import batches_in_flight
from gpubench.core.record import (
    RUNG_ENV,
    STUDY_ENV,
    PhaseRecord,
    RunRecord,
    Status,
    phase_plan,
    window_plan,
)
from gpubench.core.secrets import mask_secrets
from gpubench.core.stats import WindowStats, pool
from gpubench.parts import distributed, models, targets
from gpubench.parts import step as train
from gpubench.parts.data import CorruptImage, build_pipeline
from gpubench.parts.measure import DeviceStart, run_window
from gpubench.parts.oom import is_oom
from gpubench.parts.precision import apply_backend_flags, resolve_precision
from gpubench.run import compute_bound, merge
from gpubench.run.ending import Hold, kept
from gpubench.run.summary import figures, summarize
from gpubench.run.watchdog import Watchdog, hang_limit_s
from gpubench.telemetry import env
from gpubench.telemetry.gpulog import GpuLog
from gpubench.telemetry.monitor import Monitor, MonitorSummary

log = logging.getLogger("gpubench")

SAVE_WAIT_S = 10.0  # a hung run's last write waits this long for one under way
REAP_WAIT_S = 5.0  # and for its killed loader workers to end


@dataclass
class Result:
    """A finished run as the entry point sees it: the record plus how it was reported."""

    record: RunRecord
    notes: list[str] = field(default_factory=list)
    tracked: bool | None = None  # False: MLflow missed the run (results kept; `tracking sync`)
    main: bool = True  # False on torchrun ranks other than 0: they measure, never report
    data = property(lambda self: self.record.to_dict())
    path = property(lambda self: self.record.path)
    status = property(lambda self: self.record.status)
    objective = property(lambda self: self.record.objective)


def output_dir(out_dir: str | Path | None) -> Path:
    if out_dir is not None:
        p = Path(out_dir)
    else:
        try:
            from hydra.core.hydra_config import HydraConfig

            p = Path(HydraConfig.get().runtime.output_dir)
        except ValueError:  # not under @hydra.main: a fresh folder under ./outputs
            p = Path("outputs") / "runs" / time.strftime("%Y-%m-%d/%H-%M-%S")
    p.mkdir(parents=True, exist_ok=True)
    # the no-links rule without Hydra; under it cli.callbacks checked before Hydra wrote
    return check_no_links(p)


def one_line_error(e: BaseException) -> str:
    """An error as one line (a DataLoader worker's carries a traceback: its first and last)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
    text = f"{lines[0]} ... {lines[-1]}" if len(lines) > 1 else lines[0]
    return f"{type(e).__name__}: {text}"[:1000]


def moved_batch(pipe, batches, batch, after_decode, must_step: bool):
    """`batch` on the device, None when none of it decoded; with `must_step` (torchrun e2e: a rank
    skipping DDP's all-reduce hangs the others) the next batches until one does (the pipeline
    stops after MAX_SUBSTITUTES in a row)."""
    moved = pipe.to_device(batch, after_decode=after_decode)
    while moved is None and must_step:
        moved = pipe.to_device(next(batches), after_decode=after_decode)
    return moved


class Faults:
    """`fault.*`, for tests and the docs' reliability table: an OOM above a batch size, an error
    after some windows, stalls; `fault.rank`: on one torchrun rank only."""

    def __init__(self, fault: Fault, rank: int) -> None:
        self.fault = fault
        self.here = distributed.fault_hits(fault.rank, rank)
        self.oom_above_batch = fault.oom_above_batch if self.here else None  # None: never
        self.sleep = time.sleep  # how a stall passes: a test's stand-in moves its own clock

    def maybe_fail(self, windows: int) -> None:  # windows done; 0: while building
        if self.fault.fail_message and self.here and windows == self.fault.fail_after_windows:
            raise RuntimeError(self.fault.fail_message)

    def staller(self) -> Callable[[], None]:  # called before each step
        every = self.fault.stall_every if self.here else None
        calls = itertools.count(1)

        def stall() -> None:
            if every and next(calls) % every == 0:
                self.sleep(self.fault.stall_s)

        return stall


class Benchmark:
    """One run: build once (data, model, step), then `run_phase` window by window."""

    def __init__(self, cfg: DictConfig, out_dir: str | Path | None = None):
        # ConfigError before any work: the config's rules, disk, RAM, the code it names (uncalled)
        s = self.settings = resolve(cfg)
        check_resources(s)
        targets.check(s)
        b, ld = s.bench, s.loader
        self.device = s.device
        self.dist = distributed.from_env(self.device)
        self.out = output_dir(out_dir)
        random.seed(b.seed)
        torch.manual_seed(b.seed)
        self.phases = list(s.phases)
        self.faults = Faults(s.fault, self.dist.rank)
        self.repeats = window_plan(b.steps, b.repeats)[0]
        # results.json never holds a password (tracking.uri may carry user:pw@)
        rec = self.record = RunRecord.start(
            self.out, mask_secrets(plain(s.config)), env.facts(self.device), s.memory.ceiling,
            self.dist.world, memory_source="torch_cuda_reserved" if self.device == "cuda"
            else "host_rss", device_memory_bytes=env.device_memory_bytes(self.device))
        # for the competition check: the cores the run can keep busy
        rec.extra["cpu_demand_cores"] = min(
            os.cpu_count() or 1, torch.get_num_threads() + ld.num_workers * ld.worker_threads)
        # a study's job (shared by every worker's jobs); a sweeper's rung
        rec.extra |= {key: os.environ[var] for key, var in
                      (("study", STUDY_ENV), ("rung", RUNG_ENV)) if os.environ.get(var)}
        self.monitor = Monitor(self.device, b.monitor_interval_s, b.monitor,
                               worker_pids=lambda: self._workers("worker_pids"),
                               worker_tids=lambda: self._workers("worker_tids"))
        self.notes = [n for n in (self.monitor.gpu_note, *s.notes) if n]
        self.windows: dict[str, list[WindowStats]] = {}
        self.telemetry: dict[str, list[MonitorSummary]] = {}
        self.memory: dict[str, dict] = {}
        self.energy_all: dict[str, float | None] = {}  # under torchrun: all ranks' energy
        self.pipe = self.step = None
        self.functions: dict = {}  # phase -> (fetch, work), made on the phase's first window
        self.device_start = DeviceStart()  # after a host-blocking nvJPEG decode (parts/measure.py)
        self.t0 = time.perf_counter()
        self.hold = Hold()
        self.watchdog = Watchdog(hang_limit_s(b.warmup_max_seconds, b.max_seconds), self._hung,
                                 self._end_hung)
        self._saving = threading.RLock()  # held for good by a hung run's last write (_hung)

    def _workers(self, what: str):  # the loader's worker pids or tids; none before it is built
        return getattr(self.pipe, what)() if self.pipe is not None else ()

    def save(self) -> None:
        if self.dist.main:  # one results.json per run, from rank 0
            with self._saving:
                self.record.seconds = time.perf_counter() - self.t0
                self.record.save()

    def build(self) -> None:
        s, device, rec, b = self.settings, self.device, self.record, self.settings.bench
        self.plan = resolve_precision(s.precision, device)
        apply_backend_flags(self.plan, b.cudnn_benchmark)
        self.pipe = build_pipeline(s, (self.dist.rank, self.dist.world) if self.dist.enabled
                                   else None)
        rec.data_info = self.pipe.info
        if "compute" in self.phases or "e2e" in self.phases:
            model = models.prepare_model(models.build_model(s), device, s.channels_last)
            with self.watchdog.watching("building", "taking a first batch and checking the "
                                        "model on it (one forward, the FLOP count)"):
                batch = self.pipe.device_batch()
                loss = train.make_loss(s.step)  # step=custom's loss resolved, not called
                models.check_output(model, batch, s, loss)  # one forward: shape, width, loss's type
                opt = train.make_optimizer(model, b.optimizer, b.lr, b.optimizer_impl)
                if b.flops:
                    split = train.count_step_flops_split(model, self.plan, device, batch, loss=loss)
                    rec.flops_per_step = split and split["total"]
                    rec.extra["flops_by_kind"] = split  # conv vs matmul: MFU's peak per math
            compiled = models.maybe_compile(self.dist.wrap(model, device), s.compile)
            self.step = train.TrainStep(compiled, self.plan, device, opt,
                                        self.faults.oom_above_batch, b.grad_accum_steps,
                                        b.host_metrics_every, loss, models.step_marker(s.compile))
        self.faults.maybe_fail(0)

    def _functions(self, name: str):
        """(fetch, work) for one phase, `work` returning the images it processed."""
        pipe, step, stall = self.pipe, self.step, self.faults.staller()
        if name == "compute":
            fixed = pipe.device_batch()
            n = train.images_in(fixed)

            def compute_only(batch):
                stall()
                step(batch)
                return n

            return (lambda: fixed), compute_only
        batches = pipe.batches()
        # under torchrun e2e's step is a collective (DDP's all-reduce): every rank must take it
        must_step = name == "e2e" and self.dist.enabled

        def load_or_train(batch):
            moved = moved_batch(pipe, batches, batch, self.device_start, must_step)
            if moved is None:  # every sample of this batch failed to decode (on_corrupt=skip)
                return 0
            if name == "e2e":
                stall()
                step(moved)
            return train.images_in(moved)

        return (lambda: next(batches)), load_or_train

    def _window_steps(self, name: str, first: bool) -> tuple[int, int]:
        """(warm-up, measured) steps. A later window first drains the batches made meanwhile
        (they would flatter it); a loader window spans a few times the batches in flight."""
        b, ld = self.settings.bench, self.settings.loader
        if first:
            # compiled: the first step compiles, with reduce-overhead the second records the
            # CUDA graph and the third is its first replay: the window starts on replays only
            warm = max(b.warmup_steps, 3) if self.settings.compile != "off" else b.warmup_steps
        elif name == "compute" or self.pipe.loader is None:
            warm = 1
        else:
            warm = batches_in_flight(ld.num_workers, ld.prefetch_factor) + 1
        return warm, phase_plan(name, b.steps, b.repeats, ld)[1]

    def run_phase(self, name: str) -> WindowStats:
        """One window of a phase (the first warms up until steps are steady)."""
        b, dist, device = self.settings.bench, self.dist, self.device
        where = f"{name} phase, window {len(self.windows.get(name, ())) + 1}"
        self.watchdog.at(where)
        first = name not in self.windows
        if first:
            self.windows[name], self.telemetry[name] = [], []
            self.functions[name] = self.watchdog.phase(name, *self._functions(name),
                                                       compiled=self.settings.compile != "off")
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        held: list[MonitorSummary] = []
        warm, steps = self._window_steps(name, first)
        # the loss is read only where the device has just been synchronized: after each
        # warm-up step (which syncs to time itself) and after the window's closing sync
        check = (lambda: self.step.check_loss(f"{where}, warm-up")) if name != "loader" else None
        last = None if first else self.windows[name][-1]
        stats = run_window(
            name, *self.functions[name], self.settings.loader.batch_size, device, warm, steps,
            b.warmup_max_seconds, window_cap_s(b.max_seconds, b.repeats, b.steps),
            warmup_max_steps=max(warm, b.warmup_max_steps) if first else None,
            on_open=lambda: (dist.barrier(), self.monitor.open()),  # all ranks open together
            on_close=lambda: held.append(self.monitor.stop()), on_warm_step=check,
            min_s=b.min_window_s, device_start=self.device_start,
            # under torchrun all ranks end warm-up and size a window together (parts/measure.py)
            ranks=dist if dist.enabled else None,
            step_s=last.seconds / last.steps if last is not None and last.steps else None)
        if check is not None:
            self.step.check_loss(where)
        if dist.enabled:
            # every rank healthy at the window's end before gathering (a failed one announces
            # itself, and Dist.watch ends the others)
            dist.agree(None)
            self.energy_all[name] = merge.energy_across_ranks(
                held[0].energy_j, dist, self.energy_all.get(name, 0.0))
            stats = merge.across_ranks(stats, dist)
        self.windows[name].append(stats)
        self.telemetry[name].append(held[0])
        if device == "cuda":
            mem = self.memory.setdefault(name, {})
            for k, v in (("torch_peak_allocated_bytes", torch.cuda.max_memory_allocated()),
                         ("torch_peak_reserved_bytes", torch.cuda.max_memory_reserved())):
                mem[k] = max(int(v), mem.get(k, 0))
        self._record_phase(name)
        return stats

    def _record_phase(self, name: str) -> None:
        ws, summaries = self.windows[name], self.telemetry[name]
        merged = merge.telemetry(summaries)
        telemetry = merged.as_dict()
        if name in self.energy_all:
            telemetry["energy_j_all_ranks"] = self.energy_all[name]
        self.record.phases[name] = PhaseRecord.from_dict(
            merge.phase_record_fields(pool(ws), summaries, self.device, name)
            | {"telemetry": telemetry, "memory": dict(self.memory.get(name, {}))})
        self.record.series[name] = merge.series(ws, merged)
        # top-level figures after every phase: a run dying at its final write (a full disk)
        # leaves a record a resume or `sync` keeps as measured (RunRecord.recover)
        figures(self.record, self.device)
        self.save()

    def measure(self) -> None:
        self.build()
        for done in range(1, self.repeats * len(self.phases) + 1):
            self.run_phase(self.phases[(done - 1) % len(self.phases)])
            self.faults.maybe_fail(done)
        self.watchdog.at(None)  # the windows are done: nothing after them is watched
        if self.settings.bench.profile:
            from gpubench.telemetry.profile import profile_steps

            name = "e2e" if self.step is not None else "loader"
            self.record.extra["profile"] = profile_steps(
                *self._functions(name), self.device, self.out, self.settings.bench.profile_steps,
                step=self.step)
            self.save()
        self.record.skipped_samples = self.pipe.skipped

    def run(self) -> BaseException | None:
        """Measure and write the record, whatever happens; returns the interrupt (Ctrl-C, SIGTERM,
        SIGHUP) for the caller to re-raise once reported. A ConfigError is raised."""
        rec = self.record
        self.save()
        status, error, interrupted = Status.ok, None, None
        self.dist.watch(self._peer_failed)
        # the sampler runs the whole run, writing gpu_metrics.csv (rank 0's device only)
        csv = self.settings.bench.monitor and self.dist.main
        self.monitor.begin(GpuLog(self.device, self.out, gpu=self.monitor.gpu) if csv else None)
        self.watchdog.start()
        try:
            self.measure()
        except KeyboardInterrupt as e:  # gpubench.cli.signals' Terminated names its signal
            status, error, interrupted = Status.killed, f"interrupted by {e or 'Ctrl-C'}", e
        except CorruptImage as e:
            status, error = Status.failed, str(e)
        except ConfigError as e:
            # bad input found while building (an empty folder): nothing measured, no results.json
            if not rec.phases and self.dist.main:
                rec.path.unlink(missing_ok=True)
            self.dist.announce(Status.failed.value, str(e))
            self._release()
            raise
        except Exception as e:
            if is_oom(e, self.device):
                status, error = Status.oom, f"{type(e).__name__}: {str(e)[:500]}"
            else:
                log.debug("run failed", exc_info=True)
                status, error = Status.failed, one_line_error(e)
        finally:
            self.hold.arm()  # measuring is over: a signal from here waits (run/ending.py)
            self.watchdog.stop()
            self.monitor.stop()
            if (gpulog := self.monitor.end()) is not None:  # the log, closed by monitor.end()
                self.record.extra["gpu_metrics"] = {
                    "file": gpulog.path.name, "rows": gpulog.rows, "gpm": gpulog.gpm is not None,
                    "note": gpulog.note or None}
                if not rec.path.exists():  # bad input found while building: nothing is kept
                    gpulog.path.unlink(missing_ok=True)
        if status is not Status.ok:  # the other ranks must not wait for this one
            self.dist.announce(status.value, error or "stopped before measuring")
        if (step := train.step_figures(rec, self.step)) is not None:
            rec.extra["step"] = step
        self._release()
        try:
            summarize(self, status)
        except Exception as e:  # a verdict that fails must not cost the measurement
            log.debug("summary failed", exc_info=True)
            rec.reason = f"summary failed: {type(e).__name__}: {e}"
        rec.finish(status, error)
        self.save()
        return interrupted

    def _peer_failed(self, peer_status: str, message: str) -> None:
        """Another torchrun rank failed: recorded before the watcher thread ends the process."""
        if self.dist.main:  # a peer's OOM is the run's OOM (the same batch on every rank)
            told = Status.read(peer_status)
            self.record.status = told if told in (Status.oom, Status.killed) else Status.failed
            self.record.error = f"another rank failed: {message}"
            self.save()

    def _hung(self, line: str) -> str:
        """On the watchdog's thread, before the process ends: the record's last write, `failed`
        (the lock is never released). Returns the line to print."""
        if not self._saving.acquire(timeout=SAVE_WAIT_S):  # stuck writing it (a hung mount)
            return f"{line}; its record was not written: the run is stuck writing it"
        if self.dist.main:
            self.record.finish(Status.failed, f"hung: {line}")
        self.save()  # re-entered on this thread; the main thread's next save() waits for ever
        self.dist.announce(Status.failed.value, f"hung: {line}")
        return f"{line}; {kept(self.out)}" if self.dist.main else line

    def _end_hung(self) -> None:
        """Kill the loader's workers (the stuck one may be among them), flush the GPU log."""
        pids = list(self._workers("worker_pids"))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # reaped here, as a kill lands when the worker next runs (orphaned, a killed one still
        # ran on a busy host); bounded: one stuck in uninterruptible I/O dies when that returns
        deadline = time.monotonic() + REAP_WAIT_S
        for pid in pids:
            with contextlib.suppress(ChildProcessError):  # reaped already
                while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                    time.sleep(0.01)
        self.monitor.end()

    def _release(self) -> None:
        if self.pipe is not None:
            self.pipe.shutdown()
        # collected: the run's reference cycles (model, optimizer, compiled graphs) hold device
        # memory the next run in this process must not see
        self.pipe = self.step = None
        self.functions = {}
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.dist.close()


def measure_run(cfg: DictConfig, out_dir: str | Path | None = None, report=None) -> Result:
    """Validate (a ConfigError before any work), measure, write results.json. Ctrl-C or SIGTERM
    mark it "killed" and are re-raised once it is final and `report` (rank 0) has run."""
    bench = Benchmark(cfg, out_dir)
    with bench.hold:
        interrupted = bench.run()
        result = Result(bench.record, bench.notes, main=bench.dist.main)
        if report is not None and result.main and bench.record.phases:
            try:  # run.png beside results.json (report/runplot.py): one that fails costs nothing
                from gpubench.report.runplot import plot_run

                bench.record.extra["picture"] = str(plot_run(bench.record, bench.out))
                bench.save()
            except Exception as e:
                log.warning("run picture not drawn: %s", e)
    if report is not None and result.main:
        report(bench, result, interrupted)
    if interrupted is not None:
        raise interrupted
    bench.hold.replay()
    return result


def run_benchmark(cfg: DictConfig, out_dir: str | Path | None = None,
                  quiet: bool = False) -> Result:
    """The whole run: measure, then the console summary and tracking (KILLED for an interrupted
    run; a signal that came while the record was made final skips it: `tracking sync` later)."""

    def report(bench: Benchmark, result: Result, interrupted) -> None:
        if not quiet:
            from gpubench.report.console import print_result

            print_result(result)
        if bench.settings.tracking.backend != "none" and not bench.hold.late:
            from gpubench import tracking

            # the override list of a config composed outside a Hydra run (settings keep none)
            task = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
            result.tracked = tracking.log_result(bench.settings.tracking, bench.record, task)
        if interrupted is None and not bench.hold.late:
            # a multirun's loader-only job measures its setup's compute bound (compute_bound.py)
            where = compute_bound.claim(bench.settings.phases, bench.record, bench.dist.enabled)
            if where is None:
                return
            try:
                done = measure_run(compute_bound.compute_config(cfg), where)
            except ConfigError as e:  # the loader job stands; the report says how to measure it
                print(f"gpubench: the sweep's compute bound was not measured: {e}")
                return
            print(compute_bound.line(done.record))

    return measure_run(cfg, out_dir, report)
