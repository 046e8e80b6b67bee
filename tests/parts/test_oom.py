"""Which errors are the device running out of memory, and which the host's page-locked memory:
a table of the messages PyTorch and the CUDA libraries really raise (text as in their sources,
each row names its source), read by gpubench.parts.oom.oom_kind; and the pinning paths (gpubench's
own, the DataLoader's in the main thread and in its pin thread), driven on a CPU by a pinning
call that raises the host allocator's recorded error instead of allocating."""

from __future__ import annotations

import json

import pytest
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory as loader_pin

from gpubench.parts.oom import PinnedMemoryError, is_oom, oom_kind, pin_host
from gpubench.run.runner import Benchmark

# torch >= 2.8 raises C10_CUDA_CHECK failures as torch.AcceleratorError (a RuntimeError)
ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", RuntimeError)

# c10_cuda_check_implementation (c10/cuda/CUDAException.cpp) for cudaErrorMemoryAllocation:
# "CUDA error: " + cudaGetErrorString + the suffixes of that torch. This is what a failed
# cudaMalloc outside the caching allocator gives, and what the CUDA host allocator gives when
# cudaHostAlloc cannot pin (aten/src/ATen/cuda/CachingHostAllocator.cpp,
# allocate_host_memory_slowpath: C10_CUDA_CHECK(cudaHostAlloc(ptr, size, cudaHostAllocDefault))).
CUDA_ERROR_OOM_2_4 = (  # get_cuda_check_suffix, then c10_retrieve_device_side_assertion_info
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
    "other API call, so the stacktrace below might be incorrect.\nFor debugging consider "
    "passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
    "assertions.\n")
CUDA_ERROR_OOM_2_14 = (  # get_cuda_error_help + get_cuda_async_error_suffix (CUDAMiscFunctions)
    "CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation' in "
    "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
    "information.\nFor more detailed error information, run with CUDA_LOG_FILE=stderr\n")


class Unpinnable:
    """A batch whose pinning fails as the CUDA host allocator does: torch.utils.data's
    pin_memory() calls a batch's own .pin_memory() (a stand-in for the host, not for gpubench)."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def pin_memory(self, *args):
        raise self.exc


def raised(fn, *args) -> BaseException:
    try:
        fn(*args)
    except Exception as e:  # the error as the caller catches it, traceback included
        return e
    raise AssertionError("did not raise")


def pin_thread_error(exc: BaseException) -> BaseException:
    """What the DataLoader raises in the main thread when its pin thread failed: the thread
    (_pin_memory_loop) wraps the error in ExceptionWrapper(where="in pin memory thread for
    device N") and the iterator's _process_data calls its reraise(): PyTorch's own code both."""
    try:
        loader_pin(Unpinnable(exc))
    except Exception:
        wrapped = ExceptionWrapper(where="in pin memory thread for device 0")
    return raised(wrapped.reraise)


def recorded(text: str, kind=RuntimeError) -> BaseException:
    return kind(text)


# (exception, kind)
CASES = [
    # c10/cuda/CUDACachingAllocator.cpp, malloc's OOM report, raised as torch.OutOfMemoryError
    (torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
        "of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB "
        "memory in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 1.05 GiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."),
     "device"),
    (torch.OutOfMemoryError("injected: batch 64 > fault.oom_above_batch"), "device"),
    (torch.OutOfMemoryError(""), "device"),  # the type alone
    # aten/src/ATen/mps/MPSAllocator.mm, alloc_buffer_block
    (RuntimeError("MPS backend out of memory (MPS allocated: 17.36 GB, other allocations: "
                  "613.56 MB, max allowed: 18.13 GB). Tried to allocate 192.00 MB on private "
                  "pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for "
                  "memory allocations (may cause system failure)."), "device"),
    # TORCH_CUDABLAS_CHECK (ATen/cuda/Exceptions.h): "CUDA error: " + _cublasGetErrorEnum
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
     "device"),
    # AT_CUDNN_CHECK: "cuDNN error: " + cudnnGetErrorString
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "device"),
    # cudnnCreate's "CUDA Runtime API initialization failed": not only memory (a driver
    # mismatch gives it too), so not called an OOM
    (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"), None),
    (RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"), "device"),
    (RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling "
                  "`cusolverDnCreate(handle)`"), "device"),
    # C10_CUDA_CHECK on a failed cudaMalloc outside the caching allocator (not while pinning)
    (RuntimeError(CUDA_ERROR_OOM_2_4), "device"),
    (ACCELERATOR_ERROR(CUDA_ERROR_OOM_2_14), "device"),
    # c10/core/impl/alloc_cpu.cpp, posix_memalign failing (the real one: see below)
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't "
                  "allocate memory: you tried to allocate 8589934592 bytes. Error code 12 "
                  "(Cannot allocate memory)"), "host"),
    (MemoryError(), "host"),
    (OSError(12, "Cannot allocate memory"), "host"),
    # the pinning paths, as the caller sees them
    (pin_thread_error(RuntimeError(CUDA_ERROR_OOM_2_4)), "pinned"),
    (pin_thread_error(ACCELERATOR_ERROR(CUDA_ERROR_OOM_2_14)), "pinned"),
    (raised(loader_pin, Unpinnable(ACCELERATOR_ERROR(CUDA_ERROR_OOM_2_14))), "pinned"),
    (raised(pin_host, torch.zeros(4), Unpinnable(RuntimeError(CUDA_ERROR_OOM_2_4)).pin_memory),
     "pinned"),
    # a pin thread that failed for another reason is no memory error
    (pin_thread_error(RuntimeError("CUDA error: invalid argument")), None),
    (RuntimeError("Given groups=1, weight of size [8, 3, 3, 3], expected input to have 3 channels"),
     None),
    (ValueError("bad value"), None),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), None),
]


