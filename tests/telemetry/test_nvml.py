"""NVML readings against a test NVML with the driver's documented semantics (tests/fake_nvml.py:
a scripted load on an injected clock): fields read one by one, MIG instances, instant power,
readings that straddle a window's start, energy from the counter over short windows, and the
memory gate and energy arithmetic. The window sampler (Monitor) is driven tick by tick on the
injected clock; no real sleeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpubench.core.stats import TICK_S
from gpubench.run import merge
from gpubench.telemetry.monitor import Monitor, MonitorSummary, Sample
from gpubench.telemetry.nvml import (
    NVML_AVERAGING_S,
    POWER_AVERAGE,
    POWER_INSTANT,
    NvmlDevice,
    energy_per_image,
    find_device,
    memory_gate_bytes,
    process_memory,
    read_fields,
    window_energy_j,
)
from tests.fake_nvml import GPU_UUID, MIG_UUID, Clock, FakeNvml, Load

BARE = GPU_UUID.removeprefix("GPU-")


def monitor(nv: FakeNvml, uuid: str = GPU_UUID) -> Monitor:
    # host figures for this process only (no child listing): the GPU side is under test
    return Monitor("cpu", 0.2, worker_pids=lambda: (), gpu=find_device(nv, uuid), clock=nv.clock)


def window(m: Monitor, clock: Clock, start: float, seconds: float, every: float = 0.2
           ) -> MonitorSummary:
    """One measurement window from `start` on the injected clock, a sample every `every`
    (half a period off the window's start, so no sample sits on a load's edge)."""
    clock.t = start
    m.open()
    for k in range(round(seconds / every)):
        clock.t = start + (k + 0.5) * every
        m.tick()
    clock.t = start + seconds
    return m.close()


# ------------------------------------------------------------------ handles and fields

def test_whole_gpu_and_mig_uuids_are_found_never_an_index():
    nv = FakeNvml(Load(), Clock())
    mig = NvmlDevice(nv, nv.devices[MIG_UUID], True)
    assert find_device(nv, BARE) == NvmlDevice(nv, nv.devices[GPU_UUID], False)
    assert find_device(nv, MIG_UUID.removeprefix("MIG-")) == find_device(nv, MIG_UUID) == mig
    # an unknown UUID finds nothing (NVMLError_NotFound): never the physical GPU 0
    assert find_device(nv, "aaaaaaaa-0000-0000-0000-000000000000") is None


def test_mig_instance_reads_its_memory_and_no_whole_gpu_field():
    nv = FakeNvml(Load((10.0, 1.0, 300.0)), Clock(1.0), mig_mem_used=3 * 2**30)
    values, errors = read_fields(*find_device(nv, MIG_UUID))
    assert values == {"gpu_mem_used": 3 * 2**30, "gpu_mem_free": 7 * 2**30}
    assert set(errors) == {"gpu_util", "mem_util", "power_w"}
    assert "Not Supported" in errors["gpu_util"]  # NVMLError_NotSupported, as NVML answers
    # whole-GPU readings are not even asked for (they would include other tenants)
    assert not {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues"} & set(nv.calls)

    m = monitor(nv, MIG_UUID)
    summ = window(m, nv.clock, 2.0, 2.0).as_dict()
    assert "MIG" in m.gpu_note
    assert summ["nvml_memory_used_bytes"] == 3 * 2**30
    assert summ["power_mean_w"] is summ["energy_j"] is summ["gpu_util_mean"] is None
    assert summ["gpu_util_note"] is None  # nothing was dropped: there was nothing to read
    assert {"gpu_util", "power_w"} <= set(summ["nvml_unsupported"])
    assert "nvmlDeviceGetTotalEnergyConsumption" not in nv.calls


def test_whole_gpu_reads_every_field():
    nv = FakeNvml(Load((10.0, 1.0, 300.0)), Clock(5.0), processes=[(10, 3 * 2**30)])
    values, errors = read_fields(*find_device(nv, GPU_UUID), 10)
    assert errors == {}
    assert values == {"gpu_util": 100.0, "mem_util": 50.0, "gpu_mem_used": 5 * 2**30,
                      "gpu_mem_free": 75 * 2**30, "power_w": 300.0,
                      "power_source": POWER_INSTANT, "process_mem_used": 3 * 2**30}


def test_instant_power_is_preferred_and_the_average_is_the_fallback():
    # 100 W for 2 s, then 400 W: 0.3 s after the step the 1 s average still reads
    # 0.7 x 100 + 0.3 x 400 = 190 W, the instant reading 400 W
    load = Load((2.0, 0.2, 100.0), (2.0, 1.0, 400.0))
    for kw, want in (({}, (400.0, POWER_INSTANT)),
                     ({"instant": False}, (190.0, POWER_AVERAGE)),  # driver without the field
                     ({"old_bindings": True}, (190.0, POWER_AVERAGE))):  # no field constant
        nv = FakeNvml(load, Clock(2.3), update_s=0.05, **kw)
        values, _ = read_fields(*find_device(nv, GPU_UUID))
        assert (values["power_w"], values["power_source"]) == pytest.approx(want), kw


def test_process_memory_is_this_pid_only():
    nv = FakeNvml(Load(), Clock(), processes=[(10, 3 * 2**30), (11, 7 * 2**30), (12, None)])
    h = find_device(nv, GPU_UUID).handle
    assert process_memory(nv, h, 10) == 3 * 2**30
    assert process_memory(nv, h, 12) is None  # the driver withholds it
    assert process_memory(nv, h, 99) is None  # a PID namespace hides ours
    assert read_fields(nv, h, pid=11)[0]["process_mem_used"] == 7 * 2**30
    assert "process_mem_used" not in read_fields(nv, h, pid=99)[0]


# ------------------------------------------------------------------ window alignment

@pytest.mark.parametrize("instant", [False, True])
def test_a_window_after_a_busy_phase_reads_its_own_idle_gpu(instant):
    """A busy phase (100%, 300 W) ends as an idle window (60 W) opens: NVML's readings in the
    window's first second still average over the busy phase and are dropped."""
    nv = FakeNvml(Load((5.03, 1.0, 300.0), idle_w=60.0), Clock(), util_period_s=0.5,
                  instant=instant)
    summ = window(monitor(nv), nv.clock, 5.03, 2.0)
    d = summ.as_dict()
    # kept: readings from t0 + 1 s on, whose periods lie inside the window
    assert d["gpu_util_mean"] == 0.0 and d["gpu_util_max"] == 0.0
    # samples at t0 + 0.1, 0.3, ... 1.9 s: the five in the first second are dropped
    assert d["nvml_samples_dropped"] == 5 == sum(
        1 for s in summ.samples if s.t - 5.03 < NVML_AVERAGING_S)
    # kept averages cover only the window; instant power is kept throughout (the idle draw)
    assert d["power_mean_w"] == pytest.approx(60.0)
    assert d["power_source"] == (POWER_INSTANT if instant else POWER_AVERAGE)
    kept = [s.power_w for s in summ.samples if s.power_w is not None]
    assert len(kept) == len(summ.samples) - (0 if instant else d["nvml_samples_dropped"])


