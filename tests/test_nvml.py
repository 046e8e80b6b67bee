"""NVML read field by field, MIG instances, per-process device memory, the memory gate and
energy arithmetic. The driver is stood in for by a small fake of the pynvml calls used (no
GPU here); what is tested is gpubench.telemetry.nvml's logic around them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpubench.telemetry.nvml import (
    MIN_ENERGY_COUNTER_S,
    energy_per_image,
    find_handle,
    memory_gate_bytes,
    process_memory,
    read_fields,
    window_energy_j,
)


class FakeNvml:
    """The pynvml calls gpubench makes, with chosen fields raising NotSupported."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: dict[str, str], unsupported=(), processes=()):
        self.devices, self.unsupported, self.processes = devices, set(unsupported), processes
        self.calls: list[str] = []

    def _call(self, name, value):
        self.calls.append(name)
        if name in self.unsupported:
            raise self.NVMLError("Not Supported")
        return value

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.devices:
            raise self.NVMLError("Not Found")
        return self.devices[uuid]

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._call("util", SimpleNamespace(gpu=87, memory=40))

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._call("memory", SimpleNamespace(used=5 * 2**30, total=80 * 2**30))

    def nvmlDeviceGetPowerUsage(self, h):
        return self._call("power", 312_500)  # milliwatts

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._call("processes", list(self.processes))


UUID = "3f5a1b2c-0000-1111-2222-333344445555"


def test_one_unsupported_field_keeps_the_others():
    nv = FakeNvml({f"GPU-{UUID}": "h"}, unsupported={"util"})
    values, errors = read_fields(nv, "h")
    assert values == {"gpu_mem_used": 5 * 2**30, "power_w": 312.5}
    assert set(errors) == {"gpu_util", "mem_util"} and "Not Supported" in errors["gpu_util"]
    nv = FakeNvml({}, unsupported={"power", "memory"})
    values, errors = read_fields(nv, "h")
    assert values == {"gpu_util": 87.0, "mem_util": 40.0} and set(errors) == {"gpu_mem_used", "power_w"}


def test_whole_gpu_uuid_and_mig_uuid_are_both_found():
    nv = FakeNvml({f"GPU-{UUID}": "whole"})
    assert find_handle(nv, UUID) == ("whole", False)
    nv = FakeNvml({f"MIG-{UUID}": "instance", "GPU-0": "physical0"})
    assert find_handle(nv, UUID) == ("instance", True)
    assert find_handle(nv, f"MIG-{UUID}") == ("instance", True)
    # an unknown UUID finds nothing: never the physical GPU 0 and its other tenants
    assert find_handle(nv, "aaaaaaaa-0000-0000-0000-000000000000") == (None, False)


def test_mig_instance_reads_no_whole_gpu_fields():
    nv = FakeNvml({}, unsupported={"util"})  # what NVML answers on a MIG instance
    values, errors = read_fields(nv, "instance", mig=True)
    assert "power" not in nv.calls
    assert values == {"gpu_mem_used": 5 * 2**30}
    assert set(errors) == {"gpu_util", "mem_util", "power_w"}


def test_process_memory_is_this_pid_only():
    procs = [SimpleNamespace(pid=10, usedGpuMemory=3 * 2**30),
             SimpleNamespace(pid=11, usedGpuMemory=7 * 2**30),
             SimpleNamespace(pid=12, usedGpuMemory=None)]
    nv = FakeNvml({}, processes=procs)
    assert process_memory(nv, "h", 10) == 3 * 2**30
    assert process_memory(nv, "h", 12) is None  # the driver withholds it
    assert process_memory(nv, "h", 99) is None  # a PID namespace hides ours
    values, _ = read_fields(nv, "h", pid=11)
    assert values["process_mem_used"] == 7 * 2**30
    values, _ = read_fields(nv, "h", pid=99)
    assert "process_mem_used" not in values


def test_memory_gate_takes_the_larger():
    gib = 2**30
    # 10 GiB reserved at peak, 1.5 GiB outside the allocator: 11.5 GiB, above the sampled 11
    assert memory_gate_bytes(10 * gib, 11 * gib, int(1.5 * gib)) == int(11.5 * gib)
    # a sampled peak above both (other tenants counted where NVML has no per-process figure)
    assert memory_gate_bytes(10 * gib, 20 * gib, gib) == 20 * gib
    assert memory_gate_bytes(10 * gib, None, None) == 10 * gib
    assert memory_gate_bytes(None, None, None) is None


def test_energy_per_image_counts_every_rank():
    assert energy_per_image([100.0, 110.0], [1000, 1000]) == pytest.approx(0.105)
    assert energy_per_image([100.0, None], [1000, 1000]) is None
    assert energy_per_image([], []) is None


def test_window_energy_uses_the_counter_only_over_long_windows():
    assert window_energy_j(1_000.0, 301_000.0, 250.0, 1.2) == pytest.approx(300.0)
    # a 0.1 s window: the counter may not have moved; power x time instead
    assert window_energy_j(1_000.0, 1_000.0, 250.0, 0.1) == pytest.approx(25.0)
    assert window_energy_j(1_000.0, 9_000.0, 250.0, MIN_ENERGY_COUNTER_S / 2) == pytest.approx(
        250.0 * MIN_ENERGY_COUNTER_S / 2)
    assert window_energy_j(None, None, None, 5.0) is None
