"""The knob registry (gpubench.config.knobs): every reader takes a key's part in comparing runs
from its one declaration, so the table, the plots, the pooling of repeats, the setup split, the
sweeper's data pipe and the cost order cannot disagree about a key."""

from __future__ import annotations

import copy

import pytest
from optuna.distributions import CategoricalDistribution

from gpubench.analysis.recommend import Row, repeats, varying
from gpubench.analysis.select import faulted, setup_text, training_rows
from gpubench.config import knobs
from gpubench.config.keys import Pipe, Role
from gpubench.core.record import PLAN_KEYS, RunRecord, Status
from gpubench.report.plot_rules import held_fixed
from gpubench.search.pipes import cost
from gpubench.search.space import Param


def _set(cfg: dict, dotted: str, value) -> None:
    *head, leaf = dotted.split(".")
    for part in head:
        cfg = cfg.setdefault(part, {})
    cfg[leaf] = value


def _pair(key: str) -> tuple[Row, Row]:
    """Two runs of one setup that differ in `key` alone."""
    base = {"model": {"name": "tiny"}, "dataset": {"name": "synthetic", "image_size": 32},
            "loader": {"batch_size": 16, "num_workers": 2}, "precision": {"name": "fp32"},
            "bench": {"steps": 50}}
    rows = []
    for i, value in enumerate(("a-value", "another")):
        cfg = copy.deepcopy(base)
        _set(cfg, key, value)
        rec = RunRecord(status=Status.ok, images_per_sec=100.0 + i, peak_memory_fraction=0.3,
                        memory_ceiling=0.8, config=cfg, env={"device": "cuda"},
                        started_at=f"2026-11-24T10:0{i}:00")
        rows.append(Row(f"r{i}", rec))
    return rows[0], rows[1]


@pytest.mark.parametrize("key", sorted(knobs.KEYS))
def test_every_reader_takes_a_keys_role_from_its_declaration(key):
    """One key varied between two runs: the ranking's columns, the plots' lines, the pooling
    of repeats and the split into setups each follow the key's declared role."""
    a, b = _pair(key)
    role = knobs.KEYS[key].knob.role
    shown = role in (Role.workload, Role.knob)
    plan = set(PLAN_KEYS)  # how it was measured, where that makes it another measurement
    # a column of the ranking; a fault injected in one is a row apart, named by its column (a
    # fault key that injects nothing, fault.rank alone, is no fault: no column, pooled)
    injected = role is Role.fault and (faulted(a.record) or faulted(b.record))
    assert (key in varying([a, b])) == (shown or key in plan or injected)
    along = "loader.num_workers" if key == "loader.batch_size" else "loader.batch_size"
    assert (key in held_fixed([a, b], along)) == shown  # a line of a plot
    # how it was measured (seed, monitor, tracking): one measurement, pooled as repeats, but
    # for its window plan and caps (what a "measure longer" sets): measured another way;
    # fault injection is never pooled; anything else is another run
    assert repeats(a.record, b.record) == (
        role is Role.measure and key not in plan or role is Role.fault and not injected)
    # another workload is never ranked beside this one
    assert len(training_rows([a, b])[0]) == (1 if role is Role.workload else 2)


def test_a_swept_optimizer_is_a_column_and_a_line():
    """Issue 28, finding 1: bench.optimizer split the plots' lines but got no column."""
    a, b = _pair("bench.optimizer")
    assert varying([a, b]) == ["bench.optimizer"]
    assert held_fixed([a, b], "loader.batch_size") == ["bench.optimizer"]


COMPUTE_KNOBS = sorted(n for n, k in knobs.KEYS.items()
                       if k.knob.role is Role.knob and k.knob.pipe is Pipe.compute)


@pytest.mark.parametrize("key", COMPUTE_KNOBS)
def test_two_setups_differing_in_a_compute_knob_never_share_a_title_or_a_run_name(key):
    """Issue 28, finding 1: the titles (console, run.png, the workers answer's headings) and
    MLflow's run names wrote a fixed list of knobs, so an sgd and an adamw sweep read alike."""
    k = knobs.KEYS[key]
    values = ((False, True) if k.type is bool else [m.value for m in k.choices][:2]
              if k.choices else (2, 3) if k.kind else ("a-value", "another"))
    a, b = _pair(key)
    for row, value in zip((a, b), values, strict=True):
        _set(row.record.config, key, value)
    assert setup_text(a.record) != setup_text(b.record)
    assert setup_text(a.record, compact=True) != setup_text(b.record, compact=True)


def test_a_compute_knob_at_its_default_is_left_unsaid():
    a, _ = _pair("bench.optimizer")
    a.record.config["bench"].update(optimizer="sgd", grad_accum_steps=1)
    assert setup_text(a.record) == "tiny on synthetic 32px, batch 16, 2 workers, fp32"
    a.record.config["bench"]["grad_accum_steps"] = 4
    assert setup_text(a.record, compact=True) == "tiny-bs16-w2-fp32-bench.grad_accum_steps=4"


KNOBS = sorted(n for n, k in knobs.KEYS.items() if k.knob.role is Role.knob)


