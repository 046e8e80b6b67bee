"""resolve(cfg) -> frozen Settings (sizes by device, Enums as values), check_resources(s) for the
disk and RAM rules: each rule fails with one line naming its key, in the step it belongs to."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from gpubench import config
from gpubench.config import ConfigError
from gpubench.settings import (
    GROUPS,
    Settings,
    check_batch_fits,
    check_found_classes,
    check_preload_fits,
    check_resources,
    resolve,
)

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def test_null_sizes_are_sized_by_device_given_ones_kept(compose_cfg):
    s = resolve(compose_cfg("dataset.image_size=null", "loader.batch_size=null"))
    assert (s.device, s.dataset.image_size, s.loader.batch_size) == ("cpu", 32, 16)
    s = resolve(compose_cfg("dataset.image_size=40", "loader.batch_size=6"))
    assert (s.dataset.image_size, s.loader.batch_size) == (40, 6)


def test_enums_arrive_as_their_values(compose_cfg):
    s = resolve(compose_cfg("compile=reduce_overhead", "precision=amp_bf16",
                            "dataset=fake_jpeg", "dataset.on_corrupt=fail",
                            "bench.phases=[e2e,loader]"))
    assert s.compile == "reduce-overhead"  # torch.compile's mode string, not the Enum's name
    assert (s.precision, s.dataset.name, s.dataset.on_corrupt) == ("amp_bf16", "fake_jpeg", "fail")
    assert s.phases == ("e2e", "loader")

    def walk(v, where):
        assert not isinstance(v, (Enum, DictConfig, ListConfig)), where
        if dataclasses.is_dataclass(v):
            for f in dataclasses.fields(v):
                walk(getattr(v, f.name), f"{where}.{f.name}")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}.{k}")
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")

    walk(s, "settings")


def test_mappings_are_plain_dicts(compose_cfg):
    s = resolve(compose_cfg("+model.kwargs.width=4", "dataset=custom",
                            "dataset._target_=my_team.data.Faces", "+dataset.kwargs.n=3",
                            "+dataset.collate._target_=my_team.data.collate"))
    assert s.model.kwargs == {"width": 4} and type(s.model.kwargs) is dict
    assert s.dataset.kwargs == {"n": 3} and s.dataset.collate == {"_target_": "my_team.data.collate"}
    assert s.dataset.transform == {}


def test_settings_are_frozen(compose_cfg):
    s = resolve(compose_cfg())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.device = "cuda"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.loader.batch_size = 1024


def test_the_composed_config_is_left_as_given(compose_cfg):
    cfg = compose_cfg("dataset.image_size=null", "loader.batch_size=null")
    before = OmegaConf.to_yaml(cfg)
    resolve(cfg)
    assert cfg.dataset.image_size is None and cfg.loader.batch_size is None
    assert OmegaConf.to_yaml(cfg) == before


def test_config_is_what_results_json_held(compose_cfg):
    """The composed config as results.json and MLflow's params have always had it: Enums by
    name (compile: reduce_overhead), and only the two device-sized keys filled in."""
    cfg = compose_cfg("dataset.image_size=null", "loader.batch_size=null", "compile=reduce_overhead")
    s = resolve(cfg)
    assert s.config["compile"] == "reduce_overhead" and s.config["bench"]["device"] == "cpu"
    assert s.config["dataset"]["image_size"] == 32 and s.config["loader"]["batch_size"] == 16
    composed = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    composed["dataset"]["image_size"], composed["loader"]["batch_size"] = 32, 16
    assert s.config == composed
    assert list(s.config) == list(composed)  # key order too: results.json reads the same


def test_every_schema_key_has_a_setting():
    """A key added to the schema must reach the settings (or it silently never arrives)."""
    schema = {f.name: f.type for f in dataclasses.fields(config.BenchConfig)}
    for group, cls in GROUPS.items():
        node = OmegaConf.structured(config.BenchConfig)[group]
        want = set(node.keys()) - ({"device", "phases"} if group == "bench" else set())
        assert {f.name for f in dataclasses.fields(cls)} == want, group
    roots = {f.name for f in dataclasses.fields(Settings)} - set(GROUPS)
    assert set(schema) - set(GROUPS) <= roots  # precision, channels_last, compile


def test_resolve_never_looks_at_the_disk(compose_cfg, tmp_path):
    missing = tmp_path / "nope"
    s = resolve(compose_cfg("dataset=imagefolder", f"dataset.root={missing}"))
    assert not missing.exists()
    with pytest.raises(ConfigError) as e:
        check_resources(s)
    assert e.value.key == "dataset.root" and str(e.value) == (
        f"dataset.root='{missing}' is not allowed: an existing folder")
    (tmp_path / "file").write_text("x")  # a file is not a folder
    with pytest.raises(ConfigError, match="dataset.root"):
        check_resources(resolve(compose_cfg("dataset=cifar10", f"dataset.root={tmp_path / 'file'}")))
    missing.mkdir()
    check_resources(s)


# (overrides, key): each fails in resolve with one line naming the key
BAD = [
    ("model.name=resnet51", "model.name"),
    ("model=custom", "model._target_"),
    ("dataset.num_classes=1000 model.num_classes=10", "model.num_classes"),
    ("model=mobilenet_v3_small model.checkpointing=true", "model.checkpointing"),
    ("+model._target_=team.Net model.checkpointing=true", "model.checkpointing"),
    ("loader.batch_size=0", "loader.batch_size"),
    ("memory.ceiling=1.5", "memory.ceiling"),
    ("bench.warmup_steps=3 bench.warmup_max_steps=2", "bench.warmup_max_steps"),
    ("bench.monitor_interval_s=30 bench.max_seconds=10", "bench.monitor_interval_s"),
    ("bench.phases=[]", "bench.phases"),
    ("bench.optimizer=lion", "bench.optimizer"),
    ("bench.optimizer_impl=apex", "bench.optimizer_impl"),
    ("tracking.backend=wandb", "tracking.backend"),
    ("tracking=mlflow tracking.uri=htp:/bad::uri", "tracking.uri"),
    ("dataset=imagefolder", "dataset.root"),
    ("dataset=device_synthetic dataset.augment_on=device", "dataset.augment_on"),
    ("dataset=custom", "dataset._target_"),
    ("dataset=custom dataset._target_=team.Data +dataset.transform._target_=team.tf "
     "dataset.preload=true", "dataset.transform._target_"),
    ("dataset=custom dataset._target_=team.Data +dataset.transform._target_=team.tf "
     "dataset.augment_on=device", "dataset.transform._target_"),
    ("loader.num_workers=0 loader.multiprocessing_context=threads", "loader.multiprocessing_context"),
    pytest.param("precision=amp_fp16", "precision", marks=NO_CUDA),
    pytest.param("bench.device=cuda", "bench.device", marks=NO_CUDA),
    pytest.param("dataset=fake_jpeg dataset.decode_on=device", "dataset.decode_on", marks=NO_CUDA),
    pytest.param("dataset=cifar10 dataset.root=/x dataset.decode_on=device", "dataset.decode_on",
                 marks=pytest.mark.gpu),
    pytest.param("dataset=fake_jpeg dataset.decode_on=device dataset.preload=true",
                 "dataset.preload", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=lambda v: v if " " not in v else v[:60])
def test_bad_input_fails_in_resolve_naming_the_key(compose_cfg, overrides, key):
    with pytest.raises(ConfigError) as e:
        resolve(compose_cfg(*overrides.split()))
    assert e.value.key == key, str(e.value)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{key}=") and "is not allowed: " in line


# (overrides, key): resolve passes; this machine's limits fail in check_resources
TOO_BIG = [
    ("loader.num_workers=1024", "loader.num_workers"),
    ("loader.worker_threads=1024", "loader.worker_threads"),
    # 10 million 4096 px images: no machine holds that pool in RAM
    ("dataset.num_samples=10000000 dataset.image_size=4096", "dataset.num_samples"),
]


@pytest.mark.parametrize("overrides,key", TOO_BIG)
def test_machine_limits_fail_in_check_resources(compose_cfg, overrides, key):
    s = resolve(compose_cfg(*overrides.split()))
    with pytest.raises(ConfigError) as e:
        check_resources(s)
    assert e.value.key == key and "on this machine" in str(e.value)


def test_rules_that_need_the_datasets_length(compose_cfg):
    s = resolve(compose_cfg("loader.batch_size=8", "dataset.num_classes=10"))
    check_batch_fits(s, 8)
    with pytest.raises(ConfigError, match=r"loader.batch_size=8 .*<= 7 \(the dataset size\)"):
        check_batch_fits(s, 7)
    check_batch_fits(resolve(compose_cfg("loader.batch_size=8", "loader.drop_last=false")), 7)
    check_found_classes(s, 10, "class folders in /d")
    with pytest.raises(ConfigError, match=r"dataset.num_classes=10 .*>= 11 \(class folders in /d\)"):
        check_found_classes(s, 11, "class folders in /d")
    check_preload_fits(10, 16)
    with pytest.raises(ConfigError, match=r"dataset.preload=True .*GiB"):
        check_preload_fits(10**9, 4096)


def test_a_sweepers_config_resolves_without_hydras_node(compose_cfg):
    """The sweeper resolves its composed config (max batch's first probe): Hydra's node there
    holds values only a job fills in (hydra.job.num); the run's config never includes it."""
    with_node = compose_cfg("sweep=max_batch", "loader.batch_size=null", hydra=True)
    s = resolve(with_node)
    assert "hydra" not in s.config and s.loader.batch_size == 16
    assert s.config == resolve(compose_cfg("sweep=max_batch", "loader.batch_size=null")).config
