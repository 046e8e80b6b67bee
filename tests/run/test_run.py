"""A full three-phase run of the tiny model, called as a plain function."""

from __future__ import annotations

import json
import math

import pytest

from gpubench.config.errors import ConfigError
from gpubench.run.runner import measure_run

# figures a three-phase CPU run must have measured (not merely carry as keys)
MEASURED = [
    "images_per_sec", "loader_images_per_sec", "compute_images_per_sec", "step_time_p50_s",
    "step_time_p95_s", "peak_memory_bytes", "peak_memory_fraction", "flops_per_step",
    "seconds",
]


def test_cpu_figures_are_cpu_time_over_wall_time(compose_cfg, tmp_path):
    """Windows of at least 0.12 s, two a phase (CPU time is read over 0.2 s or more): a host's
    share is at most 100%, this run's at most its cores' (plus the 5% a tick moves it)."""
    measure_run(compose_cfg("bench.min_window_s=0.12", "bench.phases=[e2e]"), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert 0 < data["host_cpu_util_mean"] <= 100.0 * 1.05
    assert 0 < data["process_cpu_util_mean"] <= 100.0 * data["env"]["cpu_count"] * 1.05


def test_three_phase_run_writes_results(compose_cfg, tmp_path):
    cfg = compose_cfg()
    result = measure_run(cfg, tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["run_uid"] == result.data["run_uid"] and len(data["run_uid"]) == 32
    for key in MEASURED:
        assert isinstance(data[key], (int, float)) and data[key] > 0, key
    assert data["schema_version"] == 2 and data["data_wait_fraction"] >= 0
    assert data["status"] == "ok"
    assert set(data["phases"]) == {"loader", "compute", "e2e"}
    for name in ("loader", "compute", "e2e"):
        ph = data["phases"][name]
        assert ph["steps"] == 2 and ph["images"] == 8
        assert ph["images_per_sec"] > 0
        assert ph["step_time_p50_s"] <= ph["step_time_p95_s"]
        assert ph["warmup_steps"] == 1
        # two interleaved windows of one step each, and the interval around their median
        assert ph["repeats"] == 2 and len(ph["windows"]) == 2
        lo, hi = ph["images_per_sec_ci"]
        assert lo <= ph["images_per_sec"] <= hi
    assert data["images_per_sec"] == data["phases"]["e2e"]["images_per_sec"]
    assert data["images_per_sec_ci"] == data["phases"]["e2e"]["images_per_sec_ci"]
    # a confident verdict only on a stable measurement whose intervals decide the rule;
    # otherwise inconclusive, saying why (noise reasons, or an interval across a threshold)
    assert data["measurement_stable"] is (not data["noise_reasons"])
    if data["bottleneck"] == "inconclusive":
        assert data["noise_reasons"] or "straddles" in data["reason"] or (
            "upper bound" in data["reason"])
    else:
        assert data["bottleneck"] in ("data", "compute", "overlap") and data["measurement_stable"]
    assert data["reason"] and data["advice"]
    # CPU run: GPU fields absent, host fields present
    assert data["gpu_util_mean"] is None and data["mfu"] is None
    assert data["peak_rss_bytes"] > 0 and 0 < data["peak_memory_fraction"] < 1
    assert data["memory_source"] == "host_rss"
    # CPU time is counted in 10 ms ticks: over windows of a few ms no figure, not 0% or 600%
    cpu = data["process_cpu_util_mean"]
    assert cpu is None or cpu <= 100.0 * data["env"]["cpu_count"] * 1.05
    assert data["flops_per_step"] > 0
    assert data["env"]["torch"] and data["env"]["device"] == "cpu"
    assert data["config"]["model"]["name"] == "tiny"
    assert math.isfinite(result.objective) and result.objective == data["images_per_sec"]


def test_device_synthetic_has_no_data_cost(compose_cfg, tmp_path):
    result = measure_run(compose_cfg("dataset=device_synthetic"), tmp_path)
    assert result.status == "ok"
    assert result.data["phases"]["loader"]["images_per_sec"] > result.data["compute_images_per_sec"]


@pytest.mark.parametrize("phases", ["[loader]", "[compute]", "[compute,e2e]"])
def test_phase_subsets(compose_cfg, tmp_path, phases):
    result = measure_run(compose_cfg(f"bench.phases={phases}"), tmp_path)
    assert result.status == "ok"
    assert list(result.data["phases"]) == phases.strip("[]").split(",")
    assert result.objective > 0


def test_injected_oom_is_recorded_not_raised(compose_cfg, tmp_path):
    result = measure_run(compose_cfg("fault.oom_above_batch=2"), tmp_path)
    assert result.status == "oom"
    assert result.objective == 0.0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["status"] == "oom" and "fault.oom_above_batch" in data["error"]
    # the loader phase ran before the model did: it is kept
    assert "loader" in data["phases"]


def test_over_ceiling_is_a_status(compose_cfg, tmp_path):
    result = measure_run(compose_cfg("memory.ceiling=0.0001"), tmp_path)
    assert result.status == "over_ceiling"
    assert result.objective == 0.0
    assert result.data["images_per_sec"] > 0  # measured, just not feasible


def test_failure_keeps_measured_nothing_lost(compose_cfg, tmp_path):
    # fails after the first round of windows (loader, compute, e2e): all three are kept
    result = measure_run(compose_cfg("fault.fail_message=boom", "fault.fail_after_windows=3"),
                         tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["status"] == "failed" and "boom" in data["error"]
    assert set(data["phases"]) == {"loader", "compute", "e2e"}
    assert all(p["repeats"] == 1 and p["images_per_sec"] > 0 for p in data["phases"].values())
    assert data["images_per_sec"] == data["phases"]["e2e"]["images_per_sec"]
    assert result.objective == 0.0


def test_stalled_steps_make_an_unstable_run_with_its_reason(compose_cfg, tmp_path):
    # a few compute/e2e steps stall 0.4 s among fast ones: the run must not give a verdict
    result = measure_run(compose_cfg("bench.steps=12", "bench.repeats=3", "fault.stall_every=5",
                                     "fault.stall_s=0.4"), tmp_path)
    d = result.data
    assert d["status"] == "ok" and d["measurement_stable"] is False
    # named for what it saw in the step times (a few interrupted steps, or their spread)
    # (windows this short cannot tell a passing hiccup from a disturbance: "too short")
    assert any(r["kind"] in ("disturbed", "too_short") and ("interrupted" in r["text"] or
               "step times vary" in r["text"]) for r in d["noise_reasons"])
    assert d["bottleneck"] == "inconclusive" and d["advice"]


def test_model_narrower_than_the_dataset_fails_before_any_work(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="model.num_classes=3.*10 classes"):
        measure_run(compose_cfg("model.num_classes=3"), tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_bad_input_raises_before_work(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="model.name"):
        measure_run(compose_cfg("model.name=resnet51"), tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_bad_folder_found_while_building_leaves_no_results(compose_cfg, tmp_path):
    root = tmp_path / "data"
    (root / "cats").mkdir(parents=True)  # a class folder without any image
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="dataset.root"):
        measure_run(compose_cfg("dataset=imagefolder", f"dataset.root={root}"), out)
    assert not (out / "results.json").exists()


def test_console_summary_shows_figures_verbatim(compose_cfg, tmp_path):
    from rich.console import Console

    from gpubench.report.console import print_result

    result = measure_run(compose_cfg(), tmp_path)
    result.record.advice = ["bench.phases=[loader,compute,e2e] to get a verdict"]
    con = Console(record=True, width=140)
    print_result(result, con)
    text = con.export_text()
    assert "bench.phases=[loader,compute,e2e]" in text  # brackets are not eaten as markup
    assert f"{result.data['images_per_sec']:,.1f}" in text
    assert "narrowest pipe:" in text and str(result.path) in text


def test_profile_trace_after_the_measured_windows(compose_cfg, tmp_path):
    import gzip

    result = measure_run(compose_cfg("bench.profile=true", "bench.profile_steps=2"), tmp_path)
    assert result.status == "ok"
    prof = result.data["profile"]
    trace = json.loads(gzip.open(prof["trace"]).read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"gpubench/data", "gpubench/step"} <= names  # the loop's two parts are marked
    assert any(n and n.startswith("aten::") for n in names)
    assert prof["steps"] == 2 and prof["top_ops"][0]["self_ms_per_step"] > 0
    assert (tmp_path / "traces" / "top_ops.txt").is_file()
    # profiling never overlaps a measurement: the phases are the usual ones, untouched
    assert result.data["phases"]["e2e"]["steps"] == 2


def test_a_study_job_carries_its_study_into_the_record_and_its_tags(compose_cfg, tmp_path,
                                                                    monkeypatch):
    from gpubench.core.record import STUDY_ENV, load
    from gpubench.tracking.translate import run_tags

    monkeypatch.setenv(STUDY_ENV, "shared-study")
    measure_run(compose_cfg("bench.phases=[loader]"), tmp_path)
    rec = load(tmp_path)
    assert rec.extra["study"] == "shared-study" and run_tags(rec)["study"] == "shared-study"


def test_a_worker_traceback_is_kept_as_one_line():
    from gpubench.run.runner import one_line_error

    e = RuntimeError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback "
                     "(most recent call last):\n  File \"x.py\", line 3\nValueError: bad pixel")
    assert one_line_error(e) == ("RuntimeError: Caught ValueError in DataLoader worker process "
                                 "0. ... ValueError: bad pixel")
    assert one_line_error(ValueError("plain")) == "ValueError: plain"


def test_a_run_that_failed_before_measuring_prints_no_verdict_and_no_advice(tmp_path):
    """Nothing was measured: no empty table, no memory figure of '-', and no 'bench.phases=...
    to get a verdict' advice that has nothing to do with why it failed."""
    import io

    from conftest import compose_config
    from rich.console import Console

    from gpubench.report.console import print_result

    r = measure_run(compose_config("fault.fail_message=boom"), tmp_path)
    assert r.status == "failed" and not r.record.phases
    buf = io.StringIO()
    print_result(r, Console(file=buf, width=120, highlight=False))
    out = buf.getvalue()
    assert "status: failed" in out and "boom" in out
    assert "peak memory: not measured" in out
    assert "narrowest pipe" not in out and "to get a verdict" not in out and "┏" not in out


def test_the_console_folds_its_lines_under_their_text_in_a_terminal(tmp_path):
    """At 80 columns a terminal folded the run's advice at its margin, where a continuation
    read as a line of its own (`here): this gap is contention`); folded here between words,
    each continuation sits under its line's text; piped (a log), lines stay whole."""
    import io

    from rich.console import Console

    from gpubench.report.console import fold

    con = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    advice = ("  1. on a CPU the loader's 1 worker take cores from the model itself (2 cores "
              "here): this gap is contention; on a GPU the two overlap")
    pieces = [p.plain for p in fold(advice, con)]
    assert len(pieces) == 2 and all(len(p) <= 80 for p in pieces)
    assert pieces[1].startswith("     here): this gap")  # under `on a CPU`, not at the margin
    assert " ".join(p.strip() for p in pieces) == advice.strip()
    verdict = "[bold]narrowest pipe: compute[/bold] - " + "compute-bound: e2e 78.7 " * 6
    folded = fold(verdict, con)
    assert folded[0].plain.startswith("narrowest pipe: compute - ")
    assert all(p.plain.startswith("  ") for p in folded[1:]) and len(folded) > 2
    assert [p.plain for p in fold("short line", con)] == ["short line"]
    # a figure stays with its interval, and a word longer than the width stays whole
    line = "  - smallest batch size (8) and fewest workers (0) within 5%: 1664.0 [1226.6-2101.5]"
    assert [p.plain for p in fold(line, con)][-1] == "    1664.0 [1226.6-2101.5]"
    path = "results: /" + "a" * 90
    assert [p.plain for p in fold(path, con)] == ["results:", "  /" + "a" * 90]


# ------------------------------------------------------------------ bench.min_window_s


def test_min_window_s_resolves_per_device(compose_cfg):
    """null: 2 s on CUDA with the sampler on (NVML's 1 s averages need the room), 0 on a CPU
    (the default CPU run is not lengthened) and with the sampler off; never past a window's
    cap; a given value as given, refused past the cap."""
    from gpubench.config.settings import GPU_MIN_WINDOW_S, min_window_s, resolve

    s = resolve(compose_cfg())
    assert s.bench.min_window_s == 0.0 and s.config["bench"]["min_window_s"] == 0.0
    bench = compose_cfg().bench  # TINY: 2 steps, so 2 windows of 30 s each at most
    assert min_window_s(bench, "cuda") == GPU_MIN_WINDOW_S == 2.0
    assert min_window_s(compose_cfg("bench.monitor=false").bench, "cuda") == 0.0
    assert min_window_s(compose_cfg("bench.max_seconds=2").bench, "cuda") == 1.0  # the cap
    assert resolve(compose_cfg("bench.min_window_s=0.5")).bench.min_window_s == 0.5
    with pytest.raises(ConfigError, match=r"bench.min_window_s=40.*<= a window's time cap.*30 s"):
        resolve(compose_cfg("bench.min_window_s=40"))
    with pytest.raises(ConfigError, match=r"bench.min_window_s=-1"):
        resolve(compose_cfg("bench.min_window_s=-1"))


def test_windows_last_min_window_s(compose_cfg, tmp_path):
    # one step per window, run on until the window has lasted 0.1 s on the host clock
    r = measure_run(compose_cfg("bench.phases=[compute]", "bench.min_window_s=0.1"), tmp_path)
    assert r.status == "ok", r.data["error"]
    for w in r.data["phases"]["compute"]["windows"]:
        assert w["seconds"] >= 0.1 and w["steps"] > 1 and not w["truncated"]


# ------------------------------------------------------------------ a host-blocking decode


def jpeg_batch(n: int, broken: bool = False):
    """A loader batch for device decode: n small JPEGs (or n byte strings that are none)."""
    import torch
    from torchvision.io import encode_jpeg

    from gpubench.parts.data import JpegBatch

    g = torch.Generator().manual_seed(0)
    blobs = [torch.full((64,), 7, dtype=torch.uint8) if broken else
             encode_jpeg(torch.randint(0, 256, (3, 20, 24), dtype=torch.uint8, generator=g))
             for _ in range(n)]
    offsets = torch.tensor([0] + [int(b.numel()) for b in blobs]).cumsum(0)
    return (JpegBatch(torch.cat(blobs), offsets, [f"{i}.jpg" for i in range(n)]),
            torch.arange(n)), 0


def test_a_rank_whose_batch_failed_to_decode_still_takes_its_step():
    """e2e under torchrun: the step is DDP's all-reduce, so a batch none of whose images decoded
    is replaced by the next one that does (one rank skipping would hang the others); alone, the
    step is skipped. The pipeline still gives up on a source where nothing decodes."""
    from gpubench.parts.augment import DeviceDecode
    from gpubench.parts.data import DeviceSide, Pipeline
    from gpubench.parts.datasets import CorruptImage
    from gpubench.run.runner import moved_batch

    def pipe():
        return Pipeline(None, DeviceSide("cpu", False, False, decode=DeviceDecode(16, "cpu")))

    p, later = pipe(), iter([jpeg_batch(2, broken=True), jpeg_batch(2)])
    x, y = moved_batch(p, later, jpeg_batch(2, broken=True), None, must_step=True)
    assert x.shape == (2, 3, 16, 16) and p.skipped == 4
    p = pipe()
    assert moved_batch(p, iter([jpeg_batch(2)]), jpeg_batch(2, broken=True), None,
                       must_step=False) is None
    endless = iter(lambda: jpeg_batch(2, broken=True), None)
    with pytest.raises(CorruptImage):
        moved_batch(pipe(), endless, jpeg_batch(2, broken=True), None, must_step=True)


def test_device_decode_marks_where_device_work_starts():
    """The pipeline's device decode tells the window where the decode returned (on CUDA nvJPEG
    blocks the host for all of it): the window then keeps that host time apart from the device
    work that follows (resize, crop), once per batch; the copy path reports none."""
    import torch

    from gpubench.parts.augment import DeviceDecode
    from gpubench.parts.data import DeviceSide, Pipeline
    from gpubench.parts.measure import DeviceStart, run_window

    batch = jpeg_batch(3)
    start, calls = DeviceStart(), []

    def after_decode():
        calls.append(1)
        start()

    decoding = Pipeline(None, DeviceSide("cpu", False, False, decode=DeviceDecode(16, "cpu")))

    def work(b):
        x, y = decoding.to_device(b, after_decode=after_decode)
        assert x.shape == (3, 3, 16, 16)
        return len(y)

    s = run_window("loader", lambda: batch, work, 3, "cpu", warmup_steps=1, steps=2,
                   warmup_max_s=30, max_s=30, device_start=start)
    assert len(calls) == 3  # once per batch: the warm-up step's and the window's two
    assert s.host_blocked_s is not None and s.host_blocked_s > 0 and s.device_work_s > 0
    copying = Pipeline(None, DeviceSide("cpu", False, False))
    plain_batch = ((torch.zeros(2, 3, 8, 8), torch.arange(2)), 0)
    s = run_window("loader", lambda: plain_batch,
                   lambda b: len(copying.to_device(b, after_decode=start)[1]), 2, "cpu",
                   warmup_steps=0, steps=2, warmup_max_s=30, max_s=30, device_start=start)
    assert s.host_blocked_s is None


def test_loader_record_keeps_host_decode_apart_on_cuda():
    """The serial bound's device data work is what queues on the training stream; a decode
    that blocked the host is recorded beside it, never in it."""
    from gpubench.core.stats import pool, stats_from
    from gpubench.run.merge import phase_record_fields
    from gpubench.telemetry.monitor import MonitorSummary

    w = stats_from("loader", 4, 8, [0.05, 0.05], 0.1, 0.02, [], 0.0, False)
    w.device_idle_s, w.device_work_s, w.host_blocked_s = 0.06, 0.004, 0.05
    rec = phase_record_fields(pool([w]), [MonitorSummary(samples=[], seconds=0.1)], "cuda",
                              "loader")
    assert rec["device_data_seconds_per_image"] == pytest.approx(0.0005)
    assert rec["host_decode_seconds_per_image"] == pytest.approx(0.00625)
    assert "host_blocked_seconds_per_image" not in rec
    cpu = phase_record_fields(pool([w]), [MonitorSummary(samples=[], seconds=0.1)], "cpu",
                              "loader")
    assert "host_decode_seconds_per_image" not in cpu and "device_data_seconds_per_image" not in cpu
