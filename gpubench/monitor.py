"""Telemetry sampled in a background thread while a measurement window runs.

Nothing here touches the training hot path: the thread wakes every `interval` seconds, reads
NVML (GPU utilization, memory, power, energy) and psutil (host CPU, RSS of the main process and
its DataLoader workers), and goes back to sleep. Without an NVIDIA driver the GPU fields are
absent and one info line says so.
"""

from __future__ import annotations

import logging
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
    host_cpu: float
    procs_cpu: float
    rss: int
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
            "samples": len(self.samples),
        }


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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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

    def _processes(self) -> list[psutil.Process]:
        # keep Process objects between samples: cpu_percent() measures since the previous call
        try:
            current = [self.proc, *self.proc.children(recursive=True)]
        except psutil.Error:
            current = [self.proc]
        alive = {}
        for p in current:
            alive[p.pid] = self._procs.get(p.pid, p)
        self._procs = alive
        return list(alive.values())

    def sample(self) -> Sample:
        cpu = rss = 0.0
        for p in self._processes():
            try:
                cpu += p.cpu_percent(None)
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        s = Sample(time.perf_counter(), psutil.cpu_percent(None), cpu, int(rss))
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
        while not self._stop.wait(self.interval):
            self._summary.samples.append(self.sample())

    def start(self) -> None:
        self._summary = MonitorSummary()
        if not self.enabled:
            return
        self.sample()  # primes cpu_percent baselines; its values cover no interval
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
        summ.samples.append(self.sample())  # a short window still gets one real sample
        summ.seconds = time.perf_counter() - self._t0
        e1 = self._energy_mj()
        if e1 is not None and self._e0 is not None:
            summ.energy_j = (e1 - self._e0) / 1000.0
        elif summ.mean("power_w") is not None:
            summ.energy_j = summ.mean("power_w") * summ.seconds
        return summ