def _values(key: str) -> tuple:
    k = knobs.KEYS[key]
    return ((False, True) if k.type is bool else tuple(m.value for m in k.choices)[:2]
            if k.choices else (2, 3) if k.kind else ("a-value", "another"))


@pytest.mark.parametrize("key", KNOBS)
def test_two_runs_differing_in_any_knob_never_share_a_title_or_a_run_name(key):
    """The titles and MLflow's run names wrote the compute knobs alone: runs that differed only
    in preload, pin_memory or prefetch_factor got one name. A knob at its default is unsaid,
    one off it is named; a key inert with the run's workers is never named."""
    a, b = _pair(key)
    for row, value in zip((a, b), _values(key), strict=True):
        _set(row.record.config, key, value)
    assert setup_text(a.record) != setup_text(b.record)
    assert setup_text(a.record, compact=True) != setup_text(b.record, compact=True)


def test_a_knob_inert_without_workers_or_at_its_default_is_left_unsaid():
    a, _ = _pair("loader.prefetch_factor")
    # a 0-worker run records its worker-only knobs as their Knob.inert (off their defaults)
    a.record.config["loader"].update(num_workers=0, prefetch_factor=None,
                                     persistent_workers=False, pin_memory=True)
    assert setup_text(a.record) == "tiny on synthetic 32px, batch 16, 0 workers, fp32"
    a.record.config["dataset"]["preload"] = True
    assert setup_text(a.record, compact=True) == "tiny-bs16-w0-fp32-preload=true"
    # named keys (what sets a heading's runs apart) at any value, the worker count left out
    assert setup_text(a.record, named=("loader.pin_memory", "dataset.num_samples"),
                      workers=False) == ("tiny on synthetic 32px, batch 16, fp32, preload=true, "
                                         "pin_memory=true, dataset.num_samples=null")


def test_a_knob_is_shown_by_one_name_everywhere():
    """A knob without a short name read `checkpointing=false` in a plot's legend,
    `model.checkpointing` in the ranking and the run names: its short name, else its key."""
    from gpubench.report.write import _name, knob_header
    from gpubench.search.pipes import _setting

    assert knobs.knob_name("loader.batch_size") == "batch_size"
    assert knobs.knob_name("precision") == knobs.knob_name("precision.name") == "precision"
    assert knobs.knob_name("model._target_") == "model"
    for key in ("model.checkpointing", "bench.grad_accum_steps", "model.kwargs.width"):
        assert knobs.knob_name(key) == key  # a part of a dict-valued key: never its parent's
        assert _name(knob_header(key)) == key
    a, _ = _pair("model.checkpointing")
    a.record.config["model"]["checkpointing"] = True
    assert "model.checkpointing=true" in setup_text(a.record, compact=True)
    assert _setting({"model.checkpointing": True, "loader.batch_size": 4}) == \
        "model.checkpointing=true batch_size=4"
    # a plot's lines along the batch, one per checkpointing setting
    from gpubench.report.plot_rules import line_groups

    rows = []
    for batch in (16, 32):
        for r in _pair("model.checkpointing"):
            r.record.config["loader"]["batch_size"] = batch
            r.record.config["model"]["checkpointing"] = r.label == "r1"
            rows.append(Row(r.label, r.record))  # its flat values read anew
    labels = sorted(label for label, _ in line_groups(rows, "batch_size")[0])
    assert labels == ["model.checkpointing=false", "model.checkpointing=true"]


def test_the_lists_are_the_declarations():
    from gpubench.config.knobs import WORKER_ONLY
    from hydra_plugins.gpubench_sweeper.config import PipesConf

    assert PipesConf().data_keys == list(knobs.DATA_KEYS)
    assert "loader.num_workers" in knobs.DATA_KEYS and "loader.batch_size" not in knobs.DATA_KEYS
    assert set(WORKER_ONLY) >= {"loader.prefetch_factor", "loader.persistent_workers",
                                "loader.multiprocessing_context", "loader.worker_threads"}
    assert set(knobs.CUDA_ONLY) == {"loader.pin_memory", "bench.cudnn_benchmark"}
    # the compute phase's setup holds what the step depends on, not the loader's knobs
    assert {"model", "batch_size", "precision", "dataset.num_classes",
            "bench.grad_accum_steps"} <= set(knobs.COMPUTE)
    assert not {"num_workers", "pin_memory", "preload"} & set(knobs.COMPUTE)
    assert knobs.SHORT["model"] == ("model._target_", "model.name")  # a team's class first
    assert knobs.role("model.kwargs.width") is Role.workload  # under a declared dict key
    assert knobs.role("precision") is Role.knob  # a study's param is the group
    assert knobs.role("+my_team.flag") is Role.workload  # unknown: never recommended away


