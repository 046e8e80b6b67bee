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
    "host_cpu_util_mean", "seconds",
]


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
    assert any("interrupted" in r or "step times vary" in r for r in d["noise_reasons"])
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
