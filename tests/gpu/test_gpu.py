"""CUDA-only checks of the measurement (skipped on machines without a GPU)."""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_config

from gpubench.run.runner import measure_run

pytestmark = pytest.mark.gpu

# the warm-up judged (up to 50 steps) after 3 pinned ones: TINY's warmup_max_steps=1 is below
# warmup_steps=3, a pair resolve refuses (tests/test_gpu_configs.py resolves these on a CPU)
GPU = ("bench.device=cuda", "model=resnet18", "dataset.image_size=64", "loader.batch_size=32",
       "bench.steps=10", "bench.warmup_steps=3", "bench.warmup_max_steps=50")
AMP = gpu_config("gpu.amp_fp16_channels_last", *GPU, "precision=amp_fp16", "channels_last=true")
FP32 = gpu_config("gpu.fp32", *GPU, "precision=fp32", "bench.phases=[compute]")
TF32 = gpu_config("gpu.tf32", *GPU, "precision=tf32", "bench.phases=[compute]")
DEVICE_DATA = gpu_config("gpu.device_synthetic", *GPU, "dataset=device_synthetic")


def test_gpu_run_reports_device_figures(compose_cfg, tmp_path):
    r = measure_run(compose_cfg(*AMP), tmp_path)
    d = r.data
    assert d["status"] == "ok", d["error"]
    # the gate (run/summary.py): torch's reserved peak plus what lives outside its allocator,
    # or the device memory sampled in use, whichever is larger, over the whole device
    assert d["memory_source"] == "max(torch reserved + outside torch, device in use)"
    assert 0 < d["torch_peak_allocated_bytes"] <= d["torch_peak_reserved_bytes"]
    assert d["peak_memory_bytes"] > d["torch_peak_reserved_bytes"]  # the CUDA context at least
    assert d["device_memory_bytes"] == torch.cuda.get_device_properties(0).total_memory
    assert d["peak_memory_fraction"] == pytest.approx(
        d["peak_memory_bytes"] / d["device_memory_bytes"])
    assert d["nvml_memory_used_bytes"] >= d["torch_peak_reserved_bytes"]
    assert 0 <= d["gpu_util_mean"] <= 100 and d["power_mean_w"] > 0
    # energy over a ~0.1 s window is checked in test_gpu_checks.py on a window >= 1 s
    for ph in d["phases"].values():  # CUDA-event step times, read after the closing sync
        assert ph["step_time_p50_s"] > 0 and ph["step_time_p95_s"] >= ph["step_time_p50_s"]


def test_fp32_really_disables_tf32(compose_cfg, tmp_path):
    measure_run(compose_cfg(*FP32), tmp_path)
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    measure_run(compose_cfg(*TF32), tmp_path / "b")
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32


def test_device_synthetic_bounds_e2e(compose_cfg, tmp_path):
    d = measure_run(compose_cfg(*DEVICE_DATA), tmp_path).data
    assert d["status"] == "ok"
    # no data cost: the loop runs at the compute bound (within noise)
    assert d["images_per_sec"] > 0.8 * d["compute_images_per_sec"]
    assert d["data_wait_fraction"] < 0.05
