"""NVML for the benchmarked GPU: its handle (by UUID, MIG instances included), its fields read
one by one, and the device-memory and energy arithmetic built on them. Everything degrades to
None without a driver; no function here raises for a missing reading.

What the readings cover (NVML API reference, nvml.h of the R5xx drivers; nvidia-ml-py's pynvml):
- nvmlDeviceGetUtilizationRates: "percent of time over the past sample period during which one
  or more kernels was executing", a period "between 1 second and 1/6 second, depending on the
  product"; NotSupported on a MIG handle.
- nvmlDeviceGetPowerUsage (mW): "on Ampere (except GA100) or newer GPUs, the API returns power
  averaged over 1 sec interval"; NVML_FI_DEV_POWER_INSTANT (field 186, nvmlDeviceGetFieldValues,
  each field with its own nvmlReturn) is the current power on all architectures.
- nvmlDeviceGetTotalEnergyConsumption: mJ "since the driver was last reloaded", Volta and newer,
  refreshed every 20-100 ms (PETSc's notes on PetscLogGpuEnergyMeter).
- nvmlDeviceGetHandleByUUID takes "GPU-..." and "MIG-..." UUIDs; a MIG handle has its own
  memory but no utilization, power or energy of its own.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

# The longest period an averaged NVML reading covers: utilization's sample period (1/6 s to
# 1 s by product) and nvmlDeviceGetPowerUsage's 1 s average on Ampere and newer. A reading
# taken less than this after a window opened describes (partly) what ran before it, so the
# window drops it (drop_straddling in monitor.py), and a GPU window shorter than this has no
# utilization at all. Where utilization's period is a fixed grid of P seconds, a reading is
# up to 2P old at its start: exact for P <= 0.5 s; a product with P near 1 s can still leak up
# to 2P - 1 s of the previous phase into the first kept readings (docs/gpu.md, NVML readings).
NVML_AVERAGING_S = 1.0

# readings averaged over NVML_AVERAGING_S (power only when it comes from the 1 s average)
AVERAGED_FIELDS = ("gpu_util", "mem_util")
POWER_INSTANT = "instant"  # NVML_FI_DEV_POWER_INSTANT
POWER_AVERAGE = "average"  # nvmlDeviceGetPowerUsage: a 1 s mean on Ampere and newer


class NvmlDevice(NamedTuple):
    """One device's NVML binding (the pynvml module, or a stand-in), handle and kind."""
    nv: object
    handle: object
    mig: bool = False


class Nvml:
    """One NVML handle for the benchmarked device, or None with the reason."""

    def __init__(self) -> None:
        self.reason, self.driver, self.mig = "", None, False
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

    def handle_for(self, torch_index: int):
        """The NVML handle of CUDA device `torch_index`, or None (with self.reason). By UUID,
        never by index: NVML's order can differ from CUDA's (CUDA_VISIBLE_DEVICES, PCI order),
        and on a MIG instance index i is the whole GPU, other tenants included."""
        if self.driver is None:
            return None
        try:
            import torch

            uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
        except Exception as e:
            self.reason = f"no UUID for CUDA device {torch_index}: {e}"
            return None
        handle, self.mig = find_handle(self.pynvml, uuid)
        if handle is None:
            self.reason = f"NVML has no device with UUID {uuid}: GPU telemetry not sampled"
        return handle


def find_handle(nv, uuid: str) -> tuple[object | None, bool]:
    """(handle, is_mig) for a UUID as CUDA prints it: bare (NVML wants "GPU-" for a whole GPU,
    "MIG-" for a MIG instance: both are tried), or already prefixed."""
    bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
    tries = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{bare}", f"MIG-{bare}"]
    for u in tries:
        try:
            return nv.nvmlDeviceGetHandleByUUID(u), u.startswith("MIG-")
        except nv.NVMLError:
            continue
    return None, False


# read by the sampler (monitor.py) once per tick, for its window and gpu_metrics.csv's row
GPU_FIELDS = ("gpu_util", "mem_util", "gpu_mem_used", "power_w")


