"""MLflow tracking against real stores: the embedded sqlite default and a real `mlflow server`.

Runs are the tiny CPU config (about a second each). Every check reads the runs back from MLflow
itself: params, metrics and their per-step history, tags, artifacts, parent/child links.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY, compose_config, free_port, run_cli, sqlite_store, start_process

from gpubench import tracking
from gpubench.core.stats import round_at, supported_place, text_at
from gpubench.run.runner import run_benchmark
from gpubench.tracking import sync

TRACKED = [*TINY, "tracking=mlflow"]  # TINY turns tracking off; the last override wins


def shown(value, ci):
    """A throughput as MLflow shows it: rounded to what its interval supports."""
    return round_at(value, supported_place(value, ci))


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def runs_of(uri: str, experiment: str) -> list:
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)


def closed_parent(uri: str, sweep, override: str) -> str:
    """The sweep's parent run, opened and closed as a sweep's start and end do; its id."""
    with tracking.open_store(uri, "sweeps") as store:
        parent = tracking.open_sweep(store, sweep, {"overrides": {"task": [override]}})
        tracking.close_sweep(store, sweep, parent)
    return parent


def artifact_paths(c, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for a in c.list_artifacts(run_id, path):
        out |= artifact_paths(c, run_id, a.path) if a.is_dir else {a.path}
    return out


@pytest.mark.slow  # a fresh interpreter: what a run imports is the subject
def test_tracking_off_never_loads_mlflow(tmp_path):
    """A whole run with tracking=none, and the sync CLI's modules, import no MLflow; the
    tracking modules alone import no torch either."""
    code = (
        "import sys, gpubench.tracking, gpubench.tracking.sync, gpubench.cli.callbacks; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "from hydra import compose, initialize_config_dir; "
        "from gpubench.config.paths import CONFIG_DIR; "
        "from gpubench.run.runner import run_benchmark; "
        "initialize_config_dir(version_base='1.3', config_dir=str(CONFIG_DIR)); "
        f"r = run_benchmark(compose('bench', overrides={list(TINY)!r}), {str(tmp_path)!r}, "
        "quiet=True); "
        "assert r.status == 'ok' and r.record.config['tracking']['backend'] == 'none'; "
        "assert 'mlflow' not in sys.modules, 'mlflow imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_embedded_default_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "runs" / "one"
    run_dir.mkdir(parents=True)
    (run_dir / "throughput.png").write_bytes(b"\x89PNG\r\n\x1a\n plot")  # a plot the run made
    (run_dir / "run.png").write_bytes(b"\x89PNG\r\n\x1a\n picture")  # the run's picture
    result = run_benchmark(compose_config("tracking=mlflow"), run_dir, quiet=True)
    failed = run_benchmark(compose_config("tracking=mlflow", "fault.fail_message=boom"),
                           tmp_path / "outputs" / "runs" / "two", quiet=True)
    assert result.tracked is True and failed.tracked is True

    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    assert tracking.default_uri() == uri
    c = client(uri)
    exp = c.get_experiment_by_name("gpubench")
    assert exp.artifact_location == (tmp_path / "outputs" / "mlartifacts").as_uri()
    # shown above the runs table: where gpubench's view of it is; the view; training runs
    assert exp.tags["mlflow.note.content"].startswith("**Views → gpubench**")
    assert "mlflow.sharedViewState.gpubench" in exp.tags
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = {r.data.tags["run_uid"]: r for r in runs_of(uri, "gpubench")}
    assert set(runs) == {result.data["run_uid"], failed.data["run_uid"]}
    run, d = runs[result.data["run_uid"]], result.data

    # the name: the setup, then the throughput rounded to its interval; the verdict is a tag
    assert run.info.status == "FINISHED"
    place = supported_place(d["images_per_sec"], d["images_per_sec_ci"])
    ips = text_at(d["images_per_sec"], 0 if place is None else place)
    assert run.info.run_name == f"tiny-bs4-w0-torch_default {ips}img/s"
    assert run.data.tags["verdict"] == d["bottleneck"]
    p = run.data.params
    assert (p["model"], p["dataset"], p["batch_size"], p["num_workers"]) == ("tiny", "synthetic", "4", "0")
    assert (p["precision"], p["device"], p["image_size"], p["pin_memory"]) == ("torch_default", "cpu", "16", "true")
    assert "loader.batch_size" not in p and p["bench.phases"] == '["loader", "compute", "e2e"]'
    m = run.data.metrics
    # throughputs rounded to what their intervals support; results.json keeps the raw
    for name, key in (("images_per_sec", "images_per_sec"),
                      ("loader/images_per_sec", "loader_images_per_sec"),
                      ("compute/images_per_sec", "compute_images_per_sec")):
        assert m[name] == pytest.approx(shown(d[key], d[f"{key}_ci"])), name
    assert m["objective"] == m["images_per_sec"]
    for name, key in (("memory/peak_bytes", "peak_memory_bytes"),
                      ("efficiency/flops_per_step", "flops_per_step"),
                      ("e2e/step_time_p50_s", "step_time_p50_s")):
        assert m[name] == pytest.approx(d[key]), name
    # grouped names only: the two sort keys stay unprefixed, the rest sits under a section
    assert {k for k in m if "/" not in k} == {"images_per_sec", "objective"}
    for phase in ("loader", "compute", "e2e"):
        ph = d["phases"][phase]
        assert m[f"{phase}/images_per_sec"] == pytest.approx(
            shown(ph["images_per_sec"], ph["images_per_sec_ci"]))
        assert m[f"{phase}/peak_rss_bytes"] == d["phases"][phase]["telemetry"]["peak_rss_bytes"]

    # the warm-up curve: one point per step, warm-up first, images/s = batch / step time
    s = d["series"]["e2e"]
    steps = [*s["warmup_step_times_s"], *s["step_times_s"]]
    hist = sorted(c.get_metric_history(run.info.run_id, "e2e/step_images_per_sec"),
                  key=lambda x: x.step)
    assert [h.step for h in hist] == [0, 1, 2]
    assert [h.value for h in hist] == pytest.approx([4 / t for t in steps])
    rss = c.get_metric_history(run.info.run_id, "e2e/telemetry/rss")
    assert sorted(h.value for h in rss) == sorted(x["rss"] for x in s["telemetry"])

    t = run.data.tags
    assert t["status"] == "ok" and t["bottleneck"] == d["bottleneck"]
    assert t["torch"] == d["env"]["torch"] and t["cpu_count"] == str(os.cpu_count())
    assert t["host"] == d["env"]["host"] and t["gpubench_version"] == "0.1.0"
    note = t["mlflow.note.content"]
    # the fold MLflow shows (100 px): the verdict and the figure first, then the picture
    head, _, picture = note.splitlines()[:3]
    assert head.startswith("**") and "img/s end-to-end" in head
    assert picture == f"![run picture](get-artifact?path=run.png&run_uuid={run.info.run_id})"
    assert d["bottleneck"] in note and "| e2e |" in note
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["synthetic 16px"]

    arts = artifact_paths(c, run.info.run_id)
    assert {"results.json", "resolved_config.yaml", "throughput.png", "run.png"} <= arts
    stored = tmp_path / "outputs" / "mlartifacts" / run.info.run_id / "artifacts" / "results.json"
    assert json.loads(stored.read_text())["run_uid"] == d["run_uid"]
    assert not (tmp_path / "mlruns").exists()

    bad = runs[failed.data["run_uid"]]
    assert bad.info.status == "FAILED"
    assert bad.data.tags["status"] == "failed" and "boom" in bad.data.tags["error"]

    marker = json.loads((run_dir / tracking.MARKER_FILE).read_text())
    assert marker["synced"] and marker["run_id"] == run.info.run_id


@pytest.mark.slow
def test_remote_server(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = mlflow_server.url
    cfg = compose_config("tracking=mlflow", f"tracking.uri={url}", "tracking.experiment=remote",
                         "tracking.run_name=first")
    result = run_benchmark(cfg, tmp_path / "run", quiet=True)
    assert result.tracked is True

    (run,) = runs_of(url, "remote")
    assert run.info.run_name == "first" and run.info.status == "FINISHED"
    assert run.data.tags["run_uid"] == result.data["run_uid"]
    assert run.data.metrics["images_per_sec"] == pytest.approx(
        shown(result.data["images_per_sec"], result.data["images_per_sec_ci"]))
    # artifacts went through the server into its own artifact folder, not a local one
    assert {"results.json", "resolved_config.yaml"} <= artifact_paths(client(url), run.info.run_id)
    assert list(mlflow_server.artifacts.rglob("results.json"))
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlruns").exists()


@pytest.mark.slow
def test_server_down_then_sync_exactly_once(mlflow_server, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = run_cli(*TRACKED, f"tracking.uri={dead}", "tracking.experiment=offline", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr  # measured and kept, not tracked
    warnings = [ln for ln in proc.stderr.splitlines() if "tracking.uri" in ln]
    assert len(warnings) == 1, proc.stderr
    assert f"tracking.uri={dead}" in warnings[0]
    assert "python -m gpubench.tracking sync" in warnings[0]
    (results,) = tmp_path.glob("outputs/runs/*/*/results.json")
    data = json.loads(results.read_text())
    assert data["status"] == "ok" and data["images_per_sec"] > 0
    marker, config = results.parent / tracking.MARKER_FILE, results.parent / tracking.CONFIG_FILE
    assert json.loads(marker.read_text())["synced"] is False
    # no retry storm against a dead server: the tracking attempt (from the config written
    # before any store is contacted to the marker written on failure) is one refused
    # connection, not MLflow's retries with backoff (minutes); the run's own time aside, so
    # a loaded machine cannot make it fail
    assert marker.stat().st_mtime - config.stat().st_mtime < 30

    # the server is back (here: a live one). An upload that broke half-way left a RUNNING run
    # with the same run_uid: sync replaces it rather than adding a second one.
    url = mlflow_server.url
    c = client(url)
    exp_id = c.create_experiment("offline")
    c.create_run(exp_id, tags={"run_uid": data["run_uid"]}, run_name="half-done")

    proc = run_cli("sync", "outputs", "--uri", url, module="gpubench.tracking", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 uploaded" in proc.stdout
    again = sync.sync(tmp_path / "outputs", uri=url)
    assert again["uploaded"] == 0 and again["present"] == 1

    (run,) = runs_of(url, "offline")
    assert run.data.tags["run_uid"] == data["run_uid"] and run.info.status == "FINISHED"
    assert f"tracking.uri={dead}" in run.data.tags["overrides"]
    arts = artifact_paths(c, run.info.run_id)
    assert {"results.json", "resolved_config.yaml", "hydra/overrides.yaml", "hydra/config.yaml",
            "gpubench.log"} <= arts  # Hydra's job log is named after the job
    assert json.loads((results.parent / tracking.MARKER_FILE).read_text())["run_id"] == run.info.run_id


@pytest.mark.slow
def test_multirun_one_parent_three_children(mlflow_server, tmp_path):
    proc = run_cli("-m", *TRACKED, "loader.batch_size=2,4,8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (sweep,) = tmp_path.glob("outputs/multirun/*/*")
    assert json.loads((sweep / tracking.PARENT_FILE).read_text())["synced"]

    def check(uri, experiment):
        runs = runs_of(uri, experiment)
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        assert len(runs) == 4 and len(parents) == 1
        parent = parents[0]
        children = [r for r in runs if r is not parent]
        assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
        assert sorted(r.data.params["batch_size"] for r in children) == ["2", "4", "8"]
        # the report's recommendation: the parent follows the report's rule
        from gpubench.search.rows import recommendation

        uid = recommendation(sweep).chosen.record.run_uid
        [best] = [r for r in children if r.data.tags["run_uid"] == uid]
        assert parent.info.status == "FINISHED"
        assert parent.data.params["loader.batch_size"] == "2,4,8"
        assert parent.data.tags["best_run_id"] == best.info.run_id
        assert parent.data.tags["best_run_name"] == best.info.run_name
        assert parent.data.metrics["best_images_per_sec"] == pytest.approx(
            best.data.metrics["images_per_sec"])
        assert parent.data.metrics["jobs"] == 3
        assert {"best_config.yaml", "multirun.yaml"} <= artifact_paths(client(uri), parent.info.run_id)
        return parent, children

    check(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}", "gpubench")
    assert sync.sync(tmp_path / "outputs")["uploaded"] == 0  # all there already

    # the same sweep synced into another store keeps its shape: 1 parent + 3 children
    counts = sync.sync(tmp_path / "outputs", uri=mlflow_server.url, experiment="copied")
    assert counts["uploaded"] == 3
    check(mlflow_server.url, "copied")


@pytest.mark.slow
def test_ctrl_c_is_a_killed_run(mlflow_server, tmp_path):
    url = mlflow_server.url
    proc = start_process(*TRACKED, f"tracking.uri={url}", "tracking.experiment=interrupted",
                     "bench.steps=1000000", "bench.max_seconds=1.5", cwd=tmp_path,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # each phase is capped at 1.5 s: interrupt once the first one is on disk, in the second
    while time.monotonic() < deadline:
        found = list(tmp_path.glob("outputs/runs/*/*/results.json"))
        if found and json.loads(found[0].read_text())["phases"]:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert json.loads(found[0].read_text())["status"] == "killed"
    (run,) = runs_of(url, "interrupted")
    assert run.info.status == "KILLED" and run.data.tags["status"] == "killed"
    assert run.data.metrics["loader/images_per_sec"] > 0


def test_the_parents_best_is_the_reports_recommendation(tmp_path):
    """One rule: the sweep parent's best is what the report attached to it recommends (a faster
    figure that found its own measurement disturbed is not it, whatever the objective or the
    manifest say); the manifest's best only when the report has no recommendation."""
    from gpubench.core.files import write_json
    from gpubench.core.record import RunRecord, Status
    from gpubench.search.rows import recommendation

    sweep = tmp_path / "sweep"
    for i, (ips, stable) in enumerate([(900.0, False), (500.0, True)]):
        rec = RunRecord(status=Status.ok, images_per_sec=ips, peak_memory_fraction=0.3,
                        memory_ceiling=0.8, measurement_stable=stable, dir=sweep / str(i),
                        noise_reasons=[] if stable else ["compute step times vary"],
                        config={"model": {"name": "tiny"}, "loader": {"batch_size": 8 * (i + 1)}},
                        started_at=f"2026-11-21T10:0{i}:00")
        (sweep / str(i)).mkdir(parents=True)
        rec.save()
    write_json(sweep / "sweep.json", {"best": {"dir": str(sweep / "0")}})
    uri = sqlite_store(tmp_path / "mlflow.db")
    parent = closed_parent(uri, sweep, "loader.batch_size=8,16")
    tags = client(uri).get_run(parent).data.tags
    assert recommendation(sweep).chosen.record.dir == sweep / "1"
    assert tags["best_run_dir"] == str(sweep / "1") == str(tracking.best_job(sweep).dir)
    # every job a max-batch probe: the report recommends nothing, the manifest's best stands
    write_json(sweep / "sweep.json", {"best": {"dir": str(sweep / "0")},
                                      "jobs": [{"dir": str(sweep / str(i)), "num": i,
                                                "rung": "probe"} for i in range(2)]})
    assert recommendation(sweep) is None and tracking.best_job(sweep).dir == sweep / "0"


