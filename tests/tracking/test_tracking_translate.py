"""A run record as MLflow params, metrics, tags, name and description: pure, no server."""

from __future__ import annotations

import json

import pytest

from gpubench.core.record import RunRecord, Status
from gpubench.core.secrets import mask_secrets, split_credentials, without_masked_password
from gpubench.core.stats import round_at, supported_place, text_at
from gpubench.tracking import translate as T
from gpubench.tracking.store import uri_problem

CONFIG = {
    "model": {"name": "resnet50"}, "dataset": {"name": "imagenet", "image_size": 224},
    "loader": {"batch_size": 128, "num_workers": 8, "pin_memory": True},
    "precision": {"name": "amp_bf16"}, "channels_last": True, "compile": "off",
    "bench": {"phases": ["loader", "compute", "e2e"]},
    "tracking": {"uri": "postgresql+psycopg://bob:hunter2@db:5432/mlflow"},
}


def record(status=Status.ok, **kw) -> RunRecord:
    phases = {
        name: {"phase": name, "batch_size": 128, "images_per_sec": ips,
               "images_per_sec_ci": [ips * 0.95, ips * 1.05], "data_wait_fraction": 0.4,
               "telemetry": {"gpu_util_mean": 55.0, "peak_rss_bytes": 1e9, "read_bytes": 7}}
        for name, ips in (("loader", 1800.0), ("compute", 3100.0), ("e2e", 1750.0))
    }
    d = {
        "run_uid": "u1", "status": status.value, "images_per_sec": 1750.0,
        "images_per_sec_ci": [1750 * 0.95, 1750 * 1.05],
        "loader_images_per_sec": 1800.0, "compute_images_per_sec": 3100.0,
        "bottleneck": "data", "reason": "the loader delivers 58% of compute",
        "verdict_margin": 0.42, "measurement_stable": True, "advice": ["more workers"],
        "peak_memory_fraction": 0.5, "memory_ceiling": 0.9, "mfu": 0.31,
        "phases": phases, "config": CONFIG, "env": {"device": "cuda", "torch": "2.4.0"},
        "series": {"e2e": {"warmup_step_times_s": [0.5], "step_times_s": [0.1, 0.2],
                           "telemetry": [{"t": 10.0, "gpu_util": 50.0, "workers": 8},
                                         {"t": 10.5, "gpu_util": 60.0}]}},
        "data_info": {"samples": 1000},
    } | kw
    return RunRecord.from_dict(d)


def test_run_status_covers_every_status():
    assert set(T.RUN_STATUS) == set(Status)
    assert T.RUN_STATUS[Status.killed] == "KILLED" and T.RUN_STATUS[Status.oom] == "FAILED"
    assert T.RUN_STATUS[Status.over_ceiling] == "FINISHED"


def test_metrics_are_grouped_by_prefix():
    m = {(k, step): v for k, v, step, _ in T.run_metrics(record(), now_ms=1000)}
    names = {k for k, _ in m}
    assert {n for n in names if "/" not in n} == {"images_per_sec", "objective"}
    assert {n.split("/")[0] for n in names} == {
        "images_per_sec", "objective", "e2e", "loader", "compute", "memory", "efficiency",
        "verdict", "data"}
    assert m[("loader/images_per_sec", 0)] == 1800.0
    assert m[("e2e/images_per_sec_ci_low", 0)] == 1660.0  # 1662.5, rounded to its interval
    assert m[("memory/peak_fraction", 0)] == 0.5 and m[("efficiency/mfu", 0)] == 0.31
    assert m[("verdict/margin", 0)] == 0.42 and m[("objective", 0)] == 1750.0
    # per-step series under their phase, warm-up first: batch / step time
    assert [m[("e2e/step_images_per_sec", i)] for i in range(3)] == pytest.approx(
        [128 / 0.5, 128 / 0.1, 128 / 0.2])
    assert [m[("e2e/telemetry/gpu_util", i)] for i in range(2)] == [50.0, 60.0]
    # bookkeeping counters are not charted
    assert not any("workers" in n or "read_bytes" in n for n in names)


def test_a_cpu_reading_over_a_few_ticks_is_not_charted():
    """A window's last reading comes ms after the one before: its CPU share counts 10 ms
    ticks (600% on 2 cores), so the chart leaves it out; GPU readings and older records
    (no `dt`) are charted as they are."""
    series = {"e2e": {"telemetry": [
        {"t": 10.0, "dt": 0.2, "procs_cpu": 190.0, "host_cpu": 95.0, "gpu_util": 50.0},
        {"t": 10.005, "dt": 0.005, "procs_cpu": 600.0, "host_cpu": 100.0, "gpu_util": 60.0},
        {"t": 10.2, "procs_cpu": 180.0}]}}
    m = {(k, step): v for k, v, step, _ in T.run_metrics(record(series=series))}
    assert [m.get(("e2e/telemetry/procs_cpu", i)) for i in range(3)] == [190.0, None, 180.0]
    assert ("e2e/telemetry/host_cpu", 1) not in m
    assert m[("e2e/telemetry/gpu_util", 1)] == 60.0


