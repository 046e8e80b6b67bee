"""NVML for the benchmarked GPU: its handle (by UUID, MIG instances included), its fields read
one by one, and the device-memory and energy arithmetic built on them. Everything degrades to
None without a driver; no function here raises for a missing reading.

What NVML's readings cover (NVML API reference, nvml.h of the R5xx drivers; nvidia-ml-py's
pynvml.py for the Python bindings):
- nvmlDeviceGetUtilizationRates: "percent of time over the past sample period during which one
  or more kernels was executing"; "each sample period may be between 1 second and 1/6 second,
  depending on the product" (nvmlUtilization_t). "On MIG-enabled GPUs, querying device
  utilization rates is not currently supported" (NotSupported on a MIG handle).
- nvmlDeviceGetPowerUsage: milliwatts; "on Ampere (except GA100) or newer GPUs, the API returns
  power averaged over 1 sec interval. On GA100 and older architectures, instantaneous power is
  returned. See NVML_FI_DEV_POWER_AVERAGE and NVML_FI_DEV_POWER_INSTANT".
- NVML_FI_DEV_POWER_INSTANT (186, read with nvmlDeviceGetFieldValues): "Current GPU power,
  supported on all architectures", milliwatts in value.uiVal; the call succeeds and each
  field carries its own nvmlReturn. Older nvidia-ml-py releases lack the constant.
- nvmlDeviceGetTotalEnergyConsumption: "total energy consumption for this GPU in millijoules
  (mJ) since the driver was last reloaded", Volta and newer; the driver refreshes it every
  20-100 ms (PETSc's notes on PetscLogGpuEnergyMeter), in whole millijoules.
- nvmlDeviceGetHandleByUUID takes "GPU-..." and "MIG-..." UUIDs; a MIG handle has its own
  memory but no utilization, power or energy of its own.
"""

from __future__ import annotations

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
    """One device's NVML binding (the pynvml module, or a stand-in for it), handle and kind."""

    nv: object
    handle: object
    mig: bool = False


class Nvml:
    """One NVML handle for the benchmarked device, or None with the reason."""

    _instance: Nvml | None = None

    def __init__(self) -> None:
        self.handle = None
        self.reason = ""
        self.driver = None
        self.mig = False
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
        """The NVML handle of CUDA device `torch_index`, or None (with self.reason).

        NVML's index order can differ from CUDA's (CUDA_VISIBLE_DEVICES, PCI order), so the
        device is found by UUID. CUDA reports the UUID bare; NVML wants it prefixed "GPU-" for
        a whole GPU and "MIG-" for a MIG instance, so both are tried. There is no fallback to
        an NVML index: on a MIG instance or under a remapped CUDA_VISIBLE_DEVICES, index i is
        another (or the whole) GPU, and its figures would include other tenants."""
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

    def device_for(self, torch_index: int) -> NvmlDevice | None:
        handle = self.handle_for(torch_index)
        return None if handle is None else NvmlDevice(self.pynvml, handle, self.mig)


def find_handle(nv, uuid: str) -> tuple[object | None, bool]:
    """(handle, is_mig) for a UUID as CUDA prints it (bare, or already prefixed)."""
    bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
    tries = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{bare}", f"MIG-{bare}"]
    for u in tries:
        try:
            return nv.nvmlDeviceGetHandleByUUID(u), u.startswith("MIG-")
        except nv.NVMLError:
            continue
    return None, False


# Fields read from NVML, each in its own try: one NotSupported (MIG instances have no
# utilization or power counters of their own; some boards lack power readings) must not drop
# the others. On a MIG instance the fields NVML would only give for the whole GPU (power,
# energy: other tenants included) are not read at all. The run's sampler (monitor.py) reads
# through here once per tick, for its window and for gpu_metrics.csv's row (gpulog.py).
GPU_FIELDS = ("gpu_util", "mem_util", "gpu_mem_used", "power_w")
WHOLE_GPU_ONLY = ("power_w", "energy")


def read_fields(nv, handle, mig: bool = False, pid: int | None = None) -> tuple[dict, dict]:
    """({field: value} for the fields that read, {field: error text} for those that did not).
    `power_source` says which power reading `power_w` is (POWER_INSTANT or POWER_AVERAGE)."""
    values: dict = {}
    errors: dict = {}

    def one(names, fn):
        try:
            got = fn()
        except nv.NVMLError as e:
            for n in names:
                errors[n] = str(e) or type(e).__name__
            return
        for n, v in zip(names, got if len(names) > 1 else (got,), strict=True):
            values[n] = v

    def util():
        u = nv.nvmlDeviceGetUtilizationRates(handle)
        return float(u.gpu), float(u.memory)

    def memory():
        m = nv.nvmlDeviceGetMemoryInfo(handle)
        return int(m.used), int(m.free)

    one(("gpu_util", "mem_util"), util)
    one(("gpu_mem_used", "gpu_mem_free"), memory)
    if mig:
        errors["power_w"] = "a MIG instance has no power reading of its own"
    else:
        one(("power_w", "power_source"), lambda: read_power(nv, handle))
    if pid is not None:
        one(("process_mem_used",), lambda: process_memory(nv, handle, pid))
    values = {k: v for k, v in values.items() if v is not None}
    return values, errors


