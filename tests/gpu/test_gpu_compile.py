"""torch.compile state between runs of one process (Hydra's basic launcher runs a whole
multirun in one): each run starts from a clean dynamo cache. Uses dynamo's `eager` backend, so
no inductor compile is paid on this CPU."""

from __future__ import annotations

import torch

from gpubench.parts.models import TinyNet, maybe_compile, reset_compile_state


def cache_entries(fn) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(fn))


def test_reset_clears_what_earlier_runs_compiled():
    def step(x):
        return torch.relu(x) * 2

    compiled = torch.compile(step, backend="eager", dynamic=False)
    for bs in (2, 3, 4):  # three batch sizes, as three trials of a sweep would bring
        compiled(torch.randn(bs, 4))
    assert cache_entries(step) >= 2  # guards per shape: later trials would pile on these
    reset_compile_state("cpu")
    assert cache_entries(step) == 0


def test_maybe_compile_starts_each_run_clean():
    def f(x):
        return x + 1

    torch.compile(f, backend="eager")(torch.ones(2))
    assert cache_entries(f) == 1
    model = TinyNet(num_classes=3)
    assert maybe_compile(model, "off") is model  # an eager run resets too
    assert cache_entries(f) == 0
