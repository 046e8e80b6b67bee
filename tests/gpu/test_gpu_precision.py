"""Precision plans on a CPU: torch_default leaves PyTorch's flags alone (and puts them back
after another precision changed them in the same process), cudnn.benchmark follows
bench.cudnn_benchmark alone whatever the precision, the TF32 flags read right whichever API
the process set them with, the maths MFU divides by follow the flags, and a step's FLOPs split
into convolutions and matmuls."""

from __future__ import annotations

import contextlib

import pytest
import torch

from gpubench.parts import precision
from gpubench.parts.models import TinyNet
from gpubench.parts.precision import (
    apply_backend_flags,
    backend_flags,
    resolve_precision,
)
from gpubench.parts.step import count_step_flops_split
from gpubench.telemetry.env import mfu_peak

PRECISIONS = ("torch_default", "fp32", "tf32", "amp_fp16", "amp_bf16")
# torch >= 2.9: the per-operation fp32_precision settings beside the legacy allow_tf32 flags
NEW_API = hasattr(torch.backends.cudnn, "conv")


@contextlib.contextmanager
def process_flags_restored():
    """Every TF32 and benchmark setting of the process as it was, afterwards: the legacy flags
    and, on torch >= 2.9, the new API's generic, cuda and per-operation precisions."""
    b = torch.backends
    legacy = precision._read_flags()
    nodes = []
    if NEW_API:
        nodes = [(b, b.fp32_precision), (b.cudnn, b.cudnn.fp32_precision),
                 (b.cuda.matmul, b.cuda.matmul.fp32_precision),
                 (b.cudnn.conv, b.cudnn.conv.fp32_precision),
                 (b.cudnn.rnn, b.cudnn.rnn.fp32_precision)]
    try:
        yield
    finally:
        precision._write_flags(legacy)
        for node, value in nodes:  # parents first: the getters resolve through them
            node.fp32_precision = value


@pytest.fixture
def fresh_flags(monkeypatch):
    """A process in which gpubench has not touched the flags yet; the flags restored after."""
    monkeypatch.setattr(precision, "_USER_FLAGS", None)
    with process_flags_restored():
        yield


def flags():
    return precision._read_flags()


def test_torch_default_leaves_flags_alone(fresh_flags):
    user = {"matmul_tf32": True, "cudnn_tf32": False, "cudnn_benchmark": False}
    precision._write_flags(user)  # what the user's own process set
    apply_backend_flags(resolve_precision("torch_default", "cuda"))
    assert flags() == user
    apply_backend_flags(resolve_precision("fp32", "cuda"))
    # cudnn.benchmark stays the user's: the precision sets the maths only
    assert flags() == {"matmul_tf32": False, "cudnn_tf32": False, "cudnn_benchmark": False}
    # a later run in the same process (Hydra's basic launcher): the user's flags come back
    apply_backend_flags(resolve_precision("torch_default", "cuda"))
    assert flags() == user
    apply_backend_flags(resolve_precision("tf32", "cuda"))
    assert flags()["matmul_tf32"] and flags()["cudnn_tf32"]


@pytest.mark.parametrize("users", [False, True])
def test_cudnn_benchmark_is_one_setting_for_every_precision(fresh_flags, users):
    """A precision sweep must change the maths alone: cudnn.benchmark follows
    bench.cudnn_benchmark (null: the process's own flag), the same for every precision, run
    after run in one process."""
    precision._write_flags({"matmul_tf32": False, "cudnn_tf32": True, "cudnn_benchmark": users})
    for setting in (None, True, False, None):
        expected = users if setting is None else setting
        for name in PRECISIONS:
            apply_backend_flags(resolve_precision(name, "cuda"), setting)
            assert torch.backends.cudnn.benchmark is expected, (name, setting)
            want = backend_flags(resolve_precision(name, "cuda"), setting,
                                 precision.user_flags())
            assert want["cudnn_benchmark"] is expected, (name, setting)
    # and the maths still follow the precision
    apply_backend_flags(resolve_precision("tf32", "cuda"), None)
    assert flags()["matmul_tf32"] and flags()["cudnn_tf32"]
    apply_backend_flags(resolve_precision("torch_default", "cuda"), None)
    assert flags() == {"matmul_tf32": False, "cudnn_tf32": True, "cudnn_benchmark": users}


def test_legacy_flags_read_where_the_new_api_is_absent():
    """torch 2.4 to 2.8 have no fp32_precision: the legacy allow_tf32 getter is read (a node
    without the attribute stands for that torch)."""
    assert precision._tf32_on(lambda: object(), lambda: True) is True
    assert precision._tf32_on(lambda: object(), lambda: False) is False


@pytest.mark.skipif(not NEW_API, reason="this torch has no fp32_precision API (< 2.9)")
def test_flags_read_after_the_process_set_only_the_new_api(fresh_flags):
    """A user's process that set TF32 through torch >= 2.9's per-operation API only: the legacy
    getters raise ("mix of the legacy and new APIs"), the flags still read, as the kernels see
    them, and a run's changes leave both APIs agreeing."""
    b = torch.backends
    b.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="legacy and new"):
        bool(b.cuda.matmul.allow_tf32)  # what _read_flags used to do
    assert flags()["matmul_tf32"] is True
    b.cudnn.conv.fp32_precision = "ieee"
    with pytest.raises(RuntimeError, match="legacy and new"):
        bool(b.cudnn.allow_tf32)
    assert flags()["cudnn_tf32"] is False
    plan = resolve_precision("torch_default", "cuda")
    assert (plan.conv_math, plan.matmul_math) == ("fp32", "tf32")
    apply_backend_flags(resolve_precision("fp32", "cuda"))
    assert flags()["matmul_tf32"] is False and flags()["cudnn_tf32"] is False
    assert not b.cuda.matmul.allow_tf32 and not b.cudnn.allow_tf32  # the APIs agree again
    apply_backend_flags(resolve_precision("torch_default", "cuda"))
    assert (flags()["matmul_tf32"], flags()["cudnn_tf32"]) == (True, False)  # the user's


@pytest.mark.skipif(not NEW_API, reason="this torch has no fp32_precision API (< 2.9)")
def test_fp32_means_fp32_under_a_generic_tf32_setting(fresh_flags):
    """torch.backends.fp32_precision="tf32" reaches every operation left at "none": fp32 must
    set convolutions to ieee outright, not leave them to inherit TF32."""
    b = torch.backends
    for node in (b.cudnn, b.cuda.matmul, b.cudnn.conv, b.cudnn.rnn):  # a process that set
        node.fp32_precision = "none"  # the generic precision alone (earlier runs set these)
    b.fp32_precision = "tf32"
    assert flags()["cudnn_tf32"] and flags()["matmul_tf32"]
    apply_backend_flags(resolve_precision("fp32", "cuda"))
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert not flags()["cudnn_tf32"] and not flags()["matmul_tf32"]


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
    # fc: 16 -> 10 on 4 images; forward 2*4*16*10, backward twice that (grad input + weight)
    assert split["matmul"] == pytest.approx(3 * 2 * 4 * 16 * 10)
    cuda_default = precision.PrecisionPlan("torch_default", None, False, None, "tf32", "fp32")
    by_math = cuda_default.flops_by_math(split["conv"], split["matmul"])
    assert set(by_math) == {"tf32", "fp32"}
    pk = mfu_peak("NVIDIA A100-SXM4-80GB", by_math)[0]
    assert 19.5e12 < pk < 156e12
    same = resolve_precision("amp_bf16", "cuda").flops_by_math(split["conv"], split["matmul"])
    assert same == {"bf16": split["total"]}