def read_power(nv, handle) -> tuple[float, str]:
    """(watts, source): the instant reading where the bindings and the driver give it, else
    nvmlDeviceGetPowerUsage (a 1 s mean on Ampere and newer, instant on older GPUs; NVML does
    not say which, so it is treated as averaged). Raises NVMLError when neither reads."""
    field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)  # absent in older nvidia-ml-py
    if field is not None:
        try:
            v = nv.nvmlDeviceGetFieldValues(handle, [field])[0]
            if v.nvmlReturn == 0:  # NVML_SUCCESS; an unknown field fails on its own, not the call
                return v.value.uiVal / 1000.0, POWER_INSTANT
        except nv.NVMLError:  # a driver without nvmlDeviceGetFieldValues
            pass
    return nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, POWER_AVERAGE


def energy_mj(dev: NvmlDevice | None) -> float | None:
    """The driver's energy counter (mJ since it loaded; Volta and newer), or None: none on a
    MIG instance (the counter is the whole GPU's, other tenants included), nor where the
    board lacks it."""
    if dev is None or dev.mig:
        return None
    try:
        return float(dev.nv.nvmlDeviceGetTotalEnergyConsumption(dev.handle))
    except dev.nv.NVMLError:
        return None


def process_memory(nv, handle, pid: int) -> int | None:
    """Device memory in use by process `pid` (context, cuBLAS/cuDNN workspaces, NCCL and
    nvJPEG buffers included, which torch's allocator counters leave out). None where NVML
    does not say: a PID namespace (containers) hides the host PID, or the driver withholds the
    figure (usedGpuMemory None)."""
    used = None
    for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == pid and p.usedGpuMemory is not None:
            used = (used or 0) + int(p.usedGpuMemory)
    return used


def device_name(dev: NvmlDevice) -> str | None:
    """The board's name; older nvidia-ml-py returns bytes (printed b'...' by str())."""
    try:
        return _str(dev.nv.nvmlDeviceGetName(dev.handle))
    except dev.nv.NVMLError:
        return None


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def memory_gate_bytes(torch_peak_reserved: int | None, device_used_peak: int | None,
                      non_torch_peak: int | None) -> int | None:
    """Device memory a run needs, for the memory ceiling: the larger of torch's peak reserved
    bytes plus what lives outside its allocator, and the peak sampled in use. Sampling can
    miss the instant of torch's peak (exact from its own counters), while the memory outside
    the allocator is close to constant once warm, so their sum is the tighter bound."""
    vals = [v for v in (device_used_peak,) if v is not None]
    if torch_peak_reserved is not None:
        vals.append(torch_peak_reserved + (non_torch_peak or 0))
    return max(vals) if vals else None


def energy_per_image(energies_j: list[float | None], images: list[int]) -> float | None:
    """Energy per image under torchrun: every rank's GPU energy over every rank's images (rank
    0's energy over all ranks' images undercounts by the world size). None if any rank has no
    energy figure."""
    if not energies_j or any(e is None for e in energies_j) or sum(images) <= 0:
        return None
    return sum(energies_j) / sum(images)


ENERGY_COUNTER = "counter"
ENERGY_POWER_X_TIME = "power_x_time"


def window_energy_j(e0_mj: float | None, e1_mj: float | None, mean_power_w: float | None,
                    seconds: float) -> tuple[float | None, str | None]:
    """(energy, source) of one window: the driver's counter whenever it was read at both ends,
    whatever the window's length, else the mean sampled power x the window's length.

    The counter moves in whole millijoules every 20-100 ms, so one window's difference can be
    off by up to one update's energy (a 0.25 s window's difference may even be 0 on an idle
    GPU), but the errors do not grow when windows are summed: each read lags the truth by less
    than one update, and a phase's energy, the sum of its windows' differences, stays within
    one update per window. Mean power x time, in contrast, is biased wherever the readings
    average over time before the window (a 1 s mean) and is kept only where there is no
    counter (GPUs before Volta). A counter that went backwards (a driver reload) is no
    reading."""
    if e0_mj is not None and e1_mj is not None and e1_mj >= e0_mj:
        return (e1_mj - e0_mj) / 1000.0, ENERGY_COUNTER
    if mean_power_w is not None:
        return mean_power_w * seconds, ENERGY_POWER_X_TIME
    return None, None
