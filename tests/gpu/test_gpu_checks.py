"""CUDA-only checks of what was made right by reading PyTorch's and torchvision's sources (no
GPU where it was written): each test names the finding it settles on a real device. Run by
`scripts/gpu_validation.sh review`; skipped without CUDA."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import at, compose_config, gpu_config

from gpubench.parts import precision
from gpubench.run.runner import measure_run

pytestmark = pytest.mark.gpu

GPU = ("bench.device=cuda", "model=resnet18", "dataset.image_size=64", "loader.batch_size=32",
       "bench.steps=10", "bench.warmup_steps=3", "bench.warmup_max_steps=50")
DECODE = gpu_config("gpu_checks.device_decode", "dataset=imagefolder", "dataset.root={tmp}",
                    "bench.device=cuda", "dataset.decode_on=device", "loader.num_workers=2",
                    "dataset.image_size=32")
DEFAULT_FLAGS = gpu_config("gpu_checks.torch_default", *GPU, "bench.phases=[compute]")
ENERGY = gpu_config("gpu_checks.energy", *GPU, "bench.phases=[e2e]", "dataset=device_synthetic",
                    "bench.steps=400")


def test_real_device_oom_reads_as_device():  # finding 10
    from gpubench.parts.oom import is_oom, oom_kind

    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(RuntimeError) as info:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    assert oom_kind(info.value) == "device" and is_oom(info.value, "cuda"), str(info.value)


def test_pinned_host_failure_is_not_a_device_oom():  # finding 10, second review 2.3
    from gpubench.parts.oom import PinnedMemoryError, is_oom, oom_kind, pin_host

    # 64 TiB of page-locked host memory through gpubench's pinning call (the labels of a
    # device-decoded batch): cudaHostAlloc's bare "CUDA error: out of memory" is tagged there
    with pytest.raises(PinnedMemoryError) as info:
        pin_host(torch.zeros(1), pin=lambda t: torch.empty(2**46, dtype=torch.uint8,
                                                             pin_memory=True))
    assert oom_kind(info.value) == "pinned", str(info.value)
    assert not is_oom(info.value, "cuda"), str(info.value)


def test_this_gpu_has_a_peak_row():  # finding 11
    from gpubench.telemetry.env import peak_flops

    name = torch.cuda.get_device_name(0)
    if not any(k in name for k in ("H100", "H200", "A100", "B200", "L40", "L4", "A10", "V100")):
        pytest.skip(f"{name}: not a data-centre GPU the table is meant to know")
    sms = torch.cuda.get_device_properties(0).multi_processor_count  # a MIG slice has fewer
    assert peak_flops(name, "fp32", sms) and peak_flops(name, "fp16", sms), (name, sms)


def test_nvml_fields_one_by_one_for_this_device():  # finding 12
    from gpubench.telemetry.nvml import Nvml, read_fields

    torch.empty(1, device="cuda")  # a context, so this process shows in NVML's list
    nvml = Nvml.get()
    dev = nvml.device_for(0)
    assert dev is not None, nvml.reason
    values, errors = read_fields(*dev, os.getpid())
    assert values.get("gpu_mem_used", 0) > 0, errors
    if not dev.mig:
        assert values.get("power_w", 0) > 0 and "gpu_util" in values, errors
    if "process_mem_used" in values:  # absent in a PID namespace (containers)
        assert values["process_mem_used"] >= torch.cuda.memory_reserved(0)


def test_nvjpeg_side_stream_output_is_right_while_the_stream_is_busy(tmp_path):  # finding 13
    """Decoded images equal the same decode done on an idle device, while the step's stream
    is kept busy and buffers are freed and reallocated between batches (the hazard)."""
    import sys
    from pathlib import Path

    from gpubench.parts.augment import DeviceDecode

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from make_imagefolder import make_imagefolder

    make_imagefolder(tmp_path, classes=1, per_class=16, size=96, quality=90, seed=3)
    files = sorted(tmp_path.rglob("*.jpg"))
    blobs = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in files]
    dec = DeviceDecode(64, "cuda")
    ref, failed = dec(blobs)
    torch.cuda.synchronize()
    ref = ref.clone()
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        busy = a @ a  # queued work on the current stream, the host runs ahead
        x, failed = dec(blobs)
        del busy  # freed while still in use by queued kernels: the block is up for reuse
        assert torch.equal(x, ref) and failed == []
    torch.cuda.synchronize()


@pytest.mark.slow  # the DataLoader's worker processes
def test_device_decode_labels_pinned_and_on_device(tmp_path):  # findings 8, 14
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from make_imagefolder import make_imagefolder

    from gpubench.config.settings import resolve
    from gpubench.parts.data import build_pipeline

    make_imagefolder(tmp_path, classes=2, per_class=8, size=48, seed=4)
    cfg = compose_config(*at(DECODE, tmp_path))
    pipe = build_pipeline(resolve(cfg))  # bench.device=cuda
    try:
        item = next(pipe.batches())  # the loader's (batch, images skipped)
        assert item[1] == 0 and item[0][0].data.dim() == 1  # one flat byte tensor per batch
        x, y = pipe.to_device(item)
    finally:
        pipe.shutdown()
    assert x.is_cuda and y.is_cuda and len(x) == len(y) == 4


def test_torch_default_leaves_flags_and_mfu_mixes(compose_cfg, tmp_path):  # finding 2
    user = precision.user_flags()
    d = measure_run(compose_cfg(*DEFAULT_FLAGS), tmp_path).data
    assert d["config"]["precision"]["name"] == "torch_default"
    assert precision._read_flags() == user
    assert d["flops_by_kind"]["conv"] > 0 and d["mfu"] is not None and 0 < d["mfu"] < 1


@pytest.mark.slow  # inductor's compile worker processes
def test_compile_reset_releases_cuda_graph_pools():  # finding 4
    from gpubench.parts.models import TinyNet, reset_compile_state

    model = TinyNet(10).cuda()
    f = torch.compile(model, mode="reduce-overhead")
    # one batch size: a trial's (a new size is a new trial, after a reset); three calls warm
    # up, record and replay the graph
    for bs in (8,):
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()  # a training loop's iteration
            f(torch.randn(bs, 3, 32, 32, device="cuda")).sum().backward()
            # as an optimizer step's zero_grad: a gradient kept would be a graph output that
            # the next replay overwrites while backward accumulates into it
            model.zero_grad(set_to_none=True)
    del f
    held = torch.cuda.memory_reserved()
    reset_compile_state("cuda")
    assert torch.cuda.memory_reserved() < held


def test_memory_outside_torch_and_energy(compose_cfg, tmp_path):  # findings 9, 15
    d = measure_run(compose_cfg(*ENERGY), tmp_path).data
    tel, mem = d["phases"]["e2e"]["telemetry"], d["phases"]["e2e"]["memory"]
    assert tel["device_used_peak_bytes"] > mem["torch_peak_reserved_bytes"]
    assert tel["non_torch_peak_bytes"] > 100 * 2**20  # the CUDA context alone is more
    assert d["phases"]["e2e"]["seconds"] >= 1.0, "window too short for the energy counter"
    assert tel["energy_j"] > 0 and d["energy_per_image_j"] > 0
