"""The run's one sampler thread, off the training hot path: each `interval` s one read of NVML and
the host serves the open window's samples and gpu_metrics.csv's row. Summed RSS counts pages
shared with the main process (a forked preload cache) once per process, overstating RAM. Bytes
read are each process's own: `read_mb_per_s` from page cache or disk, `disk_read_mb_per_s` disk."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from gpubench.core.stats import CPU_SHARES, MIN_CPU_SPAN_S
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
    device_used: int | None = None  # this process's (NVML), else device-wide (cudaMemGetInfo)
    torch_reserved: int | None = None  # at the same moment
    power_source: str | None = None  # nvml.POWER_INSTANT / nvml.POWER_AVERAGE
    dt: float = 0.0  # the seconds its CPU figures cover: since the processes were last read


def _busy_total(t) -> tuple[float, float]:
    """Host CPU seconds (busy, total) as psutil splits them (_cpu_busy_time): idle and iowait
    are not busy; Linux counts guest time inside user, so it leaves the total."""
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return total - t.idle - getattr(t, "iowait", 0.0), total


@dataclass
class MonitorSummary:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    energy_j: float | None = None
    device_used_source: str | None = None
    nvml_unsupported: list[str] = field(default_factory=list)
    energy_source: str | None = None  # nvml.ENERGY_*, "+"-joined over a phase's windows
    nvml_dropped: int = 0  # samples whose averaged NVML readings were dropped (drop_straddling)

    def mean(self, name: str) -> float | None:
        # CPU figures are rates since the last reading (psutil's cpu_percent): weighed by their
        # interval, as one a few ms after the last is off by up to a clock tick (10 ms) per
        # process; under MIN_CPU_SPAN_S in all, no figure
        v = [(x, s.dt if name in CPU_SHARES else 1.0) for s in self.samples
             if (x := getattr(s, name)) is not None]
        total = sum(w for _, w in v)
        if not v or (name in CPU_SHARES and total < MIN_CPU_SPAN_S):
            return None
        return sum(x * w for x, w in v) / total

    def max(self, name: str) -> float | None:
        return max((x for s in self.samples if (x := getattr(s, name)) is not None), default=None)

    def as_dict(self) -> dict:
        power_sources = {s.power_source for s in self.samples if s.power_source is not None}
        return {"gpu_util_mean": self.mean("gpu_util"), "gpu_util_max": self.max("gpu_util"),
                "gpu_mem_util_mean": self.mean("mem_util"),
                "nvml_memory_used_bytes": self.max("gpu_mem_used"),
                "power_mean_w": self.mean("power_w"),
                "power_source": "+".join(sorted(power_sources)) or None,
                "energy_j": self.energy_j, "energy_source": self.energy_source,
                "host_cpu_util_mean": self.mean("host_cpu"),
                "process_cpu_util_mean": self.mean("procs_cpu"), "peak_rss_bytes": self.max("rss"),
                "main_cpu_util_mean": self.mean("main_cpu"),
                "workers_cpu_util_mean": self.mean("workers_cpu")
                if self.max("workers") or self.max("worker_threads") else None,
                "main_peak_rss_bytes": self.max("main_rss"),
                "workers_peak_rss_bytes": self.max("workers_rss") if self.max("workers") else None,
                "workers_max": self.max("workers"),
                "read_bytes": self.max("read_bytes"), "read_mb_per_s": self._rate("read_bytes"),
                "disk_read_bytes": self.max("disk_read_bytes"),
                "disk_read_mb_per_s": self._rate("disk_read_bytes"),
                "device_used_peak_bytes": self.max("device_used"),
                "device_used_source": self.device_used_source,
                "non_torch_peak_bytes": self.non_torch_peak(),
                "nvml_unsupported": self.nvml_unsupported or None,
                "nvml_samples_dropped": self.nvml_dropped or None,
                "gpu_util_note": self.gpu_util_note(), "samples": len(self.samples)}

    def gpu_util_note(self) -> str | None:
        unread = self.mean("gpu_util") is None and "gpu_util" not in self.nvml_unsupported
        if self.nvml_dropped and unread:
            return (f"all {self.nvml_dropped} NVML utilization readings were taken within "
                    f"{nvml.NVML_AVERAGING_S:g} s of their window's start, where NVML's average "
                    f"still covers the phase before; a GPU window must last longer than "
                    f"{nvml.NVML_AVERAGING_S:g} s to be read")
        return None

    def non_torch_peak(self) -> int | None:
        """Peak device memory outside torch's allocator (context, workspaces, NCCL, nvJPEG)."""
        v = [s.device_used - s.torch_reserved for s in self.samples
             if s.device_used is not None and s.torch_reserved is not None]
        return max(0, max(v)) if v else None

    def _rate(self, name: str) -> float | None:
        total = self.max(name)  # cumulative counters: the largest is the last
        return None if total is None or self.seconds <= 0 else total / self.seconds / 1e6


