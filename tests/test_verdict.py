"""The narrowest-pipe rule and its advice, on constructed throughputs."""

from __future__ import annotations

import pytest

from gpubench.verdict import Knobs, advise, classify


def knobs(**kw):
    base = dict(device="cuda", num_workers=1, cpu_count=8, pin_memory=False, preload=False,
                augment_on="cpu", precision="fp32", channels_last=False, compile="off",
                batch_size=64, dataset="imagefolder", memory_fraction=0.3, ceiling=0.8)
    return Knobs(**{**base, **kw})


@pytest.mark.parametrize(
    "loader,compute,e2e,expected",
    [
        (177, 260, 170, "data"),      # article 003 with 1 worker: e2e tracks the loader
        (440, 260, 255, "compute"),   # 2+ workers: the loader out-runs compute
        (440, 260, 120, "overlap"),   # both high, e2e far below the smaller
        (100, 100, 95, "compute"),    # balanced: loader not well below compute
    ],
)
def test_classify(loader, compute, e2e, expected):
    assert classify(loader, compute, e2e)[0] == expected


def test_utilization_plays_no_part():
    # same throughputs give the same verdict whatever the GPU utilization would be
    assert classify(440, 260, 255)[0] == "compute"


def test_partial_phases():
    assert classify(50, 200, None)[0] == "data"
    assert classify(None, None, 100, data_wait_fraction=0.6)[0] == "data"
    assert classify(None, None, 100, data_wait_fraction=0.01)[0] == "compute"
    assert classify(None, 100, None)[0] == "unknown"


def test_data_advice_turns_the_data_knobs():
    advice = " ".join(advise("data", knobs()))
    assert "loader.num_workers=2" in advice and "pin_memory=true" in advice


def test_zero_workers_overlap_advice():
    assert "num_workers=2 or more" in advise("overlap", knobs(num_workers=0))[0]


def test_compute_advice_amp_first_then_layout_and_batch():
    a = advise("compute", knobs())
    assert a[0].startswith("precision=amp_bf16")
    a = advise("compute", knobs(precision="amp_bf16", compile="default"))
    assert a[0].startswith("channels_last=true")
    assert any("loader.batch_size=128" in x for x in a)


def test_no_larger_batch_near_the_ceiling():
    a = advise("compute", knobs(precision="amp_bf16", channels_last=True, compile="default",
                                memory_fraction=0.7))
    assert not any("batch_size" in x for x in a)


def test_at_most_three_steps():
    assert len(advise("data", knobs(num_workers=1, cpu_count=2))) <= 3


def test_cpu_overlap_names_core_contention():
    a = advise("overlap", knobs(device="cpu", num_workers=2, cpu_count=2))
    assert "take cores from the model" in a[0]