@pytest.mark.parametrize("exc,kind", CASES, ids=[f"{i}-{k}" for i, (_, k) in enumerate(CASES)])
def test_oom_kind_table(exc, kind):
    assert oom_kind(exc) == kind


def test_the_same_text_is_pinned_only_where_pinning_raised_it():
    """cudaHostAlloc's failure and a library's failed cudaMalloc read alike: where it was
    raised decides, for each torch's wording."""
    for text, kind in ((CUDA_ERROR_OOM_2_4, RuntimeError), (CUDA_ERROR_OOM_2_14, ACCELERATOR_ERROR)):
        assert oom_kind(kind(text)) == "device"
        assert oom_kind(raised(loader_pin, Unpinnable(kind(text)))) == "pinned"  # num_workers=0
        assert oom_kind(pin_thread_error(kind(text))) == "pinned"  # the pin thread


def test_pin_host_tags_a_pinning_oom_and_keeps_the_original():
    original = ACCELERATOR_ERROR(CUDA_ERROR_OOM_2_14)
    with pytest.raises(PinnedMemoryError) as info:
        pin_host(torch.zeros(8, dtype=torch.int64), Unpinnable(original).pin_memory)
    e = info.value
    assert e.__cause__ is original and "64 bytes" in str(e) and "CUDA error: out of memory" in str(e)
    assert not is_oom(e, "cuda") and not is_oom(e, "cpu")
    # another failure while pinning is not relabelled as memory
    other = RuntimeError("CUDA error: invalid argument")
    with pytest.raises(RuntimeError) as info:
        pin_host(torch.zeros(2), Unpinnable(other).pin_memory)
    assert info.value is other


def test_is_oom_depends_on_what_the_device_is():
    host = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")
    pinned = pin_thread_error(RuntimeError(CUDA_ERROR_OOM_2_4))
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


@pytest.mark.parametrize("where, status, error", [
    # gpubench's own pinning (DeviceSide.labels) failing as cudaHostAlloc does
    ("pin_host", "failed", "PinnedMemoryError"),
    # the same recorded text from a library's cudaMalloc: the device's OOM
    ("elsewhere", "oom", "CUDA error: out of memory"),
])
def test_run_records_a_pinning_failure_not_an_oom(compose_cfg, tmp_path, where, status, error):
    """The run's own record: a host-pinning failure fails the run (a sweep does not read it as
    'too big for the device'), and says what ran out."""
    bench = Benchmark(compose_cfg(), tmp_path)
    failing = ACCELERATOR_ERROR(CUDA_ERROR_OOM_2_14)

    def measure():  # in place of the phases: the failure is what is under test here
        if where == "pin_host":
            pin_host(torch.zeros(4, dtype=torch.int64), Unpinnable(failing).pin_memory)
        raise failing

    bench.measure = measure
    assert bench.run() is None
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["status"] == status and error in data["error"], data["error"]
    if where == "pin_host":
        assert "page-locked host RAM" in data["error"]
