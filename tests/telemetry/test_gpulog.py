"""gpu_metrics.csv: nvidia-smi's columns, one row per tick of the run's sampler, host figures
on a CPU; the GPU columns against a test NVML (tests/fake_nvml.py), from the same reading as the
open window's sample."""

from __future__ import annotations

import csv
import itertools
import re
import threading
import time
from datetime import datetime

import pytest

from gpubench.core.record import GPU_METRICS_FILE
from gpubench.run.runner import measure_run
from gpubench.telemetry.gpulog import COLUMNS, GpuLog, series
from gpubench.telemetry.monitor import Monitor

HEADER = ("timestamp, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
          "memory.free [MiB], power.draw [W], clocks.current.sm [MHz], "
          "clocks_throttle_reasons.active")
STAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}$")


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _sampler(interval, gpu=None, clock=time.perf_counter) -> Monitor:
    # host figures for this process only (no child listing)
    return Monitor("cpu", interval, worker_pids=lambda: (), gpu=gpu, clock=clock)


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

    m = _sampler(0.05)
    m.begin(GpuLog("cpu", tmp_path, clock=clock))
    deadline = time.monotonic() + 60
    while m.log.rows < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    log = m.end()
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
    m = _sampler(10.0)
    m.begin(GpuLog("cpu", tmp_path))
    log = m.end()  # long before the first interval ends
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
        m = _sampler(0.2)
        m.begin(GpuLog("cpu", d))
        time.sleep(1.0)
        m.end()
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
    m = Monitor("cuda", 0.1)
    m.begin(GpuLog("cuda", tmp_path, gpu=m.gpu))
    m.open()  # a window on the same sampler: its samples and the rows are the same readings
    t0 = time.time()
    while time.time() - t0 < 2.5:  # keep the GPU busy so utilization and GPM read non-zero
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
    window = m.stop()
    log = m.end()
    assert window.max("gpu_util") > 50 and window.energy_j, window.as_dict()
    rows = _rows(tmp_path / GPU_METRICS_FILE)
    assert tuple(rows[0][: len(COLUMNS)]) == COLUMNS
    body = [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]
    assert len(body) >= 5
    # the driver's name as text (older nvidia-ml-py returns bytes: never b'...')
    assert body[0]["name"] and not body[0]["name"].startswith(("b'", 'b"'))
    assert max(float(r["utilization.gpu [%]"]) for r in body) > 50
    assert int(body[-1]["memory.used [MiB]"]) > 64  # the 64 MiB matrix at least
    assert float(body[-1]["clocks.current.sm [MHz]"]) > 0
    if not m.gpu.mig:
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
    from gpubench.telemetry.nvml import find_device
    from tests.fake_nvml import GPU_UUID, Clock, FakeNvml, Load

    # 2 s at 100 W, then busy at 400 W: read 0.3 s after the step
    nv = FakeNvml(Load((2.0, 0.2, 100.0), (2.0, 1.0, 400.0)), Clock(2.3), **kw)
    return nv, find_device(nv, uuid or GPU_UUID)


def _row(tmp_path, dev):
    """gpu_metrics.csv's one row from a run whose sampler ticks once (its last)."""
    m = _sampler(60.0, gpu=dev)
    m.begin(GpuLog("cuda", tmp_path, gpu=dev))
    log = m.end()
    rows = _rows(log.path)
    assert len(rows) == 2 and log.rows == 1
    return log, dict(zip(rows[0], rows[1], strict=True))


def test_gpu_row_reads_the_samplers_fields(tmp_path):
    """The log's GPU columns come from the sampler's reads (nvml.read_fields): instant power
    where the driver has it, the board's name as text."""
    nv, dev = _fake_gpu()
    log, row = _row(tmp_path, dev)
    assert log.name == row["name"] == "NVIDIA H100 80GB HBM3"
    assert "no GPM" in log.note and log.gpm is None  # an Ampere-like board
    assert row["power.draw [W]"] == "400.00"  # instant: the 1 s average would read 190 W
    assert row["utilization.gpu [%]"] == "100" and row["utilization.memory [%]"] == "50"
    assert row["memory.used [MiB]"] == str(5 * 1024)
    assert row["memory.free [MiB]"] == str(75 * 1024)
    assert row["clocks_throttle_reasons.active"] == "0x0000000000000004"
    assert row["clocks.current.sm [MHz]"] == "1980"


