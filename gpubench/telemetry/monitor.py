"""The run's one sampler thread, off the training hot path: every `interval` seconds one read
of NVML (telemetry/nvml.py) and the host's CPU serves the open window's samples (also device
memory, and the main process's and its loader workers' CPU, RSS and bytes read, apart) and
gpu_metrics.csv's row (telemetry/gpulog.py).

Workers' RSS counts pages shared with the main process (a forked preload cache) once per
process, so summed RSS overstates the RAM used. Bytes read come from each process's own
counters (/proc/<pid>/io), not whole-disk ones other processes move: `read_mb_per_s` is what
the run read (page cache or disk), `disk_read_mb_per_s` the part the storage device delivered.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from gpubench.telemetry import nvml

log = logging.getLogger(__name__)


@dataclass
class Sample:
    t: float
    host_cpu: float  # whole host, % of all cores
    procs_cpu: float  # main + workers, % of one core
    rss: int  # main + workers
    main_cpu: float = 0.0
    workers_cpu: float = 0.0
    main_rss: int = 0
    workers_rss: int = 0
    workers: int = 0
    worker_threads: int = 0  # the loader's worker threads seen (loader.worker_type=thread)
    read_bytes: int | None = None  # since the window opened (cumulative)
    disk_read_bytes: int | None = None
    gpu_util: float | None = None
    mem_util: float | None = None
    gpu_mem_used: int | None = None
    power_w: float | None = None
    # device memory this process has in use (NVML per process, else device-wide from
    # cudaMemGetInfo), and torch's reserved bytes at the same moment
    device_used: int | None = None
    torch_reserved: int | None = None
    power_source: str | None = None  # nvml.POWER_INSTANT / nvml.POWER_AVERAGE


@dataclass
class MonitorSummary:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    energy_j: float | None = None
    device_used_source: str | None = None
    nvml_unsupported: list[str] = field(default_factory=list)
    # nvml.ENERGY_COUNTER, ENERGY_POWER_X_TIME, or both ("+") over a phase's windows
    energy_source: str | None = None
    # samples whose averaged NVML readings were dropped (drop_straddling)
    nvml_dropped: int = 0

    def _vals(self, name: str) -> list[float]:
        return [getattr(s, name) for s in self.samples if getattr(s, name) is not None]

    def mean(self, name: str) -> float | None:
        v = self._vals(name)
        return sum(v) / len(v) if v else None

    def max(self, name: str) -> float | None:
        v = self._vals(name)
        return max(v) if v else None

    def as_dict(self) -> dict:
        return {
            "gpu_util_mean": self.mean("gpu_util"),
            "gpu_util_max": self.max("gpu_util"),
            "gpu_mem_util_mean": self.mean("mem_util"),
            "nvml_memory_used_bytes": self.max("gpu_mem_used"),
            "power_mean_w": self.mean("power_w"),
            # instant (NVML_FI_DEV_POWER_INSTANT) or average (nvmlDeviceGetPowerUsage)
            "power_source": "+".join(sorted({s.power_source for s in self.samples
                                             if s.power_source is not None})) or None,
            "energy_j": self.energy_j,
            "energy_source": self.energy_source,
            "host_cpu_util_mean": self.mean("host_cpu"),
            "process_cpu_util_mean": self.mean("procs_cpu"),
            "peak_rss_bytes": self.max("rss"),
            "main_cpu_util_mean": self.mean("main_cpu"),
            "workers_cpu_util_mean": self.mean("workers_cpu")
            if self.max("workers") or self.max("worker_threads") else None,
            "main_peak_rss_bytes": self.max("main_rss"),
            "workers_peak_rss_bytes": self.max("workers_rss") if self.max("workers") else None,
            "workers_max": self.max("workers"),
            "read_bytes": self.max("read_bytes"),
            "read_mb_per_s": self._rate("read_bytes"),
            "disk_read_bytes": self.max("disk_read_bytes"),
            "disk_read_mb_per_s": self._rate("disk_read_bytes"),
            "device_used_peak_bytes": self.max("device_used"),
            "device_used_source": self.device_used_source,
            "non_torch_peak_bytes": self.non_torch_peak(),
            "nvml_unsupported": self.nvml_unsupported or None,
            "nvml_samples_dropped": self.nvml_dropped or None,
            "gpu_util_note": self.gpu_util_note(),
            "samples": len(self.samples),
        }

    def gpu_util_note(self) -> str | None:
        unread = self.mean("gpu_util") is None and "gpu_util" not in self.nvml_unsupported
        if self.nvml_dropped and unread:
            return (f"all {self.nvml_dropped} NVML utilization readings were taken within "
                    f"{nvml.NVML_AVERAGING_S:g} s of their window's start, where NVML's average "
                    f"still covers the phase before; a GPU window must last longer than "
                    f"{nvml.NVML_AVERAGING_S:g} s to be read")
        return None

    def non_torch_peak(self) -> int | None:
        """The most device memory seen in use outside torch's caching allocator (context,
        library workspaces, NCCL, nvJPEG): in use minus reserved, sample by sample."""
        v = [s.device_used - s.torch_reserved for s in self.samples
             if s.device_used is not None and s.torch_reserved is not None]
        return max(0, max(v)) if v else None

    def _rate(self, name: str) -> float | None:
        total = self.max(name)  # cumulative counters: the largest is the last
        return None if total is None or self.seconds <= 0 else total / self.seconds / 1e6


def _thread_io(tid: int) -> tuple[int, int]:
    """(rchar, read_bytes) of one thread of this process; zeros where Linux does not say."""
    try:
        with open(f"/proc/self/task/{tid}/io") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["rchar"]), int(fields["read_bytes"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def drop_straddling(samples: list[Sample], t0: float,
                    averaging_s: float = nvml.NVML_AVERAGING_S) -> int:
    """Blank, in place, the averaged NVML readings (utilization; power where it is the 1 s
    average) of samples taken less than `averaging_s` after the window opened at `t0`: they
    average over the previous phase. Returns how many samples lost a reading."""
    dropped = 0
    for s in samples:
        if s.t - t0 >= averaging_s:
            continue
        power = ("power_w",) if s.power_source == nvml.POWER_AVERAGE else ()
        names = nvml.AVERAGED_FIELDS + power
        if any(getattr(s, n) is not None for n in names):
            dropped += 1
            for n in names:
                setattr(s, n, None)
    return dropped


class Monitor:
    """`begin()` starts the run's sampler thread (with gpu_metrics.csv's log or none), `end()`
    stops it; `open()` opens a window, `stop()` closes it and returns its summary. `gpu` and
    `clock` stand in for NVML and the time in tests; on CUDA the binding is found for the
    current device."""

    # Listing processes reads /proc/<pid>/stat of every process on the host (1.5 ms with 80
    # processes, far more on a busy node) holding the GIL: refreshed at most this often, and at
    # once when a known worker has gone or at a window's edges
    LIST_EVERY_S = 1.0

    def __init__(self, device: str, interval: float = 0.2, enabled: bool = True,
                 worker_pids: Callable[[], Iterable[int]] = tuple,
                 gpu: nvml.NvmlDevice | None = None, clock: Callable[[], float] = time.perf_counter,
                 worker_tids: Callable[[], Iterable[int]] = tuple):
        self.interval, self.enabled, self.clock = interval, enabled, clock
        # the loader's worker processes (and what they start), and its worker threads inside
        # this process (loader.worker_type=thread: their CPU is the workers', not the main's)
        self.worker_pids, self.worker_tids = worker_pids, worker_tids
        # at the last sample: the time, and each worker thread's CPU seconds
        self._thread_cpu: tuple[float, dict[int, float]] = (time.monotonic(), {})
        self.gpu = gpu if enabled else None
        self.nvml = self.cuda_index = None
        if enabled and device == "cuda" and gpu is None:
            import torch

            # the sampler thread reads device memory by this explicit index: a new thread's
            # current CUDA device is 0, not the rank's device torchrun set in the main thread
            self.cuda_index = torch.cuda.current_device()
            self.nvml = nvml.Nvml.get()
            h = self.nvml.handle_for(self.cuda_index)
            self.gpu = None if h is None else nvml.NvmlDevice(self.nvml.pynvml, h, self.nvml.mig)
        self._unsupported: dict[str, str] = {}
        self.proc = psutil.Process(os.getpid())
        self._procs, self._listed_at = {}, -math.inf  # pid -> psutil.Process
        # per-process I/O counters (Linux and Windows; not macOS): pid -> (chars, disk) at the
        # first and at the last sample that saw it. A worker born inside a window first reads
        # ~0.25 MB of its own start-up, not the dataset's; one that exits keeps its last count
        self._io = hasattr(self.proc, "io_counters")
        self._io_base, self._io_last = {}, {}
        self.log = None  # gpu_metrics.csv's gpulog.GpuLog (gpulog imports env, env this)
        # held by each tick and by the main thread opening and closing a window (an RLock)
        self._cv = threading.Condition()
        self._running = self._open = self._closing = False
        self._thread = self._tid = None  # the sampler thread, its native id while it runs
        self._values: dict = {}  # the last tick's NVML fields, for the log's row
        self._summary, self._t0, self._e0 = MonitorSummary(), 0.0, None

    @property
    def gpu_note(self) -> str | None:
        """One info line when GPU fields will be absent."""
        if self.gpu is not None:
            return ("MIG instance: its memory is sampled, power and energy are not (NVML gives "
                    "them for the whole GPU, other tenants included)") if self.gpu.mig else None
        if self.nvml is not None:
            return self.nvml.reason
        return "no NVIDIA GPU in use: GPU utilization/power absent; host CPU and RSS reported"

    def _processes(self, fresh: bool = False) -> list[psutil.Process]:
        gone = any(not p.is_running() for p in self._procs.values())
        if fresh or gone or time.monotonic() - self._listed_at > self.LIST_EVERY_S:
            current = [self.proc]
            for pid in set(self.worker_pids()):
                try:
                    w = psutil.Process(pid)
                    current += [w, *w.children(recursive=True)]
                except psutil.Error:  # a worker that exited since the loader listed it
                    continue
            # keep Process objects between samples: cpu_percent() measures since the last call
            self._procs = {p.pid: self._procs.get(p.pid, p) for p in current}
            self._listed_at = time.monotonic()
        return list(self._procs.values())

    def _read_io(self, p: psutil.Process) -> None:
        try:
            io = p.io_counters()
        except (psutil.Error, OSError):  # no /proc/<pid>/io access: leave the figure out
            return
        # read_chars (rchar) is Linux-only; elsewhere read_bytes is all there is
        chars, disk = getattr(io, "read_chars", io.read_bytes), io.read_bytes
        if p.pid == self.proc.pid and self._tid is not None:
            own_chars, own_disk = _thread_io(self._tid)
            chars, disk = chars - own_chars, disk - own_disk
        self._io_base.setdefault(p.pid, (chars, disk))
        self._io_last[p.pid] = (chars, disk)

    def _threads_cpu(self) -> tuple[float, int]:
        """The worker threads' CPU since the last sample (% of one core) and their count."""
        tids = set(self.worker_tids())
        if not tids:
            return 0.0, 0
        try:
            now = {t.id: t.user_time + t.system_time for t in self.proc.threads() if t.id in tids}
        except psutil.Error:
            return 0.0, 0
        (then, last), at = self._thread_cpu, time.monotonic()
        self._thread_cpu = (at, now)
        used = sum(v - last.get(tid, 0.0) for tid, v in now.items())
        return (max(0.0, 100.0 * used / (at - then)) if at > then else 0.0), len(now)

    def sample(self, fresh: bool = False, window: bool = True) -> Sample:
        """One reading: the host's CPU and the GPU's fields; for a window (`window`) also the
        run's processes and this process's device memory."""
        main_cpu = main_rss = workers_cpu = workers_rss = 0.0
        workers = threads = 0
        for p in self._processes(fresh) if window else ():
            try:
                with p.oneshot():  # one read of /proc/<pid>/stat for both figures
                    cpu, rss = p.cpu_percent(None), p.memory_info().rss
                if self._io:
                    self._read_io(p)
            except psutil.Error:  # a worker that exited between listing and reading
                continue
            if p.pid == self.proc.pid:
                used, threads = self._threads_cpu()  # the loader's threads, in this process
                used = min(cpu, used)
                main_cpu, main_rss = cpu - used, rss
                workers_cpu += used
            else:
                workers_cpu += cpu
                workers_rss += rss
                workers += 1
        s = Sample(self.clock(), psutil.cpu_percent(None), main_cpu + workers_cpu,
                   int(main_rss + workers_rss), main_cpu, workers_cpu, int(main_rss),
                   int(workers_rss), workers, threads)
        if self._io_last:
            s.read_bytes, s.disk_read_bytes = (
                sum(self._io_last[p][i] - self._io_base[p][i] for p in self._io_last)
                for i in (0, 1))
        values: dict = {}
        if self.gpu is not None:
            values, errors = nvml.read_fields(*self.gpu, self.proc.pid if window else None)
            for k in (*nvml.GPU_FIELDS, "power_source"):
                setattr(s, k, values.get(k))
            for k, why in errors.items():
                if k not in self._unsupported:
                    log.debug("NVML %s not read: %s", k, why)
                    self._unsupported[k] = why
        self._values = values
        if window and self.cuda_index is not None:
            s.torch_reserved, s.device_used = self._device_memory(values.get("process_mem_used"))
        return s

    def _device_memory(self, process_used: int | None) -> tuple[int | None, int | None]:
        import torch

        try:
            reserved, source = int(torch.cuda.memory_reserved(self.cuda_index)), "nvml_process"
            if process_used is None:
                # no per-process figure: the whole device's memory in use, other processes
                # included (an upper bound, so the gate errs on the safe side)
                free, total = torch.cuda.mem_get_info(self.cuda_index)
                process_used, source = int(total - free), "mem_get_info_device"
            self._summary.device_used_source = source
            return reserved, process_used
        except RuntimeError as e:
            log.debug("device memory not read: %s", e)
            return None, None

    # ------------------------------------------------------------------ the window

    def open(self) -> None:
        with self._cv:
            self._summary = MonitorSummary()
            if not self.enabled:
                return
            self._io_base, self._io_last = {}, {}
            self.sample(fresh=True)  # primes cpu_percent and I/O baselines; covers no interval
            self._e0 = nvml.energy_mj(self.gpu)
            self._t0 = self.clock()
            self._open = True

    def tick(self, fresh: bool = False, row: bool = True) -> None:
        """One reading serves both: the open window's sample, and the log's row (`row`)."""
        with self._cv:
            log_ = self.log if row else None
            if not (self._open or log_):
                return
            s = self.sample(fresh, window=self._open)
            if self._open:
                self._summary.samples.append(s)
            if log_ is not None:
                log_.write(s.host_cpu, self._values)

    def close(self, ends: tuple[float, float | None] | None = None) -> MonitorSummary:
        """The window's summary, closing now or at `ends` (time and energy read by stop)."""
        t1, e1 = ends or (self.clock(), nvml.energy_mj(self.gpu))
        with self._cv:
            self._open = False
            summ = self._summary
            summ.nvml_unsupported, summ.seconds = sorted(self._unsupported), t1 - self._t0
            summ.nvml_dropped = drop_straddling(summ.samples, self._t0)
            summ.energy_j, summ.energy_source = nvml.window_energy_j(
                self._e0, e1, summ.mean("power_w"), summ.seconds)
            return summ

    def stop(self) -> MonitorSummary:
        if not self._open:
            return self._summary
        # the window's end is now: read before the sampler takes the window's last sample,
        # a few ms after it closed (the counter moves every 20-100 ms)
        ends = self.clock(), nvml.energy_mj(self.gpu)
        with self._cv:
            if self._running:  # the sampler thread takes it: its own /proc reads subtracted
                self._closing = True
                self._cv.notify_all()
                self._cv.wait_for(lambda: not self._closing)
            else:  # no sampler thread (begin() not called, or ended): taken here
                self.tick(fresh=True, row=False)
            return self.close(ends)

    # ------------------------------------------------------------------ the run's thread

    def _run(self) -> None:
        # the sampler's own /proc reads land in the main process's I/O counters: its thread's
        # counters (/proc/self/task/<tid>/io) are taken back out
        self._tid = threading.get_native_id()
        # host CPU: psutil.cpu_percent(None) is the share since the last call on the same thread
        # (its baseline is kept per threading.current_thread().ident: psutil/__init__.py), so
        # every tick's covers the interval since the previous tick, a window's first included
        psutil.cpu_percent(None)
        with self._cv:
            while True:
                self._cv.wait_for(lambda: self._closing or not self._running, self.interval)
                closing, last = self._closing, not (self._closing or self._running)
                try:  # a tick; a window's last sample (no row: the log keeps its interval);
                    # the run's last moments (a row even for the shortest run)
                    self.tick(fresh=closing or last, row=not closing)
                except Exception as e:  # never stops the run, nor a window's close
                    log.debug("sample failed: %s", e)
                self._closing = False
                self._cv.notify_all()
                if last:
                    break
        self._tid = None

    def begin(self, log=None) -> None:
        """Start the sampler thread; with `log`, each tick writes gpu_metrics.csv's row."""
        if not self.enabled:
            return
        self.log = log.start() if log is not None else None
        self._running = True
        self._thread = threading.Thread(target=self._run, name="gpubench-monitor", daemon=True)
        self._thread.start()

    def end(self):
        """Stop the sampler after its last row; returns the log, closed (or None)."""
        if self._thread is not None:
            self._running = False
            if self._cv.acquire(timeout=10):  # not held by a tick stuck in a hung driver
                self._cv.notify_all()
                self._cv.release()
            self._thread.join(timeout=10)
            self._thread = None
        done, self.log = self.log, None
        if done is not None:
            done.stop()
        return done