def test_the_cost_order_is_the_declared_one():
    """Fewer workers first, whatever else differs; then no preload; then CPU decode."""
    space = [Param(k, k, CategoricalDistribution(v)) for k, v in (
        ("loader.num_workers", [0, 1, 2]), ("dataset.preload", [False, True]),
        ("dataset.decode_on", ["cpu", "device"]))]
    settings = [{"loader.num_workers": w, "dataset.preload": p, "dataset.decode_on": d}
                for w in (2, 1, 0) for p in (True, False) for d in ("device", "cpu")]
    ordered = sorted(settings, key=lambda s: cost(s, space))
    assert ordered[0] == {"loader.num_workers": 0, "dataset.preload": False,
                          "dataset.decode_on": "cpu"}
    assert [s["loader.num_workers"] for s in ordered] == [0] * 4 + [1] * 4 + [2] * 4
    assert ordered[1]["dataset.preload"] is False and ordered[2]["dataset.preload"] is True


def test_a_keys_own_rule_is_on_its_declaration():
    """A rule beyond type, range and choices (`setting(rule=...)`) is applied wherever the key
    is checked: resolve, a swept value, a flag standing for the key."""
    import argparse

    from gpubench.config.errors import ConfigError
    from gpubench.config.flags import flag

    assert {k.name for k in knobs.KEYS.values() if k.rule} == {
        "bench.phases", "tracking.experiment", "tracking.run_name",
        "loader.multiprocessing_context"}
    for key, bad in (("bench.phases", ["e2e", "loader", "e2e"]), ("bench.phases", []),
                     ("loader.multiprocessing_context", "threads"),
                     ("tracking.experiment", " "), ("tracking.run_name", "a\tb"),
                     ("tracking.run_name", "x" * 251)):
        with pytest.raises(ConfigError) as e:
            knobs.KEYS[key].check(bad)
        assert e.value.key == key
    knobs.KEYS["tracking.run_name"].check(None)  # null allowed: the rule is not asked
    knobs.KEYS["bench.phases"].check(["compute", "e2e"])
    knobs.KEYS["loader.multiprocessing_context"].check("spawn")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--experiment=' ' is not allowed: "
                       r"it must be a name that is not blank, .* \(as tracking.experiment\)$"):
        flag("tracking.experiment", "--experiment")(" ")
    # the choices are checked before the rule: the bad element is named
    with pytest.raises(ConfigError, match=r"^bench.phases\[1\]='nope' is not allowed"):
        knobs.KEYS["bench.phases"].check(["e2e", "nope", "e2e"])


def test_a_worker_only_knob_varies_only_where_it_acts():
    """loader.num_workers=0,1 recorded prefetch_factor null (inert) and 2 (resolved): the ranking
    grew a `prefetch factor` column and the recommendation `loader.prefetch_factor=null`."""
    a, b = _pair("loader.num_workers")
    for row, workers, prefetch in ((a, 0, None), (b, 1, 2)):
        row.record.config["loader"].update(num_workers=workers, prefetch_factor=prefetch)
        row.flat = Row(row.label, row.record).flat
    assert varying([a, b]) == ["loader.num_workers"]
    b.record.config["loader"]["prefetch_factor"] = 4
    c = Row("c", copy.deepcopy(b.record))
    c.record.config["loader"]["prefetch_factor"] = 2
    c.flat, b.flat = Row("c", c.record).flat, Row(b.label, b.record).flat
    assert varying([a, b, c]) == ["loader.num_workers", "loader.prefetch_factor"]


def test_a_cuda_only_knob_does_not_act_on_a_cpu_run():
    """On a CPU, pin_memory=true and =false (or cudnn_benchmark) ran alike: four such runs were
    ranked apart on noise (1684.6 against 511.0) and the recommended overrides set them. A key
    that acts only with CUDA is no setting of a CPU run; the device as it ran (auto: env)."""
    from gpubench.analysis.recommend import acting, latest_per_setup

    rows = []
    for i, (pin, cudnn) in enumerate([(True, True), (False, True), (True, False)]):
        rec = RunRecord(status=Status.ok, images_per_sec=1000.0 + i,
                        images_per_sec_ci=[900.0, 1100.0], env={"device": "cpu"},
                        started_at=f"2026-11-24T10:0{i}:00", config={
                            "bench": {"device": "auto", "cudnn_benchmark": cudnn},
                            "loader": {"batch_size": 8, "num_workers": 2, "pin_memory": pin}})
        rows.append(Row(str(i), rec))
    assert not any(acting(r, k) for r in rows for k in knobs.CUDA_ONLY)
    (one,) = latest_per_setup(rows)
    assert len(one.confirms) == 2
    for r in rows:
        r.record.env["device"] = "cuda"
    assert all(acting(r, "loader.pin_memory") for r in rows) and len(latest_per_setup(rows)) == 3
    assert knobs.acts("loader.pin_memory", {"bench.device": "cpu"}.get) is False
    assert knobs.acts("loader.pin_memory", {}.get)  # the device not known: it may act
    # a plot's lines name no knob that did not act (the legend read `pin_memory=false`)
    from gpubench.report.plot_rules import held_fixed, line_groups

    for r in rows:
        r.record.env["device"] = "cpu"
    assert held_fixed(rows, "loader.batch_size") == []
    [(label, line)] = line_groups(rows, "batch_size")[0]
    assert "pin_memory" not in label and "cudnn" not in label