def test_one_reading_serves_the_window_and_the_row(tmp_path):
    """With a window open, a tick reads NVML once for both outputs; the window's last sample
    is the sampler thread's, at stop(), and adds no row; end() writes the run's last row."""
    nv, dev = _fake_gpu()
    ticks, on = itertools.count(), {}

    def clock():  # the sampler's time, noting which thread read it
        t = float(next(ticks))
        on[t] = threading.current_thread().name
        return t

    m = _sampler(60.0, gpu=dev, clock=clock)  # no tick of its own before end()
    m.begin(GpuLog("cuda", tmp_path, gpu=dev))
    m.open()
    before = nv.calls.count("nvmlDeviceGetUtilizationRates")
    m.tick()
    assert nv.calls.count("nvmlDeviceGetUtilizationRates") == before + 1
    window = m.stop()
    assert m.log.rows == 1  # the tick's; the window's last sample wrote none
    log = m.end()
    assert log.rows == 2 and m.end() is None  # the run's last row; ended once
    first, last = window.samples
    assert on[first.t] == "MainThread" and on[last.t] == "gpubench-monitor"
    row = dict(zip(COLUMNS, _rows(log.path)[1], strict=True))
    assert (first.gpu_util, first.power_w) == (100.0, 400.0)
    assert (row["utilization.gpu [%]"], row["power.draw [W]"]) == ("100", "400.00")
    m.open()  # no sampler thread any more: stop() takes the window's last sample itself
    (alone,) = m.stop().samples
    assert on[alone.t] == "MainThread"


def test_older_bindings_give_bytes_names_decoded_and_averaged_power(tmp_path):
    nv, dev = _fake_gpu(old_bindings=True)
    assert isinstance(nv.nvmlDeviceGetName(dev.handle), bytes)  # what older nvidia-ml-py does
    log, row = _row(tmp_path, dev)
    assert log.name == row["name"] == "NVIDIA H100 80GB HBM3"  # not "b'NVIDIA H100 ...'"
    assert float(row["power.draw [W]"]) == pytest.approx(190.0)  # nvmlDeviceGetPowerUsage's
    assert row["clocks_throttle_reasons.active"] == "0x0000000000000004"  # the old call's name


def test_mig_row_has_memory_and_no_whole_gpu_columns(tmp_path):
    from tests.fake_nvml import MIG_UUID

    nv, dev = _fake_gpu(MIG_UUID)
    log, row = _row(tmp_path, dev)
    assert log.gpu.mig and "MIG" in log.note and "MIG" in log.name
    assert row["memory.used [MiB]"] == str(2 * 1024)
    assert row["power.draw [W]"] == row["utilization.gpu [%]"] == ""
    assert row["clocks_throttle_reasons.active"] == ""
    assert not {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues",
                "nvmlDeviceGetCurrentClocksEventReasons"} & set(nv.calls)


def test_series_of_a_file_whose_last_row_a_crash_cut_short(tmp_path):
    """A run killed mid-row leaves a short last line (DictReader fills it with None): its
    cells that were written still count, the missing ones are skipped, nothing raises."""
    f = tmp_path / GPU_METRICS_FILE
    f.write_text(",".join(COLUMNS) + "\n"
                 "2026/11/22 00:17:01.250,NVIDIA H100,87,40,1000,80000,310.50,1980,0x4\n"
                 "2026/11/22 00:17:02.250,NVIDIA H100,90")
    by = {(n, s): v for n, v, s, _ in series(f)}
    assert by[("gpu_metrics/utilization.gpu_pct", 1)] == 90.0
    assert ("gpu_metrics/power.draw_w", 1) not in by
