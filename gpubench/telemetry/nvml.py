"""NVML for the benchmarked GPU: its handle (by UUID, MIG instances included), its fields read
one by one, and the device-memory and energy arithmetic built on them. Everything degrades to
None without a driver; no function here raises for a missing reading."""

from __future__ import annotations


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
# energy: other tenants included) are not read at all.
GPU_FIELDS = ("gpu_util", "mem_util", "gpu_mem_used", "power_w")
WHOLE_GPU_ONLY = ("power_w", "energy")


def read_fields(nv, handle, mig: bool = False, pid: int | None = None) -> tuple[dict, dict]:
    """({field: value} for the fields that read, {field: error text} for those that did not)."""
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

    one(("gpu_util", "mem_util"), util)
    one(("gpu_mem_used",), lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).used))
    if mig:
        errors["power_w"] = "a MIG instance has no power reading of its own"
    else:
        one(("power_w",), lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)
    if pid is not None:
        one(("process_mem_used",), lambda: process_memory(nv, handle, pid))
    values = {k: v for k, v in values.items() if v is not None}
    return values, errors


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


# The NVML energy counter is updated by the driver every few tens of milliseconds (and in
# whole millijoules): over a window shorter than this its difference can be 0 or one update
# off, so the mean sampled power x the window's length is used instead.
MIN_ENERGY_COUNTER_S = 1.0


def window_energy_j(e0_mj: float | None, e1_mj: float | None, mean_power_w: float | None,
                    seconds: float) -> float | None:
    """Energy of a window: the driver's counter where the window is long enough for it,
    else (or without a counter) the mean sampled power x the window's length."""
    if e0_mj is not None and e1_mj is not None and seconds >= MIN_ENERGY_COUNTER_S and e1_mj > e0_mj:
        return (e1_mj - e0_mj) / 1000.0
    if mean_power_w is not None:
        return mean_power_w * seconds
    return None
