"""The peak-FLOPs table behind MFU: the most specific device name wins; unknown means no MFU."""

from __future__ import annotations

import pytest

from gpubench.env import facts, peak_flops


@pytest.mark.parametrize(
    "name,math,tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "tf32", 494.7),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA L40S", "fp16", 362.0),
        ("NVIDIA L40", "fp16", 181.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("Tesla T4", "fp16", 65.0),
    ],
)
def test_known_devices(name, math, tflops):
    assert peak_flops(name, math) == pytest.approx(tflops * 1e12)


def test_unknown_device_or_dtype_gives_none():
    assert peak_flops("Some Future GPU", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # Volta has no bf16 units


def test_cpu_facts():
    f = facts("cpu")
    assert f["device"] == "cpu" and f["cpu_count"] >= 1 and f["torch"]
    assert f["device_memory_bytes"] > 0 and f["driver"] is None