def test_a_window_shorter_than_the_averaging_reads_no_utilization_and_says_why():
    nv = FakeNvml(Load((5.0, 1.0, 300.0)), Clock(), instant=False)
    d = window(monitor(nv), nv.clock, 5.0, 0.6).as_dict()
    assert d["gpu_util_mean"] is None and d["power_mean_w"] is None
    assert "1 s" in d["gpu_util_note"] and "3 NVML utilization readings" in d["gpu_util_note"]
    assert d["nvml_memory_used_bytes"] == 5 * 2**30  # memory is no average: kept
    assert d["energy_source"] == "counter" and d["energy_j"] == pytest.approx(0.6 * 60, abs=3)


# ------------------------------------------------------------------ energy

def alternating(n: int, other_s: float, other_w: float, win_s: float, win_w: float) -> Load:
    """n times: another phase (`other_s` at `other_w`), then a measured window's load."""
    return Load(*[p for _ in range(n) for p in ((other_s, 0.3, other_w), (win_s, 1.0, win_w))])


@pytest.mark.parametrize("update_s", [0.02, 0.1])
def test_energy_over_short_windows_is_the_counters(update_s):
    """Eight 0.25 s windows at 300 W between 0.37 s phases at 80 W: each window's energy is
    the counter's difference, within one counter update of the scripted 75 J (whole mJ,
    refreshed every `update_s`), and the phase's is their sum."""
    n, other_s, win_s = 8, 0.37, 0.25
    nv = FakeNvml(alternating(n, other_s, 80.0, win_s, 300.0), Clock(), update_s=update_s,
                  instant=False)
    m = monitor(nv)
    summaries = [window(m, nv.clock, other_s + i * (other_s + win_s), win_s, every=0.05)
                 for i in range(n)]
    one_update = 300.0 * update_s + 0.001
    for s in summaries:
        assert s.energy_source == "counter"
        assert s.energy_j == pytest.approx(300.0 * win_s, abs=one_update)
        assert s.as_dict()["power_mean_w"] is None  # every 1 s average straddled: dropped
    phase = merge.telemetry(summaries)
    assert phase.energy_source == "counter"
    assert phase.energy_j == pytest.approx(n * 300.0 * win_s, abs=n * one_update)
    assert phase.as_dict()["energy_j"] == phase.energy_j