def test_the_parents_best_pools_a_grids_repeats_as_the_report_does(tmp_path):
    """A grid repeating a setup (a key inert at 0 workers: prefetch_factor=2,4) is one row of
    the report, its figure the median of its runs; the parent read the folder row by row, named
    another run best (1000 img/s against the report's pick) and logged that run's own figure."""
    from gpubench.core.record import RunRecord, Status
    from gpubench.report.write import sweep_report
    from gpubench.search.rows import recommendation

    sweep = tmp_path / "sweep"
    for i, (ips, workers) in enumerate([(1000.0, 0), (800.0, 0), (900.0, 0), (700.0, 1)]):
        rec = RunRecord(status=Status.ok, images_per_sec=ips, images_per_sec_ci=[ips - 150, ips + 150],
                        peak_memory_fraction=0.3, memory_ceiling=0.8, measurement_stable=True,
                        dir=sweep / str(i), started_at=f"2026-11-21T10:0{i}:00",
                        config={"model": {"name": "tiny"},
                                "loader": {"batch_size": 8, "num_workers": workers}})
        (sweep / str(i)).mkdir(parents=True)
        rec.save()
    sweep_report(sweep, quiet=True)
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    best = tracking.best_job(sweep)
    assert str(best.dir) == summary["recommended"]["dir"] == str(recommendation(sweep).chosen.dir)
    assert best.images_per_sec == summary["recommended"]["images_per_sec"] == 900.0  # the median
    # every join of a sweep=pipes failed (sweep.json best null): the parent named its loader-only
    # trial, 3100 img/s, the sweep's best; a stage's run is no training measurement
    for d in sweep.iterdir():
        if d.name.isdigit():
            rec = RunRecord.from_dict(json.loads((d / "results.json").read_text()), d)
            if d.name == "1":
                rec.config["bench"] = {"phases": ["loader"]}
                rec.images_per_sec, rec.loader_images_per_sec = None, 3100.0
            else:
                rec.status, rec.images_per_sec = Status.failed, None
            rec.save()
    (sweep / "sweep.json").write_text(json.dumps({"best": None}))
    assert recommendation(sweep) is None and tracking.best_job(sweep) is None