def read_fields(nv, handle, mig: bool = False, pid: int | None = None) -> tuple[dict, dict]:
    """({field: value} for the fields that read, {field: error text} for those that did not),
    each in its own try: one NotSupported (a MIG instance, a board without power readings) must
    not drop the others. On a MIG instance the whole-GPU fields (power: other tenants included)
    are not read at all. `power_source`: POWER_INSTANT or POWER_AVERAGE."""
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
    """(watts, source): the instant reading where the bindings and the driver give it, else
    nvmlDeviceGetPowerUsage (treated as averaged: NVML does not say which it is)."""
    field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)  # absent in older nvidia-ml-py
    if field is not None:
        try:
            v = nv.nvmlDeviceGetFieldValues(handle, [field])[0]
            if v.nvmlReturn == 0:  # NVML_SUCCESS; an unknown field fails on its own, not the call
                return v.value.uiVal / 1000.0, POWER_INSTANT
        except nv.NVMLError:  # a driver without nvmlDeviceGetFieldValues
            pass
    return nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, POWER_AVERAGE


def or_none(nv, fn):
    """fn()'s reading, or None where NVML has none (NotSupported here, a MIG instance)."""
    try:
        return fn()
    except nv.NVMLError:
        return None


def energy_mj(dev: NvmlDevice | None) -> float | None:
    """The driver's energy counter (mJ), or None: none on a MIG instance (the whole GPU's,
    other tenants included), nor where the board lacks it."""
    if dev is None or dev.mig:
        return None
    return or_none(dev.nv, lambda: float(dev.nv.nvmlDeviceGetTotalEnergyConsumption(dev.handle)))


def process_memory(nv, handle, pid: int) -> int | None:
    """Device memory in use by process `pid` (context and library workspaces included, which
    torch's allocator counters leave out). None where a PID namespace (containers) hides the
    host PID, or the driver withholds the figure (usedGpuMemory None)."""
    used = [int(p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid == pid and p.usedGpuMemory is not None]
    return sum(used) if used else None


def gpu_name(dev: NvmlDevice) -> str | None:
    """The board's name; older nvidia-ml-py returns bytes (printed b'...' by str())."""
    return or_none(dev.nv, lambda: _str(dev.nv.nvmlDeviceGetName(dev.handle)))


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def memory_gate_bytes(torch_peak_reserved: int | None, device_used_peak: int | None,
                      non_torch_peak: int | None) -> int | None:
    """Device memory a run needs, for the memory ceiling: the larger of torch's peak reserved
    bytes plus what lives outside its allocator, and the peak sampled in use. Sampling can
    miss torch's peak (exact from its own counters), while the memory outside the allocator is
    close to constant once warm, so their sum is the tighter bound."""
    torch_side = None if torch_peak_reserved is None else \
        torch_peak_reserved + (non_torch_peak or 0)
    return max((v for v in (device_used_peak, torch_side) if v is not None), default=None)


def energy_per_image(energies_j: list[float | None], images: list[int]) -> float | None:
    """Every rank's GPU energy over every rank's images (rank 0's alone undercounts by the world
    size); None if any rank has no figure."""
    if not energies_j or any(e is None for e in energies_j) or sum(images) <= 0:
        return None
    return sum(energies_j) / sum(images)


ENERGY_COUNTER = "counter"
ENERGY_POWER_X_TIME = "power_x_time"


def window_energy_j(e0_mj: float | None, e1_mj: float | None, mean_power_w: float | None,
                    seconds: float) -> tuple[float | None, str | None]:
    """(energy, source) of one window: the driver's counter whenever it was read at both ends,
    whatever the window's length, else the mean sampled power x the window's length.

    The counter moves in whole mJ every 20-100 ms, so one window's difference is off by up to
    one update, but a phase's sum of differences stays within one update per window. Mean
    power x time is biased where readings average over time before the window (a 1 s mean):
    kept only without a counter (before Volta). A counter that went backwards (a driver
    reload) is no reading."""
    if e0_mj is not None and e1_mj is not None and e1_mj >= e0_mj:
        return (e1_mj - e0_mj) / 1000.0, ENERGY_COUNTER
    if mean_power_w is not None:
        return mean_power_w * seconds, ENERGY_POWER_X_TIME
    return None, None