def test_objective_follows_the_record():
    over = T.run_metrics(record(peak_memory_fraction=0.95))  # above the 0.9 ceiling
    assert dict((k, v) for k, v, *_ in over)["objective"] == 0.0
    running = T.run_metrics(record(Status.running))
    assert "objective" not in {k for k, *_ in running}


def test_name_is_the_setup_then_the_throughput():
    """The setup leads (runs of one experiment differ there), then the figure rounded to its
    interval; the verdict is a column of its own, never a word of the name."""
    assert T.run_name(record()) == "resnet50-bs128-w8-amp_bf16-cl 1750img/s"
    leans = record(bottleneck="inconclusive", verdict_leaning="compute")
    assert T.run_name(leans) == "resnet50-bs128-w8-amp_bf16-cl 1750img/s"
    assert T.run_tags(leans)["verdict"] == "inconclusive"
    assert T.headline(leans).startswith("**inconclusive (leans to compute)** · 1750 [")
    # the figure is rounded to what its interval supports: +-5% keeps 3 figures
    odd = record(images_per_sec=812.3, images_per_sec_ci=[771.7, 852.9], bottleneck="compute")
    assert T.run_name(odd) == "resnet50-bs128-w8-amp_bf16-cl 812img/s"
    wide = record(images_per_sec=646.79, images_per_sec_ci=[184.4, 828.7])
    assert T.run_name(wide).endswith(" 650img/s")
    # a name, not a figure: no finer than whole images or 3 figures, however narrow the interval
    narrow = record(images_per_sec=1808.234, images_per_sec_ci=[1808.2, 1808.3])
    assert T.run_name(narrow).endswith(" 1808img/s")
    assert T.run_name(record(images_per_sec=12.3456, images_per_sec_ci=None)).endswith(" 12.3img/s")
    assert T.run_name(record(Status.over_ceiling, peak_memory_fraction=0.95)) == (
        "resnet50-bs128-w8-amp_bf16-cl 1750img/s over-ceiling")
    assert T.run_name(record(Status.oom)) == "resnet50-bs128-w8-amp_bf16-cl oom"
    assert T.run_name(record(), "mine") == "mine"


def test_the_experiments_view_shows_what_runs_log():
    """A new experiment opens its runs table with the throughput and the verdict as columns:
    each column the saved view names is a metric or a tag every measured run logs."""
    tags = T.experiment_tags(now_ms=5)
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert tags["mlflow.note.content"].startswith(f"**Views → {T.VIEW}**")
    view = json.loads(tags[f"mlflow.sharedViewState.{T.VIEW}"])
    assert (view["name"], view["createdAt"]) == (T.VIEW, 5)
    state = json.loads(view["state"])
    rec = record()
    logged = {"metrics": {k for k, *_ in T.run_metrics(rec)}, "tags": set(T.run_tags(rec))}
    columns = [c.partition(".")[::2] for c in state["selectedColumns"]]
    assert columns == [("metrics", "`images_per_sec`"), ("tags", "`verdict`")]
    assert all(name.strip("`") in logged[kind] for kind, name in columns)
    # beside the name, created and duration; the name's column wide enough for the name
    assert state["columnOrder"] == [T.NAME_COLUMN, "runDateAndNestInfo", "duration",
                                    *state["selectedColumns"]]
    assert state["columnWidths"] == T.VIEW_WIDTHS and set(T.VIEW_WIDTHS) <= set(state["columnOrder"])
    assert T.page("3") == "#/experiments/3/runs?viewStateShareKey=gpubench&workflowType=machine_learning"
    assert T.page("3", "r1") == "#/experiments/3/runs/r1?workflowType=machine_learning"


def test_the_printed_mlflow_link_can_be_opened():
    """A run's or sweep's link names its host: the server's (without its password), or the
    `mlflow ui` that serves a local store, at its default address."""
    from gpubench.tracking.store import ui_hint

    run = "#/experiments/3/runs/r1?workflowType=machine_learning"
    assert ui_hint("https://u:pw@mlflow.example.com/", "3", "r1") == \
        f"https://mlflow.example.com/{run}"
    assert ui_hint("sqlite:////data/mlflow.db", "3", "r1") == (
        f"`mlflow ui --backend-store-uri sqlite:////data/mlflow.db`, then open "
        f"http://127.0.0.1:5000/{run}")


