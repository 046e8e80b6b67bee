"""gpu_metrics.csv: what `nvidia-smi --query-gpu=... --format=csv,nounits -l 1` would write, a row
per sampler tick, flushed so a crashed run keeps it. `utilization.gpu` reads 100% for one small
kernel at a time: GPM columns (Hopper and newer) say how much of the chip worked. A MIG instance
has no power, throttle reasons or GPM (whole-GPU figures); a CPU run logs the host's figures."""

from __future__ import annotations

import contextlib
import csv
import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import psutil

from gpubench.core.files import open_own
from gpubench.core.record import GPU_METRICS_FILE
from gpubench.telemetry.env import device_name
from gpubench.telemetry.nvml import Nvml, NvmlDevice, gpu_name, or_none

log = logging.getLogger(__name__)


# nvidia-smi's own header for the query above (it names clocks.sm as clocks.current.sm)
COLUMNS = ("timestamp", "name", "utilization.gpu [%]", "utilization.memory [%]",
           "memory.used [MiB]", "memory.free [MiB]", "power.draw [W]", "clocks.current.sm [MHz]",
           "clocks_throttle_reasons.active")
# NVML GPM metric ids (nvml.h: NVML_GPM_METRIC_SM_UTIL = 2, _SM_OCCUPANCY = 3,
# _ANY_TENSOR_UTIL = 5, _DRAM_BW_UTIL = 10), each 0-100 over the two samples' interval
GPM_COLUMNS = (("gpm.sm_activity [%]", 2), ("gpm.sm_occupancy [%]", 3),
               ("gpm.tensor_activity [%]", 5), ("gpm.dram_bandwidth [%]", 10))
MIB = 2**20
STAMP = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's: 2026/11/22 00:17:01.123 (local time, ms)


class Gpm:
    """NVML GPM samples: each read gives the metrics over the interval since the last one."""

    def __init__(self, nv, handle):
        self.nv, self.handle = nv, handle
        support = nv.nvmlGpmQueryDeviceSupport(handle)  # raises NVMLError where GPM is unknown
        if not support.isSupportedDevice:
            raise RuntimeError("this GPU has no GPM metrics (Hopper and newer have them)")
        self.prev, self.cur = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(handle, self.prev)

    def read(self) -> dict[str, float | None]:
        nv = self.nv
        nv.nvmlGpmSampleGet(self.handle, self.cur)
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_COLUMNS)
        req.sample1, req.sample2 = self.prev, self.cur
        for i, (_, metric) in enumerate(GPM_COLUMNS):
            req.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(req)
        self.prev, self.cur = self.cur, self.prev  # this sample opens the next interval
        return {name: float(m.value) if (m := req.metrics[i]).nvmlReturn == 0 else None
                for i, (name, _) in enumerate(GPM_COLUMNS)}

    def close(self) -> None:
        for s in (self.prev, self.cur):
            with contextlib.suppress(Exception):
                self.nv.nvmlGpmSampleFree(s)