def drop_straddling(samples: list[Sample], t0: float) -> int:
    """Blank readings under NVML_AVERAGING_S after `t0` (they average the phase before)."""
    dropped = 0
    for s in (s for s in samples if s.t - t0 < nvml.NVML_AVERAGING_S):
        power = ("power_w",) if s.power_source == nvml.POWER_AVERAGE else ()
        names = nvml.AVERAGED_FIELDS + power
        if any(getattr(s, n) is not None for n in names):
            dropped += 1
            for n in names:
                setattr(s, n, None)
    return dropped


class Monitor:
    """`begin()`/`end()` run the sampler thread, `open()`/`stop()` a window (and summarize it)."""

    # listing processes reads every host process's /proc/<pid>/stat holding the GIL (1.5 ms
    # with 80): at most this often, or at once when a worker has gone or at a window's edges
    LIST_EVERY_S = 1.0

    def __init__(self, device: str, interval: float = 0.2, enabled: bool = True,
                 worker_pids: Callable[[], Iterable[int]] = tuple,
                 gpu: nvml.NvmlDevice | None = None, clock: Callable[[], float] = time.perf_counter,
                 worker_tids: Callable[[], Iterable[int]] = tuple):
        self.interval, self.enabled, self.clock = interval, enabled, clock
        # worker threads (loader.worker_type=thread): their CPU is the workers', not the main's
        self.worker_pids, self.worker_tids = worker_pids, worker_tids
        # the last sample's time and each worker thread's CPU seconds
        self._thread_cpu: tuple[float, dict[int, float]] = (time.monotonic(), {})
        self.gpu = gpu if enabled else None
        self.nvml = self.cuda_index = None
        if enabled and device == "cuda" and gpu is None:
            import torch
            # an explicit index: a new thread's current device is 0, not the rank's device
            self.cuda_index = torch.cuda.current_device()
            self.nvml = nvml.Nvml.get()
            self.gpu = self.nvml.device_for(self.cuda_index)
        self._unsupported: dict[str, str] = {}
        self.proc = psutil.Process(os.getpid())
        self._io = hasattr(self.proc, "io_counters")
        self._procs, self._listed_at = {}, -math.inf  # pid -> psutil.Process
        self._cpu_at: float | None = None  # when the processes' CPU was last read
        self._host_at = psutil.cpu_times()  # the host's, at this monitor's last reading
        # pid -> (chars, disk) I/O at its first and last sample; a worker born in a window first
        # reads ~0.25 MB of its own start-up; one that exits keeps its last count
        self._io_base, self._io_last = {}, {}
        self.log = None  # gpu_metrics.csv's gpulog.GpuLog
        # held by each tick and by the main thread opening and closing a window (an RLock)
        self._cv = threading.Condition()
        self._running = self._open = self._closing = False
        self._thread = self._tid = None  # the sampler thread, its native id while it runs
        self._values: dict = {}  # the last tick's NVML fields, for the log's row
        self._summary, self._t0, self._e0 = MonitorSummary(), 0.0, None

    @property
    def gpu_note(self) -> str | None:
        if self.gpu is not None:
            return ("MIG instance: its memory is sampled, power and energy are not (NVML gives "
                    "them for the whole GPU, other tenants included)") if self.gpu.mig else None
        if self.nvml is not None:
            return self.nvml.reason
        return "no NVIDIA GPU in use: GPU utilization/power absent; host CPU and RSS reported"

    def _processes(self, fresh: bool = False) -> list[psutil.Process]:
        if fresh or any(not p.is_running() for p in self._procs.values()) or \
                time.monotonic() - self._listed_at > self.LIST_EVERY_S:
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
        except (psutil.Error, OSError):  # no access: no figure
            return
        # read_chars (rchar) is Linux-only; elsewhere read_bytes is all there is
        chars, disk = getattr(io, "read_chars", io.read_bytes), io.read_bytes
        if p.pid == self.proc.pid and self._tid is not None:
            with contextlib.suppress(OSError, KeyError, ValueError):  # Linux only
                with open(f"/proc/self/task/{self._tid}/io") as f:  # the sampler's own reads
                    own = dict(line.split(":", 1) for line in f if ":" in line)
                chars, disk = chars - int(own["rchar"]), disk - int(own["read_bytes"])
        self._io_base.setdefault(p.pid, (chars, disk))
        self._io_last[p.pid] = (chars, disk)

    def _threads_cpu(self) -> tuple[float, int]:
        """The worker threads' CPU since the last sample (% of one core), and their count."""
        if not (tids := set(self.worker_tids())):
            return 0.0, 0
        try:
            now = {t.id: t.user_time + t.system_time for t in self.proc.threads() if t.id in tids}
        except psutil.Error:
            return 0.0, 0
        (then, last), at = self._thread_cpu, time.monotonic()
        self._thread_cpu = (at, now)
        used = sum(v - last.get(tid, 0.0) for tid, v in now.items())
        return (max(0.0, 100.0 * used / (at - then)) if at > then else 0.0), len(now)

    def _host_cpu(self) -> float:
        """The host's busy share (% of all cores) since this monitor's last reading, whichever
        thread took it: psutil.cpu_percent(None)'s baseline is per thread (a window opened on the
        main thread and read on the sampler's counted from the sampler's last reading)."""
        (b0, t0), now = _busy_total(self._host_at), psutil.cpu_times()
        (b1, t1), self._host_at = _busy_total(now), now
        return min(100.0, max(0.0, 100.0 * (b1 - b0) / (t1 - t0))) if t1 > t0 else 0.0

    def sample(self, fresh: bool = False, window: bool = True) -> Sample:
        """The host's CPU and the GPU's fields; for a window also its processes and memory."""
        main_cpu = main_rss = workers_cpu = workers_rss = dt = 0.0
        workers = threads = 0
        now = self.clock()
        if window:
            dt, self._cpu_at = (now - self._cpu_at if self._cpu_at is not None else 0.0), now
        for p in self._processes(fresh) if window else ():
            try:
                with p.oneshot():  # one read of /proc/<pid>/stat for both figures
                    cpu, rss = p.cpu_percent(None), p.memory_info().rss
                if self._io:  # macOS has no per-process I/O counters
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
        s = Sample(now, self._host_cpu(), main_cpu + workers_cpu, int(main_rss + workers_rss),
                   main_cpu, workers_cpu, int(main_rss), int(workers_rss), workers, threads, dt=dt)
        if self._io_last:
            s.read_bytes, s.disk_read_bytes = (sum(self._io_last[p][i] - self._io_base[p][i]
                                                   for p in self._io_last) for i in (0, 1))
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
                # the whole device's, other processes included: an upper bound, for a safe gate
                free, total = torch.cuda.mem_get_info(self.cuda_index)
                process_used, source = int(total - free), "mem_get_info_device"
            self._summary.device_used_source = source
            return reserved, process_used
        except RuntimeError as e:
            log.debug("device memory not read: %s", e)
            return None, None

    def open(self) -> None:
        with self._cv:
            self._summary = MonitorSummary()
            if not self.enabled:
                return
            self._io_base, self._io_last = {}, {}
            self.sample(fresh=True)  # primes cpu_percent and I/O baselines; covers no interval
            self._e0, self._t0 = nvml.energy_mj(self.gpu), self.clock()
            self._open = True

    def tick(self, fresh: bool = False, row: bool = True) -> None:
        """One reading for both the open window's sample and (`row`) the log's row."""
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
        # the window ends now, not at its last sample a few ms later (energy moves every 20 ms)
        ends = self.clock(), nvml.energy_mj(self.gpu)
        with self._cv:
            if self._running:  # the sampler thread takes it: its own /proc reads subtracted
                self._closing = True
                self._cv.notify_all()
                self._cv.wait_for(lambda: not self._closing)
            else:  # no sampler thread (begin() not called, or ended): taken here
                self.tick(fresh=True, row=False)
            return self.close(ends)

    def _run(self) -> None:
        # the sampler's own /proc reads (/proc/self/task/<tid>/io) are taken out of the main's
        self._tid = threading.get_native_id()
        with self._cv:
            while True:
                self._cv.wait_for(lambda: self._closing or not self._running, self.interval)
                closing, last = self._closing, not (self._closing or self._running)
                try:  # a window's last sample has no row (the log keeps its interval); the run's
                    # last moments have one, even for the shortest run
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