def test_tags_and_description():
    rec = record(measurement_stable=False, noise_reasons=["host CPU busy"],
                 overlap_loss=0.05, overlap_loss_ci=[0.0, 0.18])
    tags = T.run_tags(rec, "tracking.uri=http://u:pw@h:5000", "alice")
    # the short column a user pins, first: the run page lists the tags in this order
    assert next(iter(tags)) == "verdict" and tags["verdict"] == "data"
    assert T.run_tags(record(Status.oom))["verdict"] == "oom"
    assert tags["bottleneck"] == "data" and tags["measurement_stable"] == "false"
    assert tags["status"] == "ok" and tags["mlflow.user"] == "alice"
    assert "pw" not in tags["overrides"] and "u:***@h" in tags["overrides"]
    note = T.describe(rec, "abc", picture=True).splitlines()
    # what the collapsed description box (100 px) shows: the verdict and the figure first
    assert note[0] == ("**data-bound** · 1750 [1660-1840] img/s end-to-end · overlap costs "
                       "0%-18% · measurement not stable")
    assert note[2] == "![run picture](get-artifact?path=run.png&run_uuid=abc)"
    text = "\n".join(note)
    assert "the loader delivers 58% of compute" in text and "host CPU busy" in text
    assert "| loader | 1800 | 1710 - 1890 | 40% |" in text and "1. more workers" in text
    assert "![" not in T.describe(rec, "abc", picture=False)
    # no cost at all is a figure too (its interval says how much it may still be)
    assert T.headline(record(overlap_loss=0.0, overlap_loss_ci=[0.0, 0.12])).endswith(
        " · overlap costs 0%-12%")
    failed = T.describe(record(Status.failed, error="boom"))
    assert failed.startswith("**failed**: boom") and "| phase |" not in failed


def test_the_description_table_rounds_an_interval_as_its_headline_does():
    """Outward, so both still hold what was measured: the headline read `812 [771-853]` and
    the table `772 - 853` for one interval."""
    rec = record(images_per_sec=812.3, images_per_sec_ci=[771.7, 852.9])
    rec.phases["e2e"].images_per_sec, rec.phases["e2e"].images_per_sec_ci = 812.3, [771.7, 852.9]
    text = T.describe(rec, "abc")
    assert "812 [771-853] img/s end-to-end" in text and "| e2e | 812 | 771 - 853 |" in text


def test_a_figure_without_interval_is_not_rounded():
    rec = record(images_per_sec=1753.4, images_per_sec_ci=None)
    assert T.run_name(rec).endswith(" 1753img/s")
    assert dict((k, v) for k, v, *_ in T.run_metrics(rec))["images_per_sec"] == 1753.4
    assert T.headline(rec).startswith("**data-bound** · 1753.4 img/s end-to-end")


def test_throughput_metrics_are_rounded_to_their_interval_and_results_keep_the_raw():
    rec = record(images_per_sec=812.3, images_per_sec_ci=[771.7, 852.9])
    rec.phases["loader"].images_per_sec = 1812.34
    rec.phases["loader"].images_per_sec_ci = [1803.3, 1821.4]  # +-0.5%: 4 figures
    m = dict((k, v) for k, v, *_ in T.run_metrics(rec))
    assert m["images_per_sec"] == 812.0 and m["objective"] == 812.0
    assert m["loader/images_per_sec"] == 1812.0
    # the ends rounded outward: the logged interval holds the measured one
    assert (m["loader/images_per_sec_ci_low"], m["loader/images_per_sec_ci_high"]) == (
        1803.0, 1822.0)
    assert m["e2e/images_per_sec_ci_low"] == 1660.0  # 1662.5 at +-5%: 3 figures
    wide = record(images_per_sec=1293.8, images_per_sec_ci=[894.0, 1329.0])
    assert T.headline(wide).startswith("**data-bound** · 1300 [800-1400] img/s")
    # figures without an interval are logged as measured
    assert m["e2e/data_wait_fraction"] == 0.4 and m["e2e/gpu_util_mean"] == 55.0
    assert rec.to_dict()["images_per_sec"] == 812.3