def test_the_parents_best_run_name_is_a_runs_own(tmp_path):
    """A setup run twice (1000 and 800 img/s) is one row at its median, 900: the parent's
    best_run_name read `tiny-bs8 900img/s`, a name no run has; it is the newest run's own."""
    from gpubench.core.record import RunRecord, Status

    sweep = tmp_path / "sweep"
    for i, ips in enumerate([1000.0, 800.0]):
        rec = RunRecord(status=Status.ok, images_per_sec=ips, images_per_sec_ci=[ips - 150, ips + 150],
                        peak_memory_fraction=0.3, memory_ceiling=0.8, measurement_stable=True,
                        dir=sweep / str(i), started_at=f"2026-11-21T10:0{i}:00",
                        config={"model": {"name": "tiny"}, "loader": {"batch_size": 8}})
        (sweep / str(i)).mkdir(parents=True)
        rec.save()
    assert tracking.best_job(sweep).images_per_sec == 900.0
    uri = sqlite_store(tmp_path / "mlflow.db")
    parent = closed_parent(uri, sweep, "loader.batch_size=8")
    tags = client(uri).get_run(parent).data.tags
    assert tags["best_run_dir"] == str(sweep / "1") and tags["best_run_name"].endswith(" 800img/s")
    # its marker names a run this store does not hold (synced elsewhere, deleted): the parent
    # still ends, named from the record
    (sweep / "1" / tracking.MARKER_FILE).write_text(json.dumps({"run_id": "f" * 32}))
    parent = closed_parent(uri, sweep, "loader.batch_size=8")
    run = client(uri).get_run(parent)
    assert run.info.status == "FINISHED" and run.data.tags["best_run_name"].endswith(" 800img/s")
    assert "best_run_id" not in run.data.tags  # no id leading nowhere


