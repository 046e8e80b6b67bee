"""Which errors are the device running out of memory: a table of the messages PyTorch and the
CUDA libraries really raise (text as in their sources), read by gpubench.parts.step.oom_kind."""

from __future__ import annotations

import pytest
import torch

from gpubench.parts.step import is_oom, oom_kind

# (exception, kind): the message texts as c10, ATen's CUDA library checks and the DataLoader
# write them
CASES = [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                            "capacity of 79.10 GiB of which 1.02 GiB is free."), "device"),
    (torch.OutOfMemoryError("injected: batch 64 > fault.oom_above_batch"), "device"),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
     "device"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "device"),
    (RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"), "device"),
    (RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"),
     "device"),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
                  "reported at some other API call"), "device"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't "
                  "allocate memory: you tried to allocate 8589934592 bytes. Error code 12 "
                  "(Cannot allocate memory)"), "host"),
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1 bytes."),
     "host"),
    (MemoryError(), "host"),
    (OSError(12, "Cannot allocate memory"), "host"),
    # the DataLoader's pin thread re-raises cudaHostAlloc's failure with the same text as a
    # device OOM: where it happened is what tells them apart
    (RuntimeError("Caught RuntimeError in pin memory thread for device 0.\nOriginal Traceback "
                  "(most recent call last):\nRuntimeError: CUDA error: out of memory"), "pinned"),
    (RuntimeError("CUDA error: out of memory (cudaHostAlloc in CachingHostAllocator)"), "pinned"),
    (RuntimeError("Given groups=1, weight of size [8, 3, 3, 3], expected input to have 3 channels"),
     None),
    (ValueError("bad value"), None),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), None),
]


@pytest.mark.parametrize("exc,kind", CASES, ids=[f"{i}-{k}" for i, (_, k) in enumerate(CASES)])
def test_oom_kind_table(exc, kind):
    assert oom_kind(exc) == kind


def test_is_oom_depends_on_what_the_device_is():
    host = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")
    pinned = RuntimeError("Caught RuntimeError in pin memory thread for device 0.\nCUDA error: "
                          "out of memory")
    assert is_oom(host, "cpu") and not is_oom(host, "cuda")  # host RAM is the CPU's device memory
    assert not is_oom(pinned, "cuda") and not is_oom(pinned, "cpu")
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory."), "cuda")


def test_cause_chain_is_read():
    try:
        try:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate`")
        except RuntimeError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        assert oom_kind(outer) == "device"


def test_real_cpu_allocator_failure_is_host_oom():
    """A real allocation the CPU allocator refuses (2**62 bytes), not a made-up message."""
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**62, dtype=torch.uint8)
    assert oom_kind(info.value) == "host", str(info.value)