@pytest.mark.parametrize("value, ci, text", [
    (812.3, (771.7, 852.9), "812"),          # +-5%: 3 significant figures
    (1753.4, (1665.7, 1841.1), "1750"),      # +-5%: 3 significant figures
    (1812.34, (1803.3, 1821.4), "1812"),     # +-0.5%: 4
    (646.79, (184.4, 828.7), "650"),         # +-50%: 2
    (0.012345, (0.0117, 0.0130), "0.0123"),  # small figures keep their decimals
    (5.2, (0.0, 1000.0), "5"),               # never fewer than 1 figure
    (812.3, None, "812.3"),                  # no interval: nothing to round to
    (812.3, (812.3, 812.3), "812.3"),        # a single window: no spread
])
def test_the_rounding_rule(value, ci, text):
    at = supported_place(value, ci)
    assert text_at(value, at) == text
    assert round_at(value, at) == float(text)


def test_params_are_masked_and_spelled_as_overrides():
    p = T.run_params(record())
    assert p["batch_size"] == "128" and p["model"] == "resnet50" and p["device"] == "cuda"
    assert p["pin_memory"] == "true" and p["bench.phases"] == '["loader", "compute", "e2e"]'
    # one column per knob: its dotted keys are under its plain name
    assert not {"loader.batch_size", "model.name", "precision.name"} & set(p)
    assert p["tracking.uri"] == "postgresql+psycopg://bob:***@db:5432/mlflow"
    assert not any("hunter2" in v for v in p.values())
    # a dict from results.json works the same as the record
    assert T.run_params(record().to_dict()) == p


@pytest.mark.parametrize("text, masked", [
    ("postgresql://bob:s3cret@db/x", "postgresql://bob:***@db/x"),
    ("a http://u:p@ss@host:5000/p b", "a http://u:***@host:5000/p b"),
    ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
    ("tracking.uri=http\\://bob\\:pw@h\\:5000", "tracking.uri=http\\://bob\\:***@h\\:5000"),
    ("http://host:5000", "http://host:5000"),
    ("mail bob@example.com", "mail bob@example.com"),
    ("db?user=a&password=pw&x=1", "db?user=a&password=***&x=1"),
    ("'storage=mysql://root:toor@127.0.0.1/optuna'", "'storage=mysql://root:***@127.0.0.1/optuna'"),
    # malformed URIs, as the error line that rejects them shows them
    ("postgresql:bob:pw@db/x", "postgresql:bob:***@db/x"),
    ("bob:pw@db", "bob:***@db"),
    ("git@github.com:org/repo", "git@github.com:org/repo"),
    # a tree: a config, a manifest
    ({"best": {"overrides": ["tracking.uri=http://u:pw@h", 3]}, "n": (1.5, "a:b@c")},
     {"best": {"overrides": ["tracking.uri=http://u:***@h", 3]}, "n": (1.5, "a:***@c")}),
])
def test_mask_secrets(text, masked):
    assert mask_secrets(text) == masked


def test_credentials_leave_the_http_url():
    assert split_credentials("https://bob:p%40ss@mlflow.example:443/x") == (
        "https://mlflow.example:443/x", "bob", "p@ss")
    assert split_credentials("postgresql://a:b@h/db") == ("postgresql://a:b@h/db", None, None)
    assert without_masked_password("postgresql://a:***@h/db") == "postgresql://a@h/db"


@pytest.mark.parametrize("uri", [
    None, "", "http://127.0.0.1:5000", "https://bob:pw@mlflow.example/prefix",
    "sqlite:///tmp/mlflow.db", "postgresql+psycopg://bob@db:5432/mlflow",
    "postgresql+psycopg://postgres:@/postgres?host=/tmp/pg", "mysql://u@h/db",
    "databricks"])
def test_tracking_uris_accepted(uri):
    assert uri_problem(uri) is None


@pytest.mark.parametrize("uri", [
    "htp:/bad::uri", "http://", "http://host:port", "http+x://host", "sqlite://",
    "sqlite:relative.db", "postgresql://", "mlflow-host:5000", "ftp://host/x", "file://"])
def test_malformed_tracking_uris_rejected(uri):
    problem = uri_problem(uri)
    assert problem and "\n" not in problem and ("://" in problem or "scheme" in problem)


@pytest.mark.slow
@pytest.mark.slow  # a fresh interpreter: its logging is replaced as Hydra's jobs do
def test_log_records_are_masked_whatever_the_handlers():
    import subprocess
    import sys

    code = (
        "import logging, logging.config; from gpubench.core.secrets import mask_logging; "
        "mask_logging(); mask_logging(); "
        # handlers replaced afterwards, as Hydra does for every job
        "logging.config.dictConfig({'version': 1, 'handlers': {'h': {'class': "
        "'logging.StreamHandler'}}, 'root': {'handlers': ['h'], 'level': 'INFO'}}); "
        "logging.getLogger('x').info('uri=%s', 'postgresql://bob:hunter2@db/x'); "
        "logging.getLogger('y').info('plain %d', 5)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["uri=postgresql://bob:***@db/x", "plain 5"]
