"""gpu_metrics.csv: nvidia-smi's columns, one row per sampler interval, host figures on a CPU;
the GPU columns against a test NVML (tests/fake_nvml.py)."""

from __future__ import annotations

import csv
import re
import time
from datetime import datetime

import pytest

from gpubench.run.runner import measure_run
from gpubench.telemetry.gpulog import COLUMNS, GPU_METRICS_FILE, GpuLog, series

HEADER = ("timestamp, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
          "memory.free [MiB], power.draw [W], clocks.current.sm [MHz], "
          "clocks_throttle_reasons.active")
STAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}$")


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_header_is_nvidia_smis():
    # nvidia-smi --query-gpu=timestamp,name,utilization.gpu,utilization.memory,memory.used,
    # memory.free,power.draw,clocks.sm,clocks_throttle_reasons.active --format=csv prints this
    assert ", ".join(COLUMNS) == HEADER


def test_host_figures_at_the_interval(tmp_path):
    # the stamps come from an injected clock, one tick per row; when each row is taken is
    # noted on the real clock: rows are at least an interval apart (load only delays them)
    t0, taken = 1764000000.0, []

    def clock():
        taken.append(time.monotonic())
        return t0 + 0.25 * len(taken)

    log = GpuLog("cpu", tmp_path, 0.05, clock=clock).start()
    deadline = time.monotonic() + 60
    while log.rows < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    log.stop()
    rows = _rows(tmp_path / GPU_METRICS_FILE)
    assert tuple(rows[0]) == COLUMNS
    body = rows[1:]
    assert len(body) >= 6 and log.rows == len(body) == len(taken)  # 5 or more, then stop's
    gaps = [b - a for a, b in zip(taken[:-2], taken[1:-1], strict=True)]  # stop's row: early
    assert min(gaps) >= 0.045, gaps
    want = [datetime.fromtimestamp(t0 + 0.25 * (i + 1)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
            for i in range(len(body))]
    assert [r[0] for r in body] == want
    for r in body:
        row = dict(zip(COLUMNS, r, strict=True))
        assert STAMP.match(row["timestamp"]), row["timestamp"]
        assert row["name"]
        assert 0.0 <= float(row["utilization.gpu [%]"]) <= 100.0
        used, free = int(row["memory.used [MiB]"]), int(row["memory.free [MiB]"])
        assert used > 0 and free > 0
        # no host counterpart: left empty rather than filled with a different quantity
        assert row["utilization.memory [%]"] == row["power.draw [W]"] == ""
        assert row["clocks_throttle_reasons.active"] == ""


def test_shortest_log_still_has_one_row(tmp_path):
    log = GpuLog("cpu", tmp_path, 10.0).start()
    log.stop()  # long before the first interval ends
    rows = _rows(tmp_path / GPU_METRICS_FILE)
    assert tuple(rows[0]) == COLUMNS and len(rows) == 2 and log.rows == 1


def test_host_cpu_column_sees_a_busy_thread(tmp_path):
    """The host CPU column measures something: a spinning thread raises it."""
    import threading

    def rows_while(busy: bool) -> float:
        d = tmp_path / str(busy)
        d.mkdir()
        stop = threading.Event()
        def spin():
            while not stop.is_set():
                pass

        spinner = threading.Thread(target=spin)
        if busy:
            spinner.start()
        log = GpuLog("cpu", d, 0.2).start()
        time.sleep(1.0)
        log.stop()
        stop.set()
        if busy:
            spinner.join()
        vals = [float(r[2]) for r in _rows(d / GPU_METRICS_FILE)[1:]]
        return max(vals)

    # one spinning thread on a 2-core host is ~50% of all cores
    assert rows_while(True) > 25.0


def test_run_writes_the_log_beside_results(compose_cfg, tmp_path):
    rec = measure_run(compose_cfg(), tmp_path).record
    rows = _rows(tmp_path / GPU_METRICS_FILE)
    assert tuple(rows[0]) == COLUMNS and len(rows) >= 2
    meta = rec.extra["gpu_metrics"]
    assert meta["file"] == GPU_METRICS_FILE and meta["rows"] == len(rows) - 1
    assert meta["gpm"] is False


def test_no_log_without_the_sampler(compose_cfg, tmp_path):
    measure_run(compose_cfg("bench.monitor=false"), tmp_path)
    assert not (tmp_path / GPU_METRICS_FILE).exists()


@pytest.mark.gpu
def test_gpu_columns_filled(tmp_path):
    import torch

    from gpubench.telemetry.gpulog import GPM_COLUMNS

    x = torch.randn(4096, 4096, device="cuda")
    log = GpuLog("cuda", tmp_path, 0.1).start()
    t0 = time.time()
    while time.time() - t0 < 1.5:  # keep the GPU busy so utilization and GPM read non-zero
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
    log.stop()
    rows = _rows(tmp_path / GPU_METRICS_FILE)
    assert tuple(rows[0][: len(COLUMNS)]) == COLUMNS
    body = [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]
    assert len(body) >= 5
    # the driver's name as text (older nvidia-ml-py returns bytes: never b'...')
    assert body[0]["name"] and not body[0]["name"].startswith(("b'", 'b"'))
    assert max(float(r["utilization.gpu [%]"]) for r in body) > 50
    assert int(body[-1]["memory.used [MiB]"]) > 64  # the 64 MiB matrix at least
    assert float(body[-1]["clocks.current.sm [MHz]"]) > 0
    if not log.mig:
        assert float(body[-1]["power.draw [W]"]) > 0
        assert re.match(r"^0x[0-9A-F]{16}$", body[-1]["clocks_throttle_reasons.active"])
    if log.gpm is not None:  # Hopper and newer
        assert max(float(r["gpm.sm_activity [%]"]) for r in body if r["gpm.sm_activity [%]"]) > 10
        assert {c for c, _ in GPM_COLUMNS} <= set(rows[0])
    print("GPM:", log.gpm is not None, log.note, body[len(body) // 2])


def test_series_for_tracking(tmp_path):
    """Every numeric cell becomes one point of an MLflow-safe series; empty cells none."""
    import re as _re

    f = tmp_path / GPU_METRICS_FILE
    f.write_text(", ".join(COLUMNS).replace(", ", ",") + "\n"
                 "2026/11/22 00:17:01.250,NVIDIA H100,87,40,1000,80000,310.50,1980,"
                 "0x0000000000000004\n"
                 "2026/11/22 00:17:02.250,NVIDIA H100,90,,1001,79999,,1980,\n")
    pts = series(f)
    names = {n for n, *_ in pts}
    assert "gpu_metrics/utilization.gpu_pct" in names
    assert "gpu_metrics/clocks_throttle_reasons.active" in names
    assert all(_re.fullmatch(r"[\w./ -]+", n) for n in names), names
    by = {(n, s): v for n, v, s, _ in pts}
    assert by[("gpu_metrics/power.draw_w", 0)] == 310.5
    assert ("gpu_metrics/power.draw_w", 1) not in by  # empty cell: no point
    assert by[("gpu_metrics/clocks_throttle_reasons.active", 0)] == 4.0
    assert len(pts) == 7 + 4
    ts = [t for *_, t in pts]
    assert max(ts) - min(ts) == 1000  # one second apart, milliseconds kept
    assert series(tmp_path / "missing.csv") == []


def _fake_gpu(uuid=None, **kw):
    from gpubench.telemetry.nvml import NvmlDevice, find_handle
    from tests.fake_nvml import GPU_UUID, Clock, FakeNvml, Load

    # 2 s at 100 W, then busy at 400 W: read 0.3 s after the step
    nv = FakeNvml(Load((2.0, 0.2, 100.0), (2.0, 1.0, 400.0)), Clock(2.3), **kw)
    return nv, NvmlDevice(nv, *find_handle(nv, uuid or GPU_UUID))


def test_gpu_row_reads_the_samplers_fields(tmp_path):
    """The log's GPU columns come from the window sampler's reads (nvml.read_fields): instant
    power where the driver has it, the board's name as text."""
    nv, dev = _fake_gpu()
    log = GpuLog("cuda", tmp_path, 0.1, clock=lambda: 1764000000.0, gpu=dev)
    assert log.name == "NVIDIA H100 80GB HBM3"
    assert "no GPM" in log.note and log.gpm is None  # an Ampere-like board
    row = log.sample()
    assert row["power.draw [W]"] == 400.0  # instant: the 1 s average would read 190 W
    assert row["utilization.gpu [%]"] == 100 and row["utilization.memory [%]"] == 50
    assert row["memory.used [MiB]"] == 5 * 1024 and row["memory.free [MiB]"] == 75 * 1024
    assert row["clocks_throttle_reasons.active"] == "0x0000000000000004"
    assert row["clocks.current.sm [MHz]"] == 1980


def test_older_bindings_give_bytes_names_decoded_and_averaged_power(tmp_path):
    nv, dev = _fake_gpu(old_bindings=True)
    assert isinstance(nv.nvmlDeviceGetName(dev.handle), bytes)  # what older nvidia-ml-py does
    log = GpuLog("cuda", tmp_path, 0.1, gpu=dev)
    assert log.name == "NVIDIA H100 80GB HBM3"  # not "b'NVIDIA H100 80GB HBM3'"
    row = log.sample()
    assert row["name"] == log.name
    assert row["power.draw [W]"] == pytest.approx(190.0)  # nvmlDeviceGetPowerUsage's mean
    assert row["clocks_throttle_reasons.active"] == "0x0000000000000004"  # the old call's name


def test_mig_row_has_memory_and_no_whole_gpu_columns(tmp_path):
    from tests.fake_nvml import MIG_UUID

    nv, dev = _fake_gpu(MIG_UUID)
    log = GpuLog("cuda", tmp_path, 0.1, gpu=dev)
    assert log.mig and "MIG" in log.note and "MIG" in log.name
    row = log.sample()
    assert row["memory.used [MiB]"] == 2 * 1024
    assert row["power.draw [W]"] is None and row["utilization.gpu [%]"] is None
    assert "clocks_throttle_reasons.active" not in row
    assert not {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues",
                "nvmlDeviceGetCurrentClocksEventReasons"} & set(nv.calls)
