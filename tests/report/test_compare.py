"""`python -m gpubench.report --compare`: devices of one MLflow experiment side by side, on a real
sqlite MLflow store under tmp_path with runs logged by MlflowClient (results.json artifacts)."""

from __future__ import annotations

import pytest
from conftest import sqlite_store

from gpubench.core.record import PhaseRecord, RunRecord, Status
from gpubench.report import cli as report_cli
from gpubench.report import compare

T4, V100 = "Tesla T4", "Tesla V100-SXM2-16GB"


def rec(device, ips, energy=None, steps=50, model="resnet50", status=Status.ok, batch=128,
        peak=0.5) -> RunRecord:
    return RunRecord(
        status=status, images_per_sec=ips if status.measured else None,
        energy_per_image_j=energy, peak_memory_fraction=peak, memory_ceiling=0.9,
        phases={"e2e": PhaseRecord("e2e", batch, images_per_sec=ips)},
        env={"device": "cuda", "device_name": device},
        config={"model": {"name": model}, "dataset": {"name": "imagefolder", "image_size": 224},
                "loader": {"batch_size": batch}, "precision": {"name": "amp_fp16"},
                "bench": {"steps": steps}})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real sqlite store: reference article 003's T4 and V100, plus runs that must not count."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("mlflow")
    uri = sqlite_store(tmp / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("cmp", artifact_location=(tmp / "artifacts").as_uri())
    runs = [
        rec(T4, 260.0, energy=0.27), rec(T4, 240.0, energy=0.3, batch=64),
        rec(T4, 900.0, steps=5),  # a short screen: never the device's figure
        rec(V100, 760.0), rec(V100, 0.0, status=Status.oom, peak=None),
        rec(V100, 990.0, peak=0.95),  # over the memory ceiling: infeasible
        rec(V100, 1500.0, model="resnet18"),  # another workload: its own table
    ]
    for i, r in enumerate(runs):
        run = client.create_run(exp, tags={"device_name": r.env["device_name"]})
        d = tmp / f"run{i}"
        r.dir = d
        d.mkdir()
        client.log_artifact(run.info.run_id, str(r.save()))
        client.set_terminated(run.info.run_id)
    parent = client.create_run(exp)  # a sweep parent: no results.json
    client.set_terminated(parent.info.run_id)
    prices = tmp / "prices.yaml"
    prices.write_text("cost:\n  usd_per_hour:\n    Tesla T4: 0.35\n    V100: 2.48\n")
    return uri, prices


def test_ratios_per_device_on_the_same_workload(store):
    uri, prices = store
    groups = compare.compare_rows(compare.mlflow_records("cmp", uri),
                                  compare.load_prices(prices))
    r50 = groups["model resnet50, dataset imagefolder, 224 px"]
    assert [(d.device, d.images_per_sec, d.runs) for d in r50] == [(V100, 760.0, 1), (T4, 260.0, 3)]  # feasible runs
    t4 = r50[1]
    assert t4.images_per_joule == pytest.approx(1 / 0.27)
    assert r50[0].images_per_joule is None  # the V100 run measured no energy
    assert t4.images_per_dollar == pytest.approx(260 * 3600 / 0.35)
    assert r50[0].usd_per_hour == 2.48 and r50[0].price_source == "yours"  # "V100" matched
    v = {x["device"]: x for x in compare.versus(r50)}[V100]
    assert v["baseline"] == T4
    assert v["price_x"] == pytest.approx(2.48 / 0.35)
    assert v["throughput_x"] == pytest.approx(760 / 260)
    assert v["images_per_dollar_x"] == pytest.approx((760 / 2.48) / (260 / 0.35))
    assert [d.device for d in groups["model resnet18, dataset imagefolder, 224 px"]] == [V100]


def test_cli_prints_the_price_for_throughput_table(store, capsys):
    uri, prices = store
    assert report_cli.main(["--compare", "cmp", "--tracking-uri", uri, "--prices", str(prices)]) == 0
    out = capsys.readouterr().out
    assert f"{V100}: 7.1x the price of {T4} for 2.9x the throughput (0.41x the images per dollar)" \
        in out
    assert "example" not in out  # every price was the user's


def test_example_prices_are_labelled_with_their_date(store, capsys):
    uri, _ = store
    assert report_cli.main(["--compare", "cmp", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert f"example ({compare.EXAMPLE_PRICES_DATE})" in out
    assert "not yours: pass --prices" in out


@pytest.mark.parametrize("text,bad", [
    ("cost:\n  usd_per_hour:\n    T4: -1\n", "cost.usd_per_hour.T4=-1 is not allowed"),
    ("cost:\n  usd_per_hour:\n    T4: cheap\n", "cost.usd_per_hour.T4='cheap' is not allowed"),
    ("prices: {T4: 1}\n", "p.yaml' is not allowed: it must be a YAML file holding cost.usd_per_h"),
    ("cost: [\n", "p.yaml' is not allowed: it must be a readable YAML file ("),
    (None, "p.yaml' is not allowed: it must be a readable YAML file ("),  # no such file
])
def test_bad_price_table_is_one_line_and_exit_2_before_the_store_is_read(tmp_path, text, bad,
                                                                          capsys):
    p = tmp_path / "p.yaml"
    if text is not None:
        p.write_text(text)
    dead = "http://127.0.0.1:9"  # nothing listens: the prices are refused before it is asked
    assert report_cli.main(["--compare", "cmp", "--tracking-uri", dead, "--prices", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpubench.report: ") and bad in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flag,value,allowed", [
    ("--parent", "xyz", "an MLflow run id (32 hex digits)"),
    ("--study", "a b", "letters, digits, '.', '_' or '-'"),
])
def test_a_bad_parent_or_study_is_bad_input_exit_2(store, flag, value, allowed, capsys):
    """Refused as bad input before the store is asked: a live store, then one that is not."""
    uri, _ = store
    for where in (uri, "http://127.0.0.1:9", "sqlite:////nonexistent/mlflow.db"):
        assert report_cli.main(["cmp", "--tracking-uri", where, flag, value]) == 2, where
        err = capsys.readouterr().err
        assert err == f"gpubench.report: {flag}={value!r} is not allowed: it must be {allowed}\n"


def test_nothing_to_compare_is_one_line_and_nonzero(store, capsys):
    from mlflow.tracking import MlflowClient

    uri, prices = store
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("only_failures",
                                   artifact_location=(prices.parent / "artifacts2").as_uri())
    run = client.create_run(exp)  # an OOM: measured nothing feasible
    client.log_dict(run.info.run_id, rec(T4, 0.0, status=Status.oom, peak=None).to_dict(),
                    "results.json")
    capsys.readouterr()
    assert report_cli.main(["--compare", "only_failures", "--tracking-uri", uri]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing to compare" in err


def test_prices_carried_in_the_runs_config_count_as_the_users():
    a, b = rec(T4, 260.0), rec("NVIDIA L4", 400.0)
    for r in (a, b):
        r.config["cost"] = {"usd_per_hour": {"L4": 0.8}}
    rows = {d.device: d for d in
            compare.compare_rows([a, b], {})["model resnet50, dataset imagefolder, 224 px"]}
    assert (rows["NVIDIA L4"].usd_per_hour, rows["NVIDIA L4"].price_source) == (0.8, "yours")
    assert rows[T4].price_source.startswith("example")  # not in the runs' table
    assert compare.versus(list(rows.values()))[0]["baseline"] == T4  # the cheapest


def test_runs_of_other_model_arguments_are_other_workloads_whatever_their_names():
    """--compare grouped by model, dataset and image size alone: a team's class at depth 50 on a
    T4 and at depth 101 on an L4 (or another class count) were compared as one workload. Every
    workload key sets a group apart now but where a run happened (its device, its data's
    folder), and a group names the settings that tell it from another of the same words."""
    t4, l4 = rec(T4, 260.0), rec("NVIDIA L4", 400.0)
    deeper = rec("NVIDIA L4", 180.0)
    for r, depth, root in ((t4, 50, "/data/t4"), (l4, 50, "/mnt/l4"), (deeper, 101, "/mnt/l4")):
        r.config["model"]["kwargs"] = {"depth": depth}
        r.config["dataset"]["root"] = root
        r.config["bench"]["device"] = "cuda" if r is t4 else "auto"
    groups = compare.compare_rows([t4, l4, deeper], {})
    base = "model resnet50, dataset imagefolder, 224 px"
    assert {w: [d.device for d in rows] for w, rows in groups.items()} == {
        f"{base}; model.kwargs.depth=50": ["NVIDIA L4", T4],
        f"{base}; model.kwargs.depth=101": ["NVIDIA L4"]}


def test_only_training_measurements_stand_for_a_device(store):
    """A loader-only run's figure is its loader's and a max-batch probe (tagged `rung`) measured a
    few steps: neither is a device's training throughput."""
    from mlflow.tracking import MlflowClient

    uri, prices = store
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("mixed", artifact_location=(prices.parent / "art3").as_uri())
    loader_only = rec(T4, 0.0)
    loader_only.images_per_sec, loader_only.loader_images_per_sec = None, 8333.7
    loader_only.phases = {"loader": PhaseRecord("loader", 128, images_per_sec=8333.7)}
    loader_only.config["bench"]["phases"] = ["loader"]
    for r, tags in ((rec(T4, 260.0), {}), (loader_only, {}),
                    (rec(T4, 22276.3, batch=512), {"rung": "probe"})):
        run = client.create_run(exp, tags={"device_name": T4, **tags})
        client.log_dict(run.info.run_id, r.to_dict(), "results.json")
        client.set_terminated(run.info.run_id)
    [row] = compare.compare_rows(compare.mlflow_records("mixed", uri), {})[
        "model resnet50, dataset imagefolder, 224 px"]
    assert row.images_per_sec == 260.0 and row.runs == 1


def test_a_bad_price_in_one_run_is_refused_even_when_a_later_run_prices_the_same_device():
    def priced(price):
        return RunRecord(config={"cost": {"usd_per_hour": {"T4": price}}})

    assert compare._own_prices([priced(0.35), priced(0.5)]) == {"T4": 0.5}
    with pytest.raises(SystemExit, match=r"cost.usd_per_hour.T4=-1"):
        compare._own_prices([priced(-1), priced(0.35)])
