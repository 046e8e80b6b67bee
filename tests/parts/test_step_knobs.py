"""The train step's knobs compose, run on the tiny model on CPU and change what they should."""

from __future__ import annotations

import json

import pytest
import torch

from gpubench.config.errors import ConfigError
from gpubench.config.settings import resolve
from gpubench.parts.models import Checkpointed, build_model
from gpubench.parts.precision import resolve_precision
from gpubench.parts.step import TrainStep, make_optimizer
from gpubench.run.runner import measure_run


def _step(cfg, **kw):
    s = resolve(cfg)
    model = build_model(s)
    opt = make_optimizer(model, s.bench.optimizer, 0.01, s.bench.optimizer_impl)
    return model, TrainStep(model, resolve_precision("fp32", "cpu"), "cpu", opt, **kw)


def _batch(n=4, size=16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_grad_accum_steps_the_optimizer_every_k_micro_batches(compose_cfg):
    cfg = compose_cfg("bench.grad_accum_steps=3")
    model, step = _step(cfg, grad_accum_steps=3)
    w0 = model.fc.weight.detach().clone()
    x, y = _batch()
    step(x, y)
    step(x, y)
    assert torch.equal(model.fc.weight, w0)  # two micro-batches: gradients only
    assert model.fc.weight.grad is not None
    step(x, y)
    assert not torch.equal(model.fc.weight, w0)  # the third steps the optimizer
    assert model.fc.weight.grad is None  # and clears the gradients
    for _ in range(9):
        step(x, y)
    assert (step.micro_batches, step.optimizer_steps) == (12, 4)


def test_accumulated_gradient_is_the_mean_of_the_micro_batches(compose_cfg):
    """Two micro-batches of 4 accumulate the same gradient as one batch of 8."""
    cfg = compose_cfg()
    x, y = _batch(8)
    torch.manual_seed(0)
    one, s1 = _step(cfg)
    torch.manual_seed(0)
    two, s2 = _step(cfg, grad_accum_steps=2)
    one.eval(), two.eval()  # batch norm in eval: the batch split must not change statistics
    s1.opt.step = s2.opt.step = lambda: None  # keep the gradients to compare them
    s1.opt.zero_grad = s2.opt.zero_grad = lambda set_to_none=True: None
    s1(x, y)
    s2(x[:4], y[:4])
    s2(x[4:], y[4:])
    assert torch.allclose(one.fc.weight.grad, two.fc.weight.grad, atol=1e-6)


def test_run_reports_optimizer_steps_per_sec(compose_cfg, tmp_path):
    rec = measure_run(compose_cfg("bench.grad_accum_steps=2", "bench.phases=[e2e]"),
                      tmp_path).record
    fig = rec.extra["step"]
    assert fig["grad_accum_steps"] == 2
    assert fig["optimizer_steps"] == fig["micro_batches"] // 2
    micro = rec.images_per_sec / 4
    assert fig["micro_batches_per_sec"] == pytest.approx(micro)
    assert fig["optimizer_steps_per_sec"] == pytest.approx(micro / 2)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["step"]["optimizer_steps_per_sec"] == pytest.approx(micro / 2)


def test_host_metrics_read_every_k_micro_batches(compose_cfg, tmp_path):
    off = measure_run(compose_cfg("bench.phases=[compute]"), tmp_path / "off").record
    assert off.extra["step"]["host_metrics_reads"] == 0
    assert off.extra["step"]["host_metrics_last"] is None
    on = measure_run(compose_cfg("bench.phases=[compute]", "bench.host_metrics_every=2"),
                     tmp_path / "on").record
    fig = on.extra["step"]
    assert fig["host_metrics_reads"] == fig["micro_batches"] // 2 > 0
    assert set(fig["host_metrics_last"]) == {"loss", "accuracy"}
    assert 0.0 <= fig["host_metrics_last"]["accuracy"] <= 1.0
    assert fig["host_metrics_last"]["loss"] > 0


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("impl", ["auto", "for_loop", "fused"])
def test_optimizer_and_implementation(compose_cfg, tmp_path, optimizer, impl):
    cfg = compose_cfg(f"bench.optimizer={optimizer}", f"bench.optimizer_impl={impl}")
    model, step = _step(cfg)
    opt = step.opt
    assert type(opt).__name__ == {"sgd": "SGD", "adamw": "AdamW"}[optimizer]
    group = opt.param_groups[0]
    if impl == "fused":
        assert group["fused"] is True
    if impl == "for_loop":
        assert group["foreach"] is False
    w0 = model.fc.weight.detach().clone()
    step(*_batch())
    assert not torch.equal(model.fc.weight, w0)
    if optimizer == "sgd":
        assert group["momentum"] == 0.9


def test_foreach_on_cpu_is_one_line_naming_the_key(compose_cfg):
    with pytest.raises(ConfigError) as e:
        resolve(compose_cfg("bench.optimizer_impl=foreach"))
    assert e.value.key == "bench.optimizer_impl" and "foreach" in str(e.value)
    assert "\n" not in str(e.value)
    # what it offers instead is what this torch runs here (fused has CPU kernels since 2.4,
    # as test_optimizer_and_implementation runs; the line said "auto or for_loop")
    assert "it must be auto, for_loop or fused on cpu" in str(e.value)


@pytest.mark.parametrize("override, key", [
    # an unknown bench.optimizer_impl is refused at compose (an Enum): tests/test_config.py
    ("bench.grad_accum_steps=0", "bench.grad_accum_steps"),
    ("bench.grad_accum_steps=2000", "bench.grad_accum_steps"),
    ("bench.host_metrics_every=-1", "bench.host_metrics_every"),
])
def test_bad_step_knobs(compose_cfg, override, key):
    with pytest.raises(ConfigError) as e:
        resolve(compose_cfg(override))
    assert e.value.key == key


def test_checkpointing_only_where_wired(compose_cfg):
    with pytest.raises(ConfigError) as e:
        resolve(compose_cfg("model=mobilenet_v3_small", "model.checkpointing=true"))
    assert e.value.key == "model.checkpointing" and "mobilenet_v3_small" in str(e.value)
    resolve(compose_cfg("model=resnet18", "model.checkpointing=true"))
    resolve(compose_cfg("model=vit_b_16", "model.checkpointing=true"))


@pytest.mark.parametrize("name, stages", [("resnet18", 4), ("vit_b_16", 12), ("tiny", 1)])
def test_checkpointing_wraps_the_stages(compose_cfg, name, stages):
    cfg = compose_cfg(f"model={name}", "model.checkpointing=true", "dataset.image_size=32",
                      "model.num_classes=10")
    model = build_model(resolve(cfg))
    assert sum(isinstance(m, Checkpointed) for m in model.modules()) == stages


def test_checkpointing_gives_the_same_gradients(compose_cfg):
    cfg = compose_cfg("model.num_classes=10")
    x, y = _batch(8)
    torch.manual_seed(0)
    plain = build_model(resolve(cfg)).eval()
    torch.manual_seed(0)
    cfg.model.checkpointing = True
    ckpt = build_model(resolve(cfg)).eval()
    for m in (plain, ckpt):
        torch.nn.functional.cross_entropy(m(x), y).backward()
    assert torch.allclose(plain.fc.weight.grad, ckpt.fc.weight.grad, atol=1e-6)


def test_checkpointing_leaves_the_model_flops_as_they_are(compose_cfg):
    """MFU divides the model's FLOPs: the count with model.checkpointing is the count without
    it, although the device runs each checkpointed stage's forward twice (the recomputation in
    backward, which a count taken as the step runs does include)."""
    from torch.utils.flop_counter import FlopCounterMode

    from gpubench.parts.step import count_step_flops_split

    x, y = _batch(4)
    plan = resolve_precision("fp32", "cpu")
    counts = {}
    for ckpt in (False, True):
        cfg = compose_cfg("model.num_classes=10")
        cfg.model.checkpointing = ckpt
        counts[ckpt] = count_step_flops_split(build_model(resolve(cfg)).train(), plan, "cpu", x, y)
    assert counts[True] == counts[False] and counts[True]["conv"] > 0
    # the hardware's count of the same checkpointed step: the features' forward once more
    ckpt_model = build_model(resolve(cfg)).train()
    with FlopCounterMode(display=False) as hw:
        torch.nn.functional.cross_entropy(ckpt_model(x), y).backward()
    assert hw.get_total_flops() > counts[True]["total"]


def test_tiny_run_with_every_knob(compose_cfg, tmp_path):
    rec = measure_run(compose_cfg(
        "model.checkpointing=true", "bench.grad_accum_steps=2", "bench.optimizer=adamw",
        "bench.optimizer_impl=fused", "bench.cudnn_benchmark=true", "bench.host_metrics_every=1",
    ), tmp_path).record
    assert rec.status.value == "ok"
    assert rec.extra["step"]["optimizer_steps"] > 0


# What checkpointing changes is what the forward keeps for backward: every tensor autograd
# saves passes through saved_tensors_hooks, so their storages, counted once each, are the
# activations (and weights) held until backward, to the byte and the same on every run. (Peak
# resident memory, measured in a fresh process each, showed the same effect with a margin that
# moved by 100 MB from run to run on this machine: 120-245 MB less.) A small ViT of 12 equal
# blocks: without checkpointing every block's activations (attention maps included) are held;
# with it, the blocks' inputs, and one block is recomputed at a time in backward.
def _saved_for_backward(checkpointing: bool) -> int:
    import torch
    from torchvision.models import VisionTransformer

    from gpubench.parts.models import apply_checkpointing

    torch.manual_seed(0)
    m = VisionTransformer(image_size=32, patch_size=4, num_layers=12, num_heads=4,
                          hidden_dim=128, mlp_dim=512, num_classes=10)
    if checkpointing:
        apply_checkpointing(m, "vit_small")
    held: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        held[s.data_ptr()] = s.nbytes()  # alive until backward: no address is reused
        return t

    x = torch.randn(4, 3, 32, 32)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(m(x), torch.zeros(4, dtype=torch.long))
    loss.backward()  # the checkpointed blocks recompute here: backward must still run
    assert all(p.grad is not None for p in m.parameters())
    return sum(held.values())


def test_checkpointing_keeps_far_less_for_backward():
    plain, ckpt = _saved_for_backward(False), _saved_for_backward(True)
    # measured: 34 MiB against 1.9 MiB; demand a clear factor, not just any difference
    assert ckpt < plain / 4, (plain, ckpt)


def test_cudnn_benchmark_follows_the_key_alone(compose_cfg, tmp_path):
    import torch

    from gpubench.parts.precision import user_flags

    before = torch.backends.cudnn.benchmark
    # the process's own flag as a null key restores it (earlier runs in this process may
    # have left the live flag otherwise)
    users = user_flags()["cudnn_benchmark"]
    try:
        on = measure_run(compose_cfg("bench.cudnn_benchmark=true", "bench.phases=[compute]"),
                         tmp_path / "on").record
        assert on.extra["step"]["cudnn_benchmark"] is True
        off = measure_run(compose_cfg("bench.cudnn_benchmark=false", "precision=fp32",
                                      "bench.phases=[compute]"), tmp_path / "off").record
        assert off.extra["step"]["cudnn_benchmark"] is False
        plan = measure_run(compose_cfg("precision=fp32", "bench.phases=[compute]"),
                           tmp_path / "plan").record
        # null: the process's own flag, fp32 or not (a precision sweep changes the maths only)
        assert plan.extra["step"]["cudnn_benchmark"] is users
        # a later torch_default run in the same process (a sweep's next trial) gets the
        # process's own flag back, not the last run's
        user = measure_run(compose_cfg("bench.phases=[compute]"), tmp_path / "user").record
        assert user.extra["step"]["cudnn_benchmark"] is users
    finally:
        torch.backends.cudnn.benchmark = before


@pytest.mark.slow
@pytest.mark.parametrize("override, key", [
    ("bench.optimizer_impl=foreach", "bench.optimizer_impl"),
    ("bench.optimizer_impl=turbo", "bench.optimizer_impl"),
    ("bench.grad_accum_steps=0", "bench.grad_accum_steps"),
    ("bench.grad_accum_steps=two", "bench.grad_accum_steps"),
    ("bench.host_metrics_every=-5", "bench.host_metrics_every"),
    ("model.checkpointing=maybe", "model.checkpointing"),
])
def test_cli_bad_step_knob_is_one_line(tmp_path, override, key):
    from conftest import TINY, run_cli

    proc = run_cli(*TINY, override, cwd=tmp_path)
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and key in err[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("outputs/runs/*/*/results.json"))
    assert not list(tmp_path.glob("outputs/runs/*/*/gpu_metrics.csv"))


@pytest.mark.slow
def test_cli_checkpointing_on_an_unwired_model_is_one_line(tmp_path):
    from conftest import TINY, run_cli

    proc = run_cli(*TINY, "model=mobilenet_v3_small", "model.checkpointing=true", cwd=tmp_path)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and len(err) == 1 and "model.checkpointing" in err[0], proc.stderr


def test_step_sweep_preset_composes():
    from conftest import compose_config

    cfg = compose_config("sweep=step", hydra=True)
    params = cfg.hydra.sweeper.params
    assert set(params) == {"bench.optimizer_impl", "bench.cudnn_benchmark",
                           "bench.host_metrics_every", "model.checkpointing"}
    thr = compose_config("sweep=throughput", hydra=True).hydra.sweeper.params
    assert thr["bench.cudnn_benchmark"] == "choice(false,true)"


# ------------------------------------------------------------------ step=custom: the team's loss


def smooth_loss(output, targets):
    """A team's loss of (output, targets): cross-entropy with label smoothing."""
    return torch.nn.functional.cross_entropy(output, targets, label_smoothing=0.1)


def per_sample_loss(output, targets):
    """A loss that forgot its reduction: one value per sample, no scalar."""
    return torch.nn.functional.cross_entropy(output, targets, reduction="none")


def model_batch_loss(model, batch):
    """step.takes=batch: the model and the whole batch."""
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


HERE = "test_step_knobs"


def test_the_teams_loss_trains_on_tuple_batches(compose_cfg, tmp_path):
    rec = measure_run(compose_cfg("step=custom", f"step._target_={HERE}.smooth_loss",
                                  "bench.host_metrics_every=1"), tmp_path).record
    assert rec.status.value == "ok" and set(rec.phases) == {"loader", "compute", "e2e"}
    assert rec.flops_per_step and rec.flops_per_step > 0  # counted through the team's loss
    assert set(rec.extra["step"]["host_metrics_last"]) == {"loss"}  # no accuracy: not logits


def test_a_loss_of_the_model_and_the_batch(compose_cfg):
    from gpubench.parts.step import make_loss

    s = resolve(compose_cfg("step=custom", f"step._target_={HERE}.model_batch_loss",
                            "step.takes=batch"))
    model = build_model(s)
    opt = make_optimizer(model, "sgd", 0.01)
    step = TrainStep(model, resolve_precision("fp32", "cpu"), "cpu", opt, loss=make_loss(s.step))
    w0 = model.fc.weight.detach().clone()
    step(_batch())  # one argument: the batch as the loader made it
    assert not torch.equal(model.fc.weight, w0) and step.last_loss.ndim == 0


@pytest.mark.parametrize("overrides, line", [
    ((f"step._target_={HERE}.per_sample_loss",),
     f"step._target_='{HERE}.per_sample_loss' is not allowed: it must be a loss function of your own code "
     "as a dotted path (e.g. my_team.train.loss) or an nn.Module loss class, returning a scalar "
     "tensor (it returned a torch.float32 tensor of shape (4,))"),
    ((), "step._target_=null is not allowed: it must be a loss function of your own code"),
    (("step._target_=torch.nn.functional.cross_entropy",),
     "step._target_='torch.nn.functional.cross_entropy' is not allowed: it must be a loss function of your "
     "own code"),
    ((f"step._target_={HERE}.smooth_loss", "dataset=device_synthetic", "step.takes=output",
      "+step.nothing=1"), "step.nothing=1 is not allowed"),
])
def test_a_bad_custom_step_is_one_line_naming_its_key(compose_cfg, tmp_path, overrides, line):
    with pytest.raises(ConfigError) as e:
        measure_run(compose_cfg("step=custom", *overrides), tmp_path)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_library_loss_class_is_built_and_used(compose_cfg, tmp_path):
    r = measure_run(compose_cfg("step=custom", "step._target_=torch.nn.CrossEntropyLoss",
                                "bench.phases=[compute]"), tmp_path)
    assert r.status == "ok"


@pytest.fixture
def team_conf(monkeypatch):
    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "team_conf"))
    return ROOT / "examples" / "team_conf"