class GpuLog:
    """gpu_metrics.csv, a row per write(); `gpu` None: the host's figures."""

    def __init__(self, device: str, out_dir: Path, clock: Callable[[], float] = time.time,
                 gpu: NvmlDevice | None = None):
        self.clock = clock  # wall-clock seconds, for the rows' timestamps
        self.path = Path(out_dir) / GPU_METRICS_FILE
        self.gpu, self.gpm, self.rows = gpu, None, 0
        self.note = ""  # why the GPU columns or GPM are missing, for the run's notes
        self.name = device_name("cpu")
        if gpu is None and device == "cuda":
            self.note = Nvml.get().reason
        elif gpu is not None:
            self.name = gpu_name(gpu) or device_name("cuda")
            if gpu.mig:  # GPM here needs its GPU-instance id (nvmlGpmMigSampleGet): not wired
                self.note = "GPM metrics not sampled on a MIG instance"
            else:
                try:
                    self.gpm = Gpm(gpu.nv, gpu.handle)
                except Exception as e:
                    self.note = f"GPM metrics not sampled: {e}"
        self.columns = COLUMNS + (tuple(c for c, _ in GPM_COLUMNS) if self.gpm else ())

    def _gpu_row(self, v: dict) -> dict:
        """The row from the sampler's field reads `v`, then clocks, throttle reasons, GPM."""
        nv, h = self.gpu.nv, self.gpu.handle
        row: dict = {"utilization.gpu [%]": int(v["gpu_util"]) if "gpu_util" in v else None,
                     "utilization.memory [%]": int(v["mem_util"]) if "mem_util" in v else None,
                     "memory.used [MiB]": v["gpu_mem_used"] // MIB if "gpu_mem_used" in v else None,
                     "memory.free [MiB]": v["gpu_mem_free"] // MIB if "gpu_mem_free" in v else None,
                     "power.draw [W]": v.get("power_w")}
        if not self.gpu.mig:  # whole-GPU figures: other tenants' included on a MIG instance
            # "clocks event reasons" in newer NVML, the old name an alias
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            r = or_none(nv, lambda: reasons(h))
            row["clocks_throttle_reasons.active"] = f"0x{r:016X}" if r is not None else None
        row["clocks.current.sm [MHz]"] = or_none(
            nv, lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        if self.gpm is not None:
            with contextlib.suppress(Exception):
                row.update(self.gpm.read())
        return row

    def _host_row(self, host_cpu: float) -> dict:
        vm, freq = psutil.virtual_memory(), psutil.cpu_freq()
        return {"utilization.gpu [%]": host_cpu,  # whole host, since the monitor's last reading
                "memory.used [MiB]": (vm.total - vm.available) // MIB,
                "memory.free [MiB]": vm.available // MIB,
                "clocks.current.sm [MHz]": round(freq.current) if freq else None}

    def start(self) -> GpuLog:
        self._file = open_own(self.path, "w", newline="")  # never through a symbolic link
        self._w = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._w.writeheader()
        self._file.flush()
        return self

    def write(self, host_cpu: float, values: dict) -> None:
        try:
            row = {"timestamp": datetime.fromtimestamp(self.clock()).strftime(STAMP)[:-3],
                   "name": self.name}
            row.update(self._gpu_row(values) if self.gpu else self._host_row(host_cpu))
            self._w.writerow({k: "" if v is None else f"{v:.2f}" if isinstance(v, float)
                              else str(v) for k, v in row.items()})
            self._file.flush()  # a crashed run keeps every row written so far
            self.rows += 1
        except Exception as e:  # a failing reading must never stop the run
            log.debug("gpu_metrics row failed: %s", e)

    def stop(self) -> None:
        self._file.close()
        if self.gpm is not None:
            self.gpm.close()


def _metric_name(column: str) -> str:
    # MLflow's allowed characters: "utilization.gpu [%]" -> "gpu_metrics/utilization.gpu_pct"
    name, _, unit = column.partition(" [")
    unit = unit.rstrip("]").replace("%", "pct")
    return "gpu_metrics/" + (f"{name}_{unit}" if unit else name).lower()


def series(path: Path) -> list[tuple[str, float, int, int]]:
    """The numeric columns as MLflow series: (name, value, row, timestamp_ms) per cell."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return []
    out = []
    for step, row in enumerate(rows):
        row.pop("name", None)  # the board's, not a figure
        try:
            ts = round(datetime.strptime(row.pop("timestamp"), STAMP).timestamp() * 1000)
        except (KeyError, ValueError):
            ts = 0
        for col, v in row.items():
            try:
                x = float(int(v, 16)) if v.startswith("0x") else float(v)
            except (ValueError, AttributeError):  # empty, or a row cut short (None) or too long
                continue
            out.append((_metric_name(col), x, step, ts))
    return out

