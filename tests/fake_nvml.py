"""A test NVML: the pynvml calls gpubench makes, answering with NVML's documented semantics for
a scripted load on an injected clock: the driver and GPU the CPU suite's machines lack.

Semantics (NVML API reference; nvml.h; nvidia-ml-py's pynvml.py, whose error classes, field
ids and ctypes structs are used as they are):
- nvmlDeviceGetUtilizationRates: the percent of the last completed sample period (a grid of
  `util_period_s`, 1/6 s to 1 s by product) during which a kernel ran; memory likewise.
- nvmlDeviceGetPowerUsage: mW, the mean over the last `power_avg_s` (1 s on Ampere and newer;
  0 gives the instant reading of older GPUs).
- nvmlDeviceGetFieldValues([NVML_FI_DEV_POWER_INSTANT]): mW at the last power update in
  value.uiVal, nvmlReturn 0; where the driver lacks the field (`instant=False`) the call
  succeeds and the field's own nvmlReturn is NVML_ERROR_NOT_SUPPORTED.
- nvmlDeviceGetTotalEnergyConsumption: whole mJ since the driver loaded, refreshed every
  `update_s` (20-100 ms on real boards); `energy=False`: no counter (before Volta), NotSupported.
- MIG handles ("MIG-" UUIDs): memory of their own; utilization, power and energy raise
  NVMLError_NotSupported, and their power field reads NOT_SUPPORTED.
- `old_bindings=True`: an older nvidia-ml-py: names as bytes, no NVML_FI_DEV_POWER_INSTANT
  constant, no nvmlDeviceGetCurrentClocksEventReasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pynvml  # nvidia-ml-py: its error classes, constants and structs, not its driver calls


class Clock:
    """The injected time (seconds): the fake driver and the sampler under test both read it."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Load:
    """The GPU's scripted load: consecutive phases of (seconds, busy fraction, watts) from
    t=0; before it and after its end the GPU idles at `idle_w`."""

    def __init__(self, *phases: tuple[float, float, float], idle_w: float = 60.0):
        self.idle_w = idle_w
        self.spans: list[tuple[float, float, float, float]] = []  # (start, end, busy, watts)
        t = 0.0
        for seconds, busy, watts in phases:
            self.spans.append((t, t + seconds, busy, watts))
            t += seconds

    def _integral(self, a: float, b: float, which: int) -> float:
        """The integral over [a, b] of busy (which=2) or watts (which=3), idle outside."""
        idle = 0.0 if which == 2 else self.idle_w
        total, covered = 0.0, 0.0
        for span in self.spans:
            lo, hi = max(a, span[0]), min(b, span[1])
            if hi > lo:
                total += (hi - lo) * span[which]
                covered += hi - lo
        return total + (b - a - covered) * idle

    def busy(self, a: float, b: float) -> float:
        return self._integral(a, b, 2)

    def joules(self, a: float, b: float) -> float:
        return self._integral(a, b, 3)

    def watts(self, t: float) -> float:
        for start, end, _, w in self.spans:
            if start <= t < end:
                return w
        return self.idle_w


def _floor(t: float, step: float) -> float:
    """t down to the grid of `step` (a hair of slack: 2.3 / 0.05 is 45.99999 in floats)."""
    return math.floor(t / step + 1e-9) * step


@dataclass(frozen=True)
class Handle:
    uuid: str
    mig: bool = False


GPU_UUID = "GPU-3f5a1b2c-0000-1111-2222-333344445555"
MIG_UUID = "MIG-9a8b7c6d-0000-1111-2222-333344445555"


class FakeNvml:
    """Pass it where gpubench takes the pynvml module (NvmlDevice.nv, read_fields(nv, ...))."""

    # what gpubench catches and compares: pynvml's own classes and values
    NVMLError = pynvml.NVMLError
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM

    def __init__(self, load: Load, clock: Clock, *, util_period_s: float = 1 / 6,
                 power_avg_s: float = 1.0, update_s: float = 0.05, instant: bool = True,
                 energy: bool = True, old_bindings: bool = False, mem_used: int = 5 * 2**30,
                 mem_total: int = 80 * 2**30, mig_mem_used: int = 2 * 2**30,
                 mig_mem_total: int = 10 * 2**30, processes=(),
                 name: str = "NVIDIA H100 80GB HBM3", driver_loaded_at: float = -3600.0):
        self.load, self.clock = load, clock
        self.util_period_s, self.power_avg_s, self.update_s = util_period_s, power_avg_s, update_s
        self.instant, self.energy, self.old_bindings = instant, energy, old_bindings
        self.mem = {False: (mem_used, mem_total), True: (mig_mem_used, mig_mem_total)}
        self.processes, self.name, self.loaded_at = list(processes), name, driver_loaded_at
        self.devices = {GPU_UUID: Handle(GPU_UUID), MIG_UUID: Handle(MIG_UUID, mig=True)}
        self.calls: list[str] = []
        if not old_bindings:
            self.NVML_FI_DEV_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

    def _call(self, name: str, h: Handle, whole_gpu_only: bool = False) -> float:
        self.calls.append(name)
        if whole_gpu_only and h.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.clock()

    def _text(self, s: str):
        return s.encode() if self.old_bindings else s

    def _updated(self, name: str, h: Handle, whole_gpu_only: bool = False) -> float:
        """The driver's last power/energy update at or before now."""
        return _floor(self._call(name, h, whole_gpu_only), self.update_s)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append("nvmlDeviceGetHandleByUUID")
        if uuid not in self.devices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self.devices[uuid]

    def nvmlDeviceGetName(self, h):
        self._call("nvmlDeviceGetName", h)
        return self._text(self.name + (" MIG 1g.10gb" if h.mig else ""))

    def nvmlDeviceGetUtilizationRates(self, h):
        now = self._call("nvmlDeviceGetUtilizationRates", h, whole_gpu_only=True)
        p = self.util_period_s
        end = _floor(now, p)  # the last completed sample period
        busy = self.load.busy(end - p, end) / p
        return pynvml.c_nvmlUtilization_t(gpu=round(100 * busy), memory=round(50 * busy))

    def nvmlDeviceGetMemoryInfo(self, h):
        self._call("nvmlDeviceGetMemoryInfo", h)
        used, total = self.mem[h.mig]
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, h):
        now = self._updated("nvmlDeviceGetPowerUsage", h, whole_gpu_only=True)
        if self.power_avg_s <= 0:
            return int(self.load.watts(now) * 1000)
        return int(self.load.joules(now - self.power_avg_s, now) / self.power_avg_s * 1000)

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        now = self._updated("nvmlDeviceGetFieldValues", h)
        out = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for v, fid in zip(out, field_ids, strict=True):
            v.fieldId, v.timestamp = fid, int(now * 1e6)
            if fid == pynvml.NVML_FI_DEV_POWER_INSTANT and self.instant and not h.mig:
                v.valueType, v.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 0
                v.value.uiVal = int(self.load.watts(now) * 1000)
            else:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return out

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        now = self._updated("nvmlDeviceGetTotalEnergyConsumption", h, whole_gpu_only=True)
        if not self.energy:  # before Volta
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.load.joules(self.loaded_at, now) * 1000)  # whole mJ

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._call("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes]

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        self._call("nvmlDeviceGetClockInfo", h)
        return 1980

    def _reasons(self, h):
        self._call("nvmlDeviceGetCurrentClocksEventReasons", h, whole_gpu_only=True)
        return 0x4  # SW power cap

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._reasons(h)

    def nvmlGpmQueryDeviceSupport(self, h):
        self._call("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(isSupportedDevice=0)  # an Ampere board: no GPM
