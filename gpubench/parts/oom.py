"""Out of memory, told apart by what ran out: the device's memory (a batch too big for it: a
sweep's infeasible point), the host's RAM, or page-locked host memory (a host limit a smaller
batch does not cure the same way). Read from the error's type, text and where it was raised."""

from __future__ import annotations

import traceback

import torch

# torch.OutOfMemoryError (torch >= 2.5; MPS's too) and the CUDA allocator's
OOM_ERRORS = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
              torch.cuda.OutOfMemoryError)


class PinnedMemoryError(RuntimeError):
    """Page-locking host memory ran out. Its own type: a failed cudaHostAlloc reads "CUDA error:
    out of memory", as a failed cudaMalloc does (CachingHostAllocator.cpp)."""


def pin_host(t: torch.Tensor, pin=torch.Tensor.pin_memory) -> torch.Tensor:
    """`t` page-locked, an allocation failure raised as PinnedMemoryError. `pin`: the pinning
    call (torch's; a test's raises a recorded error)."""
    try:
        return pin(t)
    except RuntimeError as e:
        if _what_ran_out(e) is None:  # not a memory failure: nothing to re-label
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PinnedMemoryError(
            f"pinning {t.numel() * t.element_size()} bytes of host memory failed ({first}): "
            "page-locked host RAM ran out, not the GPU's memory (a smaller loader.batch_size "
            "or prefetch_factor, fewer workers, or loader.pin_memory=false)") from e


# What ran out, from the texts of the error's chain (a worker or pin thread re-raises a message
# inside its own), first match wins (tests/parts/test_oom.py gives each text's source). "device":
# allocators' and libraries' cudaMalloc; not CUDNN_STATUS_NOT_INITIALIZED, which any failed CUDA
# init gives. "host": the CPU allocator (alloc_cpu.cpp) and MemoryError.
OOM_MESSAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("device", ("cuda out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                "cufft_alloc_failed", "cusolver_status_alloc_failed",
                "cusparse_status_alloc_failed", "nvjpeg_status_allocator_failure",
                "cuda error: out of memory", "cudaerrormemoryallocation")),
    ("host", ("defaultcpuallocator: can't allocate memory",
              "defaultcpuallocator: not enough memory", "cannot allocate memory")),
    ("device", ("out of memory",)),
)

# DataLoader(pin_memory=True) pins with this module's pin_memory(), in the main thread without
# workers, else in its pin thread, whose error is re-raised in the main thread as "Caught <type>
# in pin memory thread for device N.\nOriginal Traceback ..." (ExceptionWrapper)
_PIN_MODULE = "torch.utils.data._utils.pin_memory"
_PIN_THREAD = "in pin memory thread"


def _chain(exc: BaseException) -> list[BaseException]:
    out, e = [], exc
    while e is not None and all(e is not o for o in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _what_ran_out(exc: BaseException) -> str | None:  # from the chain's texts, else types
    chain = _chain(exc)
    text = "\n".join(map(str, chain)).lower()
    kinds = [kind for kind, needles in OOM_MESSAGES if any(n in text for n in needles)]
    kinds += [kind for types, kind in ((OOM_ERRORS, "device"), (MemoryError, "host"))
              if any(isinstance(e, types) for e in chain)]
    return kinds[0] if kinds else None


def _while_pinning(exc: BaseException) -> bool:
    """Raised while pinning host memory: gpubench's pinning says so by type, the DataLoader's by
    the frames it passed through (main thread) or its pin thread's wrapper text."""
    return any(isinstance(e, PinnedMemoryError) or _PIN_THREAD in str(e)
               or any(frame.f_globals.get("__name__") == _PIN_MODULE
                      for frame, _ in traceback.walk_tb(e.__traceback__))
               for e in _chain(exc))


def oom_kind(exc: BaseException) -> str | None:  # "device", "host", "pinned" or None
    kind = _what_ran_out(exc)
    return "pinned" if kind is not None and _while_pinning(exc) else kind


def is_oom(exc: BaseException, device: str = "cuda") -> bool:
    """Did the benchmarked device run out of memory (status "oom", a point a sweep treats as
    too big)? On a CPU run host RAM is that device; a pinned-host failure never is."""
    kind = oom_kind(exc)
    return kind == "device" or (kind == "host" and device != "cuda")
