"""Every config option composes; every bad input fails with one line naming the key, before work."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from gpubench.config import CONFIG_DIR, ConfigError, resolve_auto, validate
from gpubench.errors import one_line

GROUPS = {
    group: sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
    for group in ("dataset", "model", "loader", "precision", "tracking")
}


@pytest.mark.parametrize(
    "override", [f"{g}={o}" for g, opts in GROUPS.items() for o in opts], ids=str
)
def test_every_option_composes(compose_cfg, override):
    cfg = compose_cfg(override)
    group, option = override.split("=")
    if group in ("dataset", "model", "precision"):
        assert cfg[group].name == option or str(cfg[group].name.value) == option
    OmegaConf.to_container(cfg, resolve=True)  # interpolations resolve


@pytest.mark.parametrize("compile_mode", ["off", "default", "reduce_overhead", "max_autotune"])
def test_compile_modes_compose(compose_cfg, compile_mode):
    assert compose_cfg(f"compile={compile_mode}").compile.name == compile_mode


def test_defaults_and_auto_sizes(compose_cfg):
    cfg = compose_cfg(tiny=False)
    assert cfg.model.name == "resnet50" and cfg.precision.name.value == "torch_default"
    assert cfg.memory.ceiling == 0.8
    assert cfg.model.num_classes == cfg.dataset.num_classes  # interpolated
    assert cfg.dataset.image_size is None and cfg.loader.batch_size is None
    resolve_auto(cfg, "cpu")
    assert (cfg.dataset.image_size, cfg.loader.batch_size) == (32, 16)
    cfg = compose_cfg(tiny=False)
    resolve_auto(cfg, "cuda")
    assert (cfg.dataset.image_size, cfg.loader.batch_size) == (224, 128)


def test_valid_tiny_config_passes(compose_cfg):
    assert validate(compose_cfg()) == "cpu"


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.name=resnet51", "model.name"),
        ("model=custom", "model._target_"),
        ("loader.batch_size=0", "loader.batch_size"),
        ("loader.num_workers=-1", "loader.num_workers"),
        ("dataset=imagefolder", "dataset.root"),
        ("dataset=cifar10", "dataset.root"),
        ("memory.ceiling=1.5", "memory.ceiling"),
        ("bench.steps=0", "bench.steps"),
        ("loader.prefetch_factor=0", "loader.prefetch_factor"),
        ("bench.optimizer=lion", "bench.optimizer"),
    ],
)
def test_bad_values_name_the_key(compose_cfg, override, key):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(override))
    assert err.value.key == key
    assert "\n" not in str(err.value)
    assert key in str(err.value) and "allowed" in str(err.value)


def test_missing_folder(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="dataset.root.*existing folder"):
        validate(compose_cfg("dataset=imagefolder", f"dataset.root={tmp_path / 'nope'}"))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    "override,key",
    [("precision=amp_fp16", "precision"), ("bench.device=cuda", "bench.device"),
     ("dataset=fake_jpeg dataset.decode_on=device", "dataset.decode_on")],
)
def test_cuda_only_settings_on_cpu(compose_cfg, override, key):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*override.split()))
    assert err.value.key == key


def test_hydra_errors_condense_to_one_line():
    report = (
        "In 'bench': Could not find 'precision/fp64'\n\nAvailable options in 'precision':\n"
        "\tamp_bf16\n\tfp32\nConfig search path:\n\tprovider=hydra\n"
    )
    assert one_line(report) == "precision=fp64 is not allowed: one of amp_bf16, fp32"
    report = (
        "Error merging override compile=fast\nInvalid value 'fast', expected one of [off, default]\n"
        "    full_key: compile\n    object_type=BenchConfig\n"
    )
    assert one_line(report) == "compile=fast is not allowed: one of off, default"
