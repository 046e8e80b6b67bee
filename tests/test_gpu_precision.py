"""Precision plans on a CPU: torch_default leaves PyTorch's flags alone (and puts them back
after another precision changed them in the same process), the maths MFU divides by follow the
flags, and a step's FLOPs split into convolutions and matmuls."""

from __future__ import annotations

import pytest
import torch

from gpubench.parts import precision
from gpubench.parts.models import TinyNet
from gpubench.parts.precision import apply_backend_flags, resolve_precision
from gpubench.parts.step import count_step_flops, count_step_flops_split
from gpubench.telemetry.env import mixed_peak_flops


@pytest.fixture
def fresh_flags(monkeypatch):
    """A process in which gpubench has not touched the flags yet; the flags restored after."""
    saved = precision._read_flags()
    monkeypatch.setattr(precision, "_USER_FLAGS", None)
    yield
    precision._write_flags(saved)


def flags():
    return precision._read_flags()


def test_torch_default_leaves_flags_alone(fresh_flags):
    user = {"matmul_tf32": True, "cudnn_tf32": False, "cudnn_benchmark": False}
    precision._write_flags(user)  # what the user's own process set
    apply_backend_flags(resolve_precision("torch_default", "cuda"))
    assert flags() == user
    apply_backend_flags(resolve_precision("fp32", "cuda"))
    assert flags() == {"matmul_tf32": False, "cudnn_tf32": False, "cudnn_benchmark": True}
    # a later run in the same process (Hydra's basic launcher): the user's flags come back
    apply_backend_flags(resolve_precision("torch_default", "cuda"))
    assert flags() == user
    apply_backend_flags(resolve_precision("tf32", "cuda"))
    assert flags()["matmul_tf32"] and flags()["cudnn_tf32"]


def test_torch_default_math_follows_pytorchs_defaults(fresh_flags):
    # PyTorch's out-of-the-box flags: TF32 convolutions, fp32 matmuls
    precision._write_flags({"matmul_tf32": False, "cudnn_tf32": True, "cudnn_benchmark": False})
    plan = resolve_precision("torch_default", "cuda")
    assert (plan.conv_math, plan.matmul_math, plan.tf32) == ("tf32", "fp32", None)
    # resolved after an fp32 run changed the flags: still the user's maths
    apply_backend_flags(resolve_precision("fp32", "cuda"))
    assert resolve_precision("torch_default", "cuda").conv_math == "tf32"
    assert resolve_precision("torch_default", "cpu").conv_math == "fp32"  # no TF32 on a CPU
    fp32 = resolve_precision("fp32", "cuda")
    assert (fp32.conv_math, fp32.matmul_math) == ("fp32", "fp32")


def test_flops_split_and_mixed_peak():
    model = TinyNet(num_classes=10)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    plan = resolve_precision("torch_default", "cpu")
    split = count_step_flops_split(model, plan, "cpu", x, y)
    assert split["conv"] > 0 and split["matmul"] > 0  # the classifier is a matmul
    assert split["conv"] + split["matmul"] == pytest.approx(split["total"])
    assert count_step_flops(model, plan, "cpu", x, y) == split["total"]
    # fc: 16 -> 10 on 4 images; forward 2*4*16*10, backward twice that (grad input + weight)
    assert split["matmul"] == pytest.approx(3 * 2 * 4 * 16 * 10)
    cuda_default = precision.PrecisionPlan("torch_default", None, False, None, "tf32", "fp32")
    by_math = cuda_default.flops_by_math(split["conv"], split["matmul"])
    assert set(by_math) == {"tf32", "fp32"}
    pk = mixed_peak_flops("NVIDIA A100-SXM4-80GB", by_math)
    assert 19.5e12 < pk < 156e12
    same = resolve_precision("amp_bf16", "cuda").flops_by_math(split["conv"], split["matmul"])
    assert same == {"bf16": split["total"]}