def test_without_a_counter_energy_is_instant_power_x_time():
    nv = FakeNvml(Load((1.0, 0.2, 80.0), (0.25, 1.0, 300.0)), Clock(), energy=False)
    s = window(monitor(nv), nv.clock, 1.0, 0.25, every=0.05)
    assert (s.energy_j, s.energy_source) == (pytest.approx(75.0), "power_x_time")
    # without instant power too, every reading of a 0.25 s window straddles: no figure
    nv = FakeNvml(nv.load, Clock(), energy=False, instant=False)
    s = window(monitor(nv), nv.clock, 1.0, 0.25, every=0.05)
    assert s.energy_j is None and s.energy_source is None


def test_window_energy_rules():
    # the counter whatever the window's length, 0 included (an update may not have come)
    assert window_energy_j(1_000.0, 26_000.0, 250.0, 0.1) == (pytest.approx(25.0), "counter")
    assert window_energy_j(1_000.0, 1_000.0, 250.0, 0.01) == (0.0, "counter")
    # a counter that went backwards (driver reloaded) is no reading
    assert window_energy_j(9_000.0, 1_000.0, 250.0, 0.1) == (pytest.approx(25.0), "power_x_time")
    assert window_energy_j(None, None, None, 5.0) == (None, None)


def test_phase_energy_is_none_when_a_window_has_none_and_sources_are_named():
    def summ(e, src, dropped=0, unsupported=(), used=None):
        return MonitorSummary(samples=[Sample(0.0, 0.0, 0.0, 0)], seconds=1.0, energy_j=e,
                              energy_source=src, nvml_dropped=dropped,
                              nvml_unsupported=list(unsupported), device_used_source=used)

    merged = merge.telemetry([summ(10.0, "counter", 2, ["power_w"], "nvml_process"),
                              summ(5.0, "power_x_time", 1, ["gpu_util"])])
    d = merged.as_dict()
    assert d["energy_j"] == 15.0 and d["energy_source"] == "counter+power_x_time"
    assert d["nvml_samples_dropped"] == 3 and d["nvml_unsupported"] == ["gpu_util", "power_w"]
    assert d["device_used_source"] == "nvml_process"
    assert merge.telemetry([summ(10.0, "counter"), summ(None, None)]).energy_j is None


def test_energy_across_ranks_sums_every_rank_and_stays_unknown_once_unknown():
    two = SimpleNamespace(gather=lambda v: [v, 2 * v] if v is not None else [None, 1.0])
    assert merge.energy_across_ranks(10.0, two, 0.0) == 30.0  # first window: 10 + 20
    assert merge.energy_across_ranks(10.0, two, 30.0) == 60.0
    assert merge.energy_across_ranks(None, two, 30.0) is None
    # an earlier window had no figure: the later windows alone would undercount the phase
    assert merge.energy_across_ranks(10.0, two, None) is None


# ------------------------------------------------------------------ arithmetic

