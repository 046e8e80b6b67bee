"""The peak-FLOPs table behind MFU: the most specific device name wins; unknown means no MFU."""

from __future__ import annotations

import pytest

from gpubench.telemetry.env import PEAK_TFLOPS, facts, mixed_peak_flops, peak_flops


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
        # form factors with their own clocks: never the SXM row
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H100 NVL", "bf16", 835.0),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("Tesla V100-PCIE-16GB", "fp16", 112.0),
        ("Tesla V100-PCIE-32GB", "fp32", 14.0),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla V100S-PCIE-32GB", "fp16", 130.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA GB200", "bf16", 2500.0),
        ("NVIDIA A10G", "fp32", 31.2),
        ("NVIDIA L40S", "tf32", 183.0),
    ],
)
def test_known_devices(name, math, tflops):
    assert peak_flops(name, math) == pytest.approx(tflops * 1e12)


def test_unknown_device_or_dtype_gives_none():
    assert peak_flops("Some Future GPU", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # Volta has no bf16 units


def test_no_row_is_shadowed_by_an_earlier_one():
    """Every row is reachable: a name built from its own pattern is not claimed by a row above."""
    names = {
        r"\bGB200\b": "NVIDIA GB200", r"\bB200\b": "NVIDIA B200", r"\bGH200\b": "NVIDIA GH200",
        r"\bH200 NVL\b": "NVIDIA H200 NVL", r"\bH200\b": "NVIDIA H200",
        r"\bH100 PCIe\b": "NVIDIA H100 PCIe", r"\bH100 NVL\b": "NVIDIA H100 NVL",
        r"\bH100\b": "NVIDIA H100 80GB HBM3", r"\bA100\b": "NVIDIA A100-SXM4-40GB",
        r"\bL40S\b": "NVIDIA L40S", r"\bL40\b": "NVIDIA L40", r"\bL4\b": "NVIDIA L4",
        r"\bA10G\b": "NVIDIA A10G", r"\bA10\b": "NVIDIA A10",
        r"\bRTX 4090\b": "NVIDIA GeForce RTX 4090", r"\bRTX 3090\b": "NVIDIA GeForce RTX 3090",
        r"\bV100S\b": "Tesla V100S-PCIE-32GB",
        r"\bV100-PCIE\b|\bV100 PCIe\b": "Tesla V100-PCIE-16GB",
        r"\bV100-SXM2\b|\bV100 SXM2\b": "Tesla V100-SXM2-32GB", r"\bT4\b": "Tesla T4",
    }
    assert set(names) == {p for p, _ in PEAK_TFLOPS}
    for pattern, table in PEAK_TFLOPS:
        assert peak_flops(names[pattern], "fp32") == pytest.approx(table["fp32"] * 1e12), pattern


def test_unlisted_v100_form_factor_gets_no_mfu():
    # SXM3 (DGX-2) runs other clocks: no figure rather than the SXM2 one
    assert peak_flops("Tesla V100-SXM3-32GB", "fp16") is None


def test_mixed_peak_weights_each_kind_by_its_time():
    # A100: tf32 156, fp32 19.5 TFLOP/s. 90% of FLOPs in tf32 convs, 10% in fp32 matmuls
    pk = mixed_peak_flops("NVIDIA A100-SXM4-80GB", {"tf32": 9e12, "fp32": 1e12})
    assert pk == pytest.approx(10e12 / (9e12 / 156e12 + 1e12 / 19.5e12))
    assert 19.5e12 < pk < 156e12
    assert mixed_peak_flops("NVIDIA A100", {"tf32": 1.0}) == pytest.approx(156e12)
    assert mixed_peak_flops("Tesla T4", {"bf16": 1.0}) is None  # no bf16 row on Turing
    assert mixed_peak_flops("NVIDIA A100", {}) is None


def test_cpu_facts():
    f = facts("cpu")
    assert f["device"] == "cpu" and f["cpu_count"] >= 1 and f["torch"]
    assert f["device_memory_bytes"] > 0 and f["driver"] is None


def test_a_cpu_run_names_no_cuda_or_cudnn_it_did_not_use():
    """A CUDA wheel reports its build's CUDA/cuDNN even without a GPU: a CPU run's facts must
    not carry them as if the device had them."""
    f = facts("cpu")
    assert f["cuda"] is None and f["cudnn"] is None


def test_the_cpu_is_named_by_its_model(tmp_path):
    """Two CPUs of one architecture are two devices: the model name, not 'x86_64'."""
    from gpubench.telemetry.env import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 7B13  64-Core Processor\nflags\t: fpu\n")
    assert cpu_model(str(info)) == "AMD EPYC 7B13 64-Core Processor"
    info.write_text("processor\t: 0\n")
    assert cpu_model(str(info)) is None
    assert cpu_model(str(tmp_path / "absent")) is None
