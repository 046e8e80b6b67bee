"""Telemetry sampled in a background thread while a measurement window runs.

Nothing here touches the training hot path: the thread wakes every `interval` seconds, reads
NVML (GPU utilization, memory, power, energy, each field on its own: gpubench/nvml.py), the
device memory this process has in use, and psutil (host CPU; CPU, RSS and bytes read of
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from gpubench.telemetry.nvml import (  # noqa: F401  (Nvml re-exported: env.facts reads the driver)
    GPU_FIELDS,
    MIN_ENERGY_COUNTER_S,
    Nvml,
    energy_per_image,
    memory_gate_bytes,
    read_fields,
    window_energy_j,
)

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


@dataclass
class MonitorSummary:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    energy_j: float | None = None
    device_used_source: str | None = None
    nvml_unsupported: list[str] = field(default_factory=list)

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
            "device_used_peak_bytes": self.max("device_used"),
            "device_used_source": self.device_used_source,
            "non_torch_peak_bytes": self.non_torch_peak(),
            "nvml_unsupported": self.nvml_unsupported or None,
            "samples": len(self.samples),
        }

    def non_torch_peak(self) -> int | None:
        """The most device memory seen in use outside torch's caching allocator (context,
        library workspaces, NCCL, nvJPEG): in use minus reserved, sample by sample."""
        v = [s.device_used - s.torch_reserved for s in self.samples
             if s.device_used is not None and s.torch_reserved is not None]
        return max(0, max(v)) if v else None

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

    def __init__(self, device: str, interval: float = 0.2, enabled: bool = True,
                 worker_pids: Callable[[], Iterable[int]] | None = None):
        self.interval = interval
        # the loader's workers (and what they start); None: every child of this process
        self.worker_pids = worker_pids
        self.enabled = enabled
        self.handle = None
        self.nvml: Nvml | None = None
        self.mig = False
        self.cuda_index: int | None = None
        if enabled and device == "cuda":
            import torch

            # the sampler thread reads device memory by this explicit index: a new thread's
            # current CUDA device is 0, not the rank's device torchrun set in the main thread
            self.cuda_index = torch.cuda.current_device()
            self.nvml = Nvml.get()
            self.handle = self.nvml.handle_for(self.cuda_index)
            self.mig = bool(getattr(self.nvml, "mig", False))
        self._unsupported: dict[str, str] = {}
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
            if self.mig:
                return ("MIG instance: its memory is sampled, power and energy are not (NVML "
                        "gives them for the whole GPU, other tenants included)")
            return None
        if self.nvml is not None:
            return self.nvml.reason
        return "no NVIDIA GPU in use: GPU utilization/power absent; host CPU and RSS reported"

    def _energy_mj(self) -> float | None:
        if self.handle is None or self.mig:  # a MIG instance: whole-GPU energy only
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
            current = [self.proc, *self._workers()]
            # keep Process objects between samples: cpu_percent() measures since the last call
            self._procs = {p.pid: self._procs.get(p.pid, p) for p in current}
            self._listed_at = time.monotonic()
        return list(self._procs.values())

    def _workers(self) -> list[psutil.Process]:
        if self.worker_pids is None:
            try:
                return self.proc.children(recursive=True)
            except psutil.Error:
                return []
        found: list[psutil.Process] = []
        for pid in set(self.worker_pids()):
            try:
                w = psutil.Process(pid)
                found += [w, *w.children(recursive=True)]
            except psutil.Error:  # a worker that exited since the loader listed it
                continue
        return found

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
        values: dict = {}
        if self.handle is not None:
            values, errors = read_fields(self.nvml.pynvml, self.handle, self.mig, self.proc.pid)
            for k in GPU_FIELDS:
                setattr(s, k, values.get(k))
            for k, why in errors.items():
                if k not in self._unsupported:
                    log.debug("NVML %s not read: %s", k, why)
                    self._unsupported[k] = why
        if self.cuda_index is not None:
            s.torch_reserved, s.device_used = self._device_memory(values.get("process_mem_used"))
        return s

    def _device_memory(self, process_used: int | None) -> tuple[int | None, int | None]:
        import torch

        try:
            reserved = int(torch.cuda.memory_reserved(self.cuda_index))
            if process_used is not None:
                self._summary.device_used_source = "nvml_process"
                return reserved, process_used
            # no per-process figure: the whole device's memory in use, other processes
            # included (an upper bound, so the gate errs on the safe side)
            free, total = torch.cuda.mem_get_info(self.cuda_index)
            self._summary.device_used_source = "mem_get_info_device"
            return reserved, int(total - free)
        except RuntimeError as e:
            log.debug("device memory not read: %s", e)
            return None, None

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
        summ.nvml_unsupported = sorted(self._unsupported)
        summ.energy_j = window_energy_j(self._e0, e1, summ.mean("power_w"), summ.seconds)
        return summ