def test_memory_gate_takes_the_larger():
    gib = 2**30
    # 10 GiB reserved at peak, 1.5 GiB outside the allocator: 11.5 GiB, above the sampled 11
    assert memory_gate_bytes(10 * gib, 11 * gib, int(1.5 * gib)) == int(11.5 * gib)
    # a sampled peak above both (other tenants counted where NVML has no per-process figure)
    assert memory_gate_bytes(10 * gib, 20 * gib, gib) == 20 * gib
    assert memory_gate_bytes(10 * gib, None, None) == 10 * gib
    assert memory_gate_bytes(None, None, None) is None


def test_energy_per_image_is_none_without_a_figure():
    assert energy_per_image(210.0, 2000) == pytest.approx(0.105)
    assert energy_per_image(None, 2000) is None  # a rank had no figure (merge.energy_across_ranks)
    assert energy_per_image(210.0, 0) is None


def test_the_default_gpu_window_outlasts_nvmls_averaging_twice():
    """bench.min_window_s=null on CUDA (config.settings, which may not import telemetry) leaves
    as long again as the readings the sampler drops at a window's start."""
    from gpubench.config.settings import GPU_MIN_WINDOW_S
    from gpubench.telemetry.nvml import NVML_AVERAGING_S

    assert GPU_MIN_WINDOW_S >= 2 * NVML_AVERAGING_S


def test_cpu_means_weigh_each_reading_by_the_interval_it_covers():
    """psutil's cpu_percent is CPU time over the interval since its last reading, counted in
    clock ticks (10 ms): a window's last reading, 5 ms after the one before, read 600% for a
    process on a 2-core host, and an unweighted mean made it half the window's figure. A CPU
    mean is CPU time over wall time; NVML's readings are samples of a level, weighed alike."""
    import dataclasses

    times = iter([0.0, 1.0, 1.005])
    m = Monitor("cpu", 0.2, clock=lambda: next(times))
    m.sample(fresh=True)  # primes the counts, as open() does
    first, last = m.sample(), m.sample()
    assert (first.dt, last.dt) == pytest.approx((1.0, 0.005))
    cpu = dict(host_cpu=(50.0, 100.0), procs_cpu=(100.0, 600.0), power_w=(100.0, 200.0))
    summary = MonitorSummary(samples=[dataclasses.replace(s, **{k: v[i] for k, v in cpu.items()})
                                      for i, s in enumerate((first, last))])
    d = summary.as_dict()
    assert d["process_cpu_util_mean"] == pytest.approx((100 * 1.0 + 600 * 0.005) / 1.005)
    assert d["host_cpu_util_mean"] == pytest.approx((50 * 1.0 + 100 * 0.005) / 1.005)
    assert d["power_mean_w"] == 150.0
    # a phase's windows pooled keep each reading's interval
    pooled = merge.telemetry([summary, summary]).as_dict()
    assert pooled["process_cpu_util_mean"] == pytest.approx(d["process_cpu_util_mean"])
    # readings over a span a tick would swing by more than 5%: no CPU figure, not 0% or 600%
    last = dataclasses.replace(last, procs_cpu=600.0, host_cpu=100.0, power_w=200.0)
    short = MonitorSummary(samples=[dataclasses.replace(last, dt=19 * TICK_S)]).as_dict()
    assert short["process_cpu_util_mean"] is None and short["host_cpu_util_mean"] is None
    assert short["power_mean_w"] == 200.0
    held = MonitorSummary(samples=[dataclasses.replace(last, dt=20 * TICK_S)]).as_dict()
    assert held["process_cpu_util_mean"] == 600.0


def test_the_host_cpu_of_a_window_counts_from_its_opening_whichever_thread_reads():
    """A window opens on the main thread and the sampler thread reads it: psutil's
    cpu_percent(None) keeps one baseline per thread, so the sampler's reading counted from its
    own last one (a new thread's: nothing, 0%). The monitor keeps its own: a core kept busy
    between the opening and a reading on another thread shows."""
    import os
    import threading
    import time

    m = Monitor("cpu", 0.2)
    m.sample(fresh=True)  # the window opens, on this thread
    start = time.thread_time()
    while time.thread_time() - start < 0.2:  # one core busy for 0.2 s of CPU time
        pass
    read: list = []
    t = threading.Thread(target=lambda: read.append(m.sample()))
    t.start()
    t.join()
    assert read[0].host_cpu >= 0.5 * 100.0 / os.cpu_count(), read[0]