@pytest.mark.parametrize("workers", ["loader.num_workers=0",
                                     "loader.worker_type=thread loader.num_workers=1"])
def test_the_segmentation_example_trains_on_dict_batches(team_conf, tmp_path, workers):
    """examples/team_conf: dict samples, dict batches moved to the device whole, the team's
    loss(model, batch); every phase measured and a verdict."""
    from conftest import compose_config

    cfg = compose_config(f"hydra.searchpath=[file://{team_conf}]", "experiment=team_segmentation",
                         "bench.steps=6", "bench.warmup_max_steps=2", "bench.device=cpu", "tracking=none", *workers.split(),
                         tiny=False)
    r = measure_run(cfg, tmp_path)
    assert r.status == "ok", r.data.get("error")
    assert set(r.data["phases"]) == {"loader", "compute", "e2e"} and r.data["bottleneck"]
    assert r.data["data_info"]["transform"] == "none: step=custom"


def test_the_teams_own_samples_refuse_gpubenchs_image_keys(team_conf, compose_cfg):
    from gpubench.parts.data import build_pipeline

    cfg = compose_cfg(f"hydra.searchpath=[file://{team_conf}]", "dataset=shapes",
                      "step=segmentation", "dataset.preload=true")
    with pytest.raises(ConfigError) as e:
        build_pipeline(resolve(cfg))
    assert str(e.value) == ("dataset.preload=true is not allowed: it must be its default with step=custom "
                            "on dataset=custom: your Dataset's samples go to your collate and "
                            "loss as they are")


def test_any_torchvision_classifier_by_name(compose_cfg):
    from gpubench.parts.models import check_output

    s = resolve(compose_cfg("model.name=resnet34"))
    model = build_model(s).train()
    check_output(model, _batch(2), s)  # a torchvision classifier's logits, 10 wide
    with pytest.raises(ConfigError) as e:
        resolve(compose_cfg("model.name=resnet35"))
    assert "close: resnet101, resnet152, resnet18, resnet34, resnet50" in str(e.value)
