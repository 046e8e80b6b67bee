"""Telemetry sampled in a background thread while a measurement window runs.

Nothing here touches the training hot path: the thread wakes every `interval` seconds, reads
NVML (GPU utilization, memory, power, energy) and psutil (host CPU; CPU, RSS and bytes read of
the main process and of its DataLoader workers, apart), and goes back to sleep. Without an
NVIDIA driver the GPU fields are absent and one info line says so.

Workers are the run's child processes (DataLoader workers; with spawn/forkserver the start-up
helper process too). Their RSS counts pages shared with the main process (a forked or shared
preload cache) once per process, so summed RSS overstates the RAM really used.

Bytes read come from each process's own I/O counters (/proc/<pid>/io), which is more specific
than whole-disk counters that other processes on the host also move:
- `read_mb_per_s`: bytes the run's processes read (read(2): the dataset's files, from the page
  cache or the disk; also a few KB/s of the sampler's own /proc reads);
- `disk_read_mb_per_s`: the part that the storage device itself had to deliver (0 when the
  folder sits in the page cache, or where the kernel does not account it).
With persistent_workers=false, workers restart each epoch; one counts from the first sample
that sees it to its last one.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field

import psutil

log = logging.getLogger(__name__)


class Nvml:
    """One NVML handle for the benchmarked device, or None with the reason."""

    _instance: Nvml | None = None

    def __init__(self) -> None:
        self.handle = None
        self.reason = ""
        self.driver = None
        try:
            import pynvml  # from the nvidia-ml-py package

            self.pynvml = pynvml
            pynvml.nvmlInit()
            self.driver = _str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:  # NVMLError_LibraryNotFound without a driver, ImportError, ...
            self.reason = f"NVML unavailable ({type(e).__name__}): GPU utilization/power not sampled"

    @classmethod
    def get(cls) -> Nvml:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def handle_for(self, torch_index: int):
        """NVML's index order can differ from CUDA's (CUDA_VISIBLE_DEVICES, PCI order), so
        match the device by UUID and fall back to the index."""
        if self.driver is None:
            return None
        nv = self.pynvml
        try:
            import torch

            uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
            return nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:
            try:
                return nv.nvmlDeviceGetHandleByIndex(torch_index)
            except Exception as e:
                self.reason = f"NVML has no handle for device {torch_index}: {e}"
                return None


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


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
    read_bytes: int | None = None  # since the window opened (cumulative)
    disk_read_bytes: int | None = None
    gpu_util: float | None = None
    mem_util: float | None = None
    gpu_mem_used: int | None = None
    power_w: float | None = None


@dataclass
class MonitorSummary:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    energy_j: float | None = None

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
            "energy_j": self.energy_j,
            "host_cpu_util_mean": self.mean("host_cpu"),
            "process_cpu_util_mean": self.mean("procs_cpu"),
            "peak_rss_bytes": self.max("rss"),
            "main_cpu_util_mean": self.mean("main_cpu"),
            "workers_cpu_util_mean": self.mean("workers_cpu") if self.max("workers") else None,
            "main_peak_rss_bytes": self.max("main_rss"),
            "workers_peak_rss_bytes": self.max("workers_rss") if self.max("workers") else None,
            "workers_max": self.max("workers"),
            "read_bytes": self.max("read_bytes"),
            "read_mb_per_s": self._rate("read_bytes"),
            "disk_read_bytes": self.max("disk_read_bytes"),
            "disk_read_mb_per_s": self._rate("disk_read_bytes"),
            "samples": len(self.samples),
        }

    def _rate(self, name: str) -> float | None:
        total = self.max(name)  # cumulative counters: the largest is the last
        if total is None or self.seconds <= 0:
            return None
        return total / self.seconds / 1e6


class _IoTally:
    """Bytes read by a set of processes since a start, from per-process counters. Each process
    counts from the first sample that sees it: a worker born inside a window first reads
    ~0.25 MB of its own start-up, which is not the dataset's; one that exits keeps what it had
    read at its last sample."""

    def __init__(self) -> None:
        self.base: dict[int, tuple[int, int]] = {}
        self.last: dict[int, tuple[int, int]] = {}

    def reset(self) -> None:
        self.base, self.last = {}, {}

    def update(self, pid: int, chars: int, disk: int) -> None:
        self.base.setdefault(pid, (chars, disk))
        self.last[pid] = (chars, disk)

    def totals(self) -> tuple[int, int]:
        chars = sum(self.last[p][0] - self.base[p][0] for p in self.last)
        disk = sum(self.last[p][1] - self.base[p][1] for p in self.last)
        return chars, disk


def _thread_io(tid: int) -> tuple[int, int]:
    """(rchar, read_bytes) of one thread of this process; zeros where Linux does not say."""
    try:
        with open(f"/proc/self/task/{tid}/io") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["rchar"]), int(fields["read_bytes"])
    except (OSError, KeyError, ValueError):
        return 0, 0


class Monitor:
    """Start before a window opens, stop after it closes; `stop()` returns the summary."""

    def __init__(self, device: str, interval: float = 0.2, enabled: bool = True):
        self.interval = interval
        self.enabled = enabled
        self.handle = None
        self.nvml: Nvml | None = None
        if enabled and device == "cuda":
            import torch

            self.nvml = Nvml.get()
            self.handle = self.nvml.handle_for(torch.cuda.current_device())
        self.proc = psutil.Process(os.getpid())
        self._procs: dict[int, psutil.Process] = {}
        self._listed_at = -math.inf
        # per-process I/O counters: Linux and Windows have them, macOS does not
        self._io = _IoTally() if hasattr(self.proc, "io_counters") else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tid: int | None = None  # the sampler thread's native id while it runs
        self._summary = MonitorSummary()

    @property
    def gpu_note(self) -> str | None:
        """One info line when GPU fields will be absent."""
        if self.handle is not None:
            return None
        if self.nvml is not None:
            return self.nvml.reason
        return "no NVIDIA GPU in use: GPU utilization/power absent; host CPU and RSS reported"

    def _energy_mj(self) -> float | None:
        if self.handle is None:
            return None
        try:  # Volta and newer: a cumulative counter, exact where integrating power is not
            return float(self.nvml.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:
            return None

    # Listing children reads /proc/<pid>/stat of every process on the host (1.5 ms with 80
    # processes here, far more on a busy node) while holding the GIL, so the list is refreshed
    # at most this often, and at once when a known worker has gone or at a window's edges.
    LIST_EVERY_S = 1.0

    def _processes(self, fresh: bool = False) -> list[psutil.Process]:
        gone = any(not p.is_running() for p in self._procs.values())
        if fresh or gone or time.monotonic() - self._listed_at > self.LIST_EVERY_S:
            try:
                current = [self.proc, *self.proc.children(recursive=True)]
            except psutil.Error:
                current = [self.proc]
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
        self._io.update(p.pid, chars, disk)

    def sample(self, fresh: bool = False) -> Sample:
        main_cpu = main_rss = workers_cpu = workers_rss = 0.0
        workers = 0
        for p in self._processes(fresh):
            try:
                with p.oneshot():  # one read of /proc/<pid>/stat for both figures
                    cpu, rss = p.cpu_percent(None), p.memory_info().rss
                if self._io is not None:
                    self._read_io(p)
            except psutil.Error:  # a worker that exited between listing and reading
                continue
            if p.pid == self.proc.pid:
                main_cpu, main_rss = cpu, rss
            else:
                workers_cpu += cpu
                workers_rss += rss
                workers += 1
        s = Sample(
            time.perf_counter(), psutil.cpu_percent(None), main_cpu + workers_cpu,
            int(main_rss + workers_rss), main_cpu, workers_cpu, int(main_rss), int(workers_rss),
            workers,
        )
        if self._io is not None and self._io.last:
            s.read_bytes, s.disk_read_bytes = self._io.totals()
        if self.handle is not None:
            nv = self.nvml.pynvml
            try:
                u = nv.nvmlDeviceGetUtilizationRates(self.handle)
                s.gpu_util, s.mem_util = float(u.gpu), float(u.memory)
                s.gpu_mem_used = int(nv.nvmlDeviceGetMemoryInfo(self.handle).used)
                s.power_w = nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
            except nv.NVMLError as e:
                log.debug("NVML sample failed: %s", e)
        return s

    def _run(self) -> None:
        # the sampler's own /proc reads land in the main process's I/O counters: its thread's
        # counters (/proc/self/task/<tid>/io) are taken back out
        self._tid = threading.get_native_id()
        while not self._stop.wait(self.interval):
            self._summary.samples.append(self.sample())
        self._summary.samples.append(self.sample(fresh=True))  # a short window gets one too
        self._tid = None

    def start(self) -> None:
        self._summary = MonitorSummary()
        if not self.enabled:
            return
        if self._io is not None:
            self._io.reset()
        self.sample(fresh=True)  # primes cpu_percent and I/O baselines; covers no interval
        self._e0 = self._energy_mj()
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpubench-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> MonitorSummary:
        if self._thread is None:
            return self._summary
        self._stop.set()
        self._thread.join()
        self._thread = None
        summ = self._summary
        summ.seconds = time.perf_counter() - self._t0
        e1 = self._energy_mj()
        if e1 is not None and self._e0 is not None:
            summ.energy_j = (e1 - self._e0) / 1000.0
        elif summ.mean("power_w") is not None:
            summ.energy_j = summ.mean("power_w") * summ.seconds
        return summ
