"""The checks that need a CUDA device, judged in check.rules; NVML through telemetry.nvml.Nvml."""

from __future__ import annotations

import math
import time

import torch

from gpubench.check import rules
from gpubench.check.rules import Judgement, skipped
from gpubench.core.stats import median
from gpubench.parts.measure import run_window
from gpubench.telemetry import env
from gpubench.telemetry.nvml import Nvml, or_none

NAMES = ("utilization", "energy", "memory", "peak", "sync")
BUSY_S, IDLE_S = 4.0, 2.0
SETTLE_S = 1.2  # NVML's readings average over up to 1 s: reads start this late in a window
READ_EVERY_S = 0.1
ALLOC_BYTES = 2 * 2**30


def _half() -> tuple[str, torch.dtype]:
    # bf16 needs Ampere or newer; before it the tensor cores' half type is fp16
    return ("bf16", torch.bfloat16) if torch.cuda.is_bf16_supported() else ("fp16", torch.float16)


def busy_and_idle(nv, handle) -> tuple[Judgement, Judgement]:
    """Back-to-back matmuls for BUSY_S, then nothing queued for IDLE_S, read after SETTLE_S."""

    def utilization() -> float | None:  # None where NVML has no reading (NotSupported, ...)
        return getattr(or_none(nv, lambda: nv.nvmlDeviceGetUtilizationRates(handle)), "gpu", None)

    a = torch.randn(4096, 4096, device="cuda", dtype=_half()[1])
    c = torch.empty_like(a)
    util, readings = [], []
    torch.cuda.synchronize()
    t0, last = time.perf_counter(), 0.0
    while time.perf_counter() - t0 < BUSY_S:
        for _ in range(32):
            torch.matmul(a, a, out=c)
        now = time.perf_counter() - t0
        if now > SETTLE_S and now - last >= READ_EVERY_S:  # read while the 32 just queued run
            last = now
            util.append(utilization())
            readings.append((now, or_none(nv, lambda: nv.nvmlDeviceGetPowerUsage(handle)),
                             or_none(nv, lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle))))
        # bounded queue: the host stays within 32 matmuls of the device, so readings are current
        torch.cuda.synchronize()
    idle, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < IDLE_S:
        time.sleep(READ_EVERY_S)
        if time.perf_counter() - t0 > SETTLE_S:
            idle.append(utilization())
    return rules.utilization(_median(util), _median(idle)), rules.energy_readings(readings)


def _median(xs: list) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return median(vals) if vals else None


def memory(nv, handle, index: int) -> Judgement:
    """torch's reserved and NVML's used memory around one ALLOC_BYTES allocation."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    info = or_none(nv, lambda: nv.nvmlDeviceGetMemoryInfo(handle))
    if info is None:
        return skipped("memory", "NVML gave no memory reading")
    before = (torch.cuda.memory_reserved(index), int(info.used))
    block = torch.empty(ALLOC_BYTES, dtype=torch.uint8, device="cuda")  # one cudaMalloc'd segment
    torch.cuda.synchronize()
    reserved, info = torch.cuda.memory_reserved(index), or_none(
        nv, lambda: nv.nvmlDeviceGetMemoryInfo(handle))
    del block
    torch.cuda.empty_cache()
    if info is None:  # the reading after failed: skipped as the one before would be
        return skipped("memory", "NVML gave no memory reading")
    return rules.memory((before[0], reserved), (before[1], int(info.used)))


def _matmul_rate(dtype: torch.dtype, n: int = 8192) -> float:
    """FLOP/s of an n x n x n matmul, timed by CUDA events over about 0.5 s."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    c = torch.empty_like(a)
    for _ in range(3):  # cuBLAS picks its kernel and the clocks come up
        torch.matmul(a, a, out=c)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def seconds(reps: int) -> float:
        start.record()
        for _ in range(reps):
            torch.matmul(a, a, out=c)
        end.record()
        end.synchronize()  # elapsed_time needs both events complete
        return start.elapsed_time(end) / 1e3

    reps = min(200, max(5, math.ceil(0.5 / seconds(1))))  # one matmul's time sizes the run
    return 2.0 * n**3 * reps / seconds(reps)


def peak(index: int) -> Judgement:
    """Large matmuls against the table's peak for this device, as MFU reads it."""
    name = torch.cuda.get_device_name(index)
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    half, dtype = _half()
    rows = [(half, _matmul_rate(dtype), env.peak_flops(name, half, sms))]
    # fp32 matmuls on TF32 tensor cores ("high", torch >= 1.12), put back as it was
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        rows.append(("tf32", _matmul_rate(torch.float32), env.peak_flops(name, "tf32", sms)))
    finally:
        torch.set_float32_matmul_precision(old)
    return rules.peak(name, rows)


def sync_timing(rounds: int = 5, steps: int = 20) -> Judgement:
    """gpubench's window against the same steps each synchronized, alternated."""
    a = torch.randn(4096, 4096, device="cuda", dtype=_half()[1])
    c = torch.empty_like(a)

    def work(_batch) -> int:
        for _ in range(8):
            torch.matmul(a, a, out=c)
        return 1

    window, synced = [], []
    for r in range(rounds):
        ws = run_window("compute", lambda: None, work, 1, "cuda", 3 if r == 0 else 1, steps,
                        60.0, math.inf)
        window.append(ws.images_per_sec)
        t0 = time.perf_counter()
        for _ in range(steps):
            work(None)
            torch.cuda.synchronize()  # the extra synchronize: each step timed to its end
        synced.append(steps / (time.perf_counter() - t0))
    return rules.agree("sync", window, synced, unit="steps/s", names=("window", "synced"))


def cuda_checks(index: int):
    """Each CUDA check's judgement, in NAMES order, as it finishes."""
    nv = Nvml.get()
    dev = nv.device_for(index)
    if dev is None:
        yield from (skipped(n, nv.reason) for n in ("utilization", "energy", "memory"))
    else:
        yield from busy_and_idle(dev.nv, dev.handle)
        yield memory(dev.nv, dev.handle, index)
    yield peak(index)
    yield sync_timing()
