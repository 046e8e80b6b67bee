"""NVML for the benchmarked GPU: its handle (by UUID), fields read one by one (None, never an
error, where missing), and the memory and energy arithmetic on them. Per nvml.h (R5xx):
nvmlDeviceGetUtilizationRates is the % of the past sample period (1/6 s to 1 s by product) in
which a kernel ran; nvmlDeviceGetPowerUsage (mW) a 1 s average on Ampere (but GA100) and newer,
NVML_FI_DEV_POWER_INSTANT (field 186) current power; nvmlDeviceGetTotalEnergyConsumption mJ since
the driver loaded (Volta and newer), refreshed every 20-100 ms (PETSc's PetscLogGpuEnergyMeter
notes). A MIG handle has its own memory, but no utilization, power or energy."""

from __future__ import annotations

import functools
from typing import NamedTuple

# The longest period an averaged reading covers: one taken sooner after a window opened covers
# what ran before (monitor.drop_straddling). On a grid of P s a reading is up to 2P old: P near
# 1 s can leak up to 2P - 1 s of the previous phase (docs/gpu.md).
NVML_AVERAGING_S = 1.0
AVERAGED_FIELDS = ("gpu_util", "mem_util")  # and power when it is the 1 s average
GPU_FIELDS = ("gpu_util", "mem_util", "gpu_mem_used", "power_w")  # a Sample's, each tick
POWER_INSTANT = "instant"  # NVML_FI_DEV_POWER_INSTANT
POWER_AVERAGE = "average"  # nvmlDeviceGetPowerUsage: a 1 s mean on Ampere and newer
ENERGY_COUNTER = "counter"
ENERGY_POWER_X_TIME = "power_x_time"


class NvmlDevice(NamedTuple):
    nv: object
    handle: object
    mig: bool = False


class Nvml:
    """NVML, initialised once per process (`get`); `reason` says why a device is missing."""

    def __init__(self) -> None:
        self.reason, self.driver = "", None
        try:
            import pynvml  # from the nvidia-ml-py package
            self.pynvml = pynvml
            pynvml.nvmlInit()
            self.driver = _str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:  # NVMLError_LibraryNotFound without a driver, ImportError, ...
            self.reason = (f"NVML unavailable ({type(e).__name__}): GPU utilization/power not "
                           "sampled")

    @classmethod
    @functools.cache  # one nvmlInit per process
    def get(cls) -> Nvml:
        return cls()

    def device_for(self, torch_index: int) -> NvmlDevice | None:
        """CUDA device `torch_index` or None, by UUID: NVML's order can differ from CUDA's, and
        on a MIG instance index i is the whole GPU."""
        if self.driver is None:
            return None
        try:
            import torch
            uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
        except Exception as e:
            self.reason = f"no UUID for CUDA device {torch_index}: {e}"
            return None
        if (dev := find_device(self.pynvml, uuid)) is None:
            self.reason = f"NVML has no device with UUID {uuid}: GPU telemetry not sampled"
        return dev


def find_device(nv, uuid: str) -> NvmlDevice | None:
    """The device of a UUID as CUDA prints it, prefixed or bare ("GPU-", "MIG-" tried)."""
    bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
    for u in [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{bare}", f"MIG-{bare}"]:
        if (h := or_none(nv, functools.partial(nv.nvmlDeviceGetHandleByUUID, u))) is not None:
            return NvmlDevice(nv, h, u.startswith("MIG-"))
    return None


def read_fields(nv, handle, mig: bool = False, pid: int | None = None) -> tuple[dict, dict]:
    """({field: value}, {field: error}), each read apart: one NotSupported must not drop all."""
    values, errors = {}, {}

    def one(names, fn):
        try:
            values.update(zip(names, fn(), strict=True))
        except nv.NVMLError as e:
            errors.update(dict.fromkeys(names, str(e) or type(e).__name__))

    one(("gpu_util", "mem_util"), lambda: (
        float((u := nv.nvmlDeviceGetUtilizationRates(handle)).gpu), float(u.memory)))
    one(("gpu_mem_used", "gpu_mem_free"), lambda: (
        int((m := nv.nvmlDeviceGetMemoryInfo(handle)).used), int(m.free)))
    if mig:
        errors["power_w"] = "a MIG instance has no power reading of its own"
    else:
        one(("power_w", "power_source"), lambda: read_power(nv, handle))
    if pid is not None:
        one(("process_mem_used",), lambda: (process_memory(nv, handle, pid),))
    return {k: v for k, v in values.items() if v is not None}, errors


def read_power(nv, handle) -> tuple[float, str]:
    """(watts, source): instant where given, else nvmlDeviceGetPowerUsage, taken as averaged."""
    field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)  # absent in older nvidia-ml-py
    # None: no such field, or a driver without nvmlDeviceGetFieldValues
    v = or_none(nv, lambda: nv.nvmlDeviceGetFieldValues(handle, [field])[0]) if field else None
    if v is not None and v.nvmlReturn == 0:  # NVML_SUCCESS; an unknown field fails on its own
        return v.value.uiVal / 1000.0, POWER_INSTANT
    return nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, POWER_AVERAGE


def or_none(nv, fn):
    try:
        return fn()
    except nv.NVMLError:
        return None


def energy_mj(dev: NvmlDevice | None) -> float | None:
    """The energy counter (mJ); None on a MIG instance (the whole GPU's) or without one."""
    if dev is None or dev.mig:
        return None
    return or_none(dev.nv, lambda: float(dev.nv.nvmlDeviceGetTotalEnergyConsumption(dev.handle)))


def process_memory(nv, handle, pid: int) -> int | None:
    """Device memory of process `pid`; None where a PID namespace hides it, or the driver."""
    used = [int(p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid == pid and p.usedGpuMemory is not None]
    return sum(used) if used else None


def gpu_name(dev: NvmlDevice) -> str | None:
    """The board's name (older nvidia-ml-py returns bytes)."""
    return or_none(dev.nv, lambda: _str(dev.nv.nvmlDeviceGetName(dev.handle)))


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def memory_gate_bytes(torch_peak_reserved: int | None, device_used_peak: int | None,
                      non_torch_peak: int | None) -> int | None:
    """Device memory a run needs: the peak sampled in use, or torch's exact peak reserved plus
    the non-torch peak (about constant once warm) where larger (sampling can miss the peak)."""
    torch_side = None if torch_peak_reserved is None else \
        torch_peak_reserved + (non_torch_peak or 0)
    return max((v for v in (device_used_peak, torch_side) if v is not None), default=None)


def energy_per_image(energy_j: float | None, images: int) -> float | None:
    """GPU energy over the images it processed (under torchrun both all ranks'); None without."""
    return energy_j / images if energy_j is not None and images > 0 else None


def window_energy_j(e0_mj: float | None, e1_mj: float | None, mean_power_w: float | None,
                    seconds: float) -> tuple[float | None, str | None]:
    """(energy, source): the counter's difference (off by one update at most; none when it went
    back: a driver reload), else mean power x time (biased by the 1 s average)."""
    if e0_mj is not None and e1_mj is not None and e1_mj >= e0_mj:
        return (e1_mj - e0_mj) / 1000.0, ENERGY_COUNTER
    if mean_power_w is not None:
        return mean_power_w * seconds, ENERGY_POWER_X_TIME
    return None, None