def test_an_upload_is_claimed_by_one_holder_at_a_time(tmp_path):
    """The claim is a file lock (filelock): a second claimer is told who holds it; released, it
    is gone and free; a claim file nobody holds (its process died: the kernel dropped its lock)
    is taken. A real process killed mid-upload: tests/test_faults.py."""
    import socket

    from gpubench.tracking.runs import CLAIM_FILE, upload_claim

    run = tmp_path / "run"
    run.mkdir()
    with upload_claim(run) as holder:
        assert holder is None
        with upload_claim(run) as other:  # held: left alone
            assert other == f"{socket.gethostname()}:{os.getpid()}"
        assert (run / CLAIM_FILE).exists()  # only a claim this process holds is given back
    assert not (run / CLAIM_FILE).exists()
    (run / CLAIM_FILE).write_text("vm:4242")  # left by a process that is gone
    with upload_claim(run) as holder:
        assert holder is None
    assert not (run / CLAIM_FILE).exists()


def test_retry_tries_again_and_raises_the_last_error():
    from gpubench.core.files import retry

    waits, calls = [], []

    def collides_twice():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError(f"table exists ({len(calls)})")
        return "made"

    assert retry(collides_twice, 3, 0.5, sleep=waits.append) == "made" and waits == [0.5, 1.0]
    calls.clear()
    with pytest.raises(RuntimeError, match=r"\(2\)"):
        retry(collides_twice, 2, 0.5, sleep=waits.append)
    with pytest.raises(KeyError):  # another error is not a collision: raised at once
        retry(lambda: {}["x"], 3, 0.5, errors=RuntimeError, sleep=waits.append)
    assert waits == [0.5, 1.0, 0.5]


def test_mlflows_telemetry_is_off_unless_the_user_turns_it_on(monkeypatch):
    """Nothing is sent where the user did not say: MLflow's usage telemetry off by default, a
    user's own setting kept."""
    from mlflow.telemetry.utils import is_telemetry_disabled

    from gpubench.tracking.store import no_telemetry

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    no_telemetry()
    assert is_telemetry_disabled()
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    no_telemetry()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"
