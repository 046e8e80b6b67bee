"""resolve(cfg) -> read-only Settings (sizes by device, Enums as values), check_resources(s) for
the disk and RAM rules: each rule fails with one line naming its key, in the step it belongs to."""

from __future__ import annotations

from enum import Enum

import pytest
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ReadonlyConfigError

from gpubench.config.errors import ConfigError
from gpubench.config.schema import KEYS
from gpubench.config.settings import (
    check_batch_fits,
    check_found_classes,
    check_preload_fits,
    check_resources,
    plain,
    resolve,
    sizes,
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
        assert not isinstance(v, Enum), where
        for k, x in v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ():
            walk(x, f"{where}.{k}")

    walk(plain(s), "settings")


def test_a_groups_choices_are_written_as_their_values():
    """The settings' groups hold the config as results.json has it, Enums by name: a choice's
    name must then be its value, as readers compare it (compile's are not, and s.compile is
    its value: test_enums_arrive_as_their_values)."""
    assert {k.name for k in KEYS if k.choices} >= {"dataset.name", "bench.phases", "compile"}
    for k in KEYS:
        if k.choices and k.name != "compile":
            assert all(m.name == m.value for m in k.choices), k.name


def test_mappings_are_read_only_all_the_way_down(compose_cfg):
    s = resolve(compose_cfg("+model.kwargs.width=4", "+model.kwargs.sizes=[1,2]",
                            "+model.kwargs.block.depth=3", "dataset=custom",
                            "dataset._target_=my_team.data.Faces", "+dataset.kwargs.n=3",
                            "+dataset.collate._target_=my_team.data.collate"))
    assert s.model.kwargs == {"width": 4, "sizes": (1, 2), "block": {"depth": 3}}
    assert s.dataset.kwargs == {"n": 3} and s.dataset.collate == {"_target_": "my_team.data.collate"}
    assert s.dataset.transform == {}
    for write in (lambda: s.config["loader"].__setitem__("batch_size", 1),
                  lambda: s.config.__setitem__("compile", "default"),
                  lambda: s.model.kwargs.__setitem__("width", 8),
                  lambda: s.model.kwargs["block"].__setitem__("depth", 1),
                  lambda: s.dataset.collate.__setitem__("_target_", "x.y"),
                  lambda: s.config["bench"]["phases"].append("e2e"),
                  lambda: s.model.kwargs.sizes.append(3),
                  lambda: setattr(s, "device", "cuda"),
                  lambda: setattr(s.loader, "batch_size", 1024),
                  lambda: setattr(s, "new_key", 1)):
        with pytest.raises(ReadonlyConfigError):
            write()
    # the readers' copies are plain and writable again, lists as lists
    kwargs = plain(s.model.kwargs)
    assert kwargs == {"width": 4, "sizes": [1, 2], "block": {"depth": 3}}
    assert type(kwargs) is dict and type(kwargs["block"]) is dict
    kwargs["width"] = 8
    assert s.model.kwargs["width"] == 4


def test_the_composed_config_is_left_as_given(compose_cfg):
    cfg = compose_cfg("dataset.image_size=null", "loader.batch_size=null")
    before = OmegaConf.to_yaml(cfg)
    resolve(cfg)
    assert cfg.dataset.image_size is None and cfg.loader.batch_size is None
    assert OmegaConf.to_yaml(cfg) == before


# The whole config of `compose_cfg("dataset.image_size=null", "loader.batch_size=null",
# "compile=reduce_overhead")` as results.json holds it, written out by hand: Enums by name
# (compile: reduce_overhead, device: cpu), the two device-sized keys filled in (32 px, 16).
GOLDEN = {
    "dataset": {"name": "synthetic", "image_size": 32, "num_classes": 10, "num_samples": 32,
                "root": None, "jpeg_quality": 90, "preload": False, "augment_on": "cpu",
                "decode_on": "cpu", "on_corrupt": "skip", "_target_": None, "kwargs": {},
                "transform": {}, "collate": {}},
    "model": {"name": "tiny", "num_classes": 10, "_target_": None, "kwargs": {},
              "checkpointing": False},
    # 0 workers: the worker-only keys as the DataLoader has them (knobs.WORKER_ONLY)
    "loader": {"batch_size": 16, "num_workers": 0, "pin_memory": True, "prefetch_factor": None,
               "persistent_workers": False, "drop_last": True, "multiprocessing_context": None,
               "worker_threads": 1, "worker_type": "process", "in_order": True},
    "precision": {"name": "torch_default"},
    "step": {"name": "classification", "_target_": None, "takes": "output"},
    # bench.repeats: the windows that ran (the schema's 6, at most bench.steps: window_plan)
    "bench": {"device": "cpu", "phases": ["loader", "compute", "e2e"], "warmup_steps": 1,
              "warmup_max_steps": 1, "steps": 2, "repeats": 2, "warmup_max_seconds": 60.0,
              "max_seconds": 60.0, "min_window_s": 0.0, "seed": 0, "monitor": True,
              "monitor_interval_s": 0.05,
              "flops": True, "optimizer": "sgd", "optimizer_impl": "auto", "lr": 0.01,
              "grad_accum_steps": 1, "cudnn_benchmark": None, "host_metrics_every": 0,
              "profile": False, "profile_steps": 3},
    "memory": {"ceiling": 0.8, "reserve": 0.05},
    "tracking": {"backend": "none", "uri": None, "experiment": "gpubench", "run_name": None,
                 "timeout_s": 10.0},
    "fault": {"oom_above_batch": None, "fail_message": None, "fail_after_windows": 0,
              "stall_every": None, "stall_s": 1.0, "rank": None},
    "channels_last": False,
    "compile": "reduce_overhead",
}


def test_config_is_what_results_json_held(compose_cfg):
    """The composed config as results.json and MLflow's params have always had it."""
    s = resolve(compose_cfg("dataset.image_size=null", "loader.batch_size=null",
                            "compile=reduce_overhead"))
    assert plain(s.config) == GOLDEN
    # key order too: results.json reads the same
    assert list(s.config) == list(GOLDEN)
    assert all(list(s.config[k]) == list(v) for k, v in GOLDEN.items() if isinstance(v, dict))


def test_every_schema_key_reaches_the_settings(compose_cfg):
    """The settings' groups are the composed config's: every declared key arrives with its
    composed value (Enums as values); precision.name, bench.device and bench.phases arrive
    resolved at the top (precision, device, phases) and are not in their groups."""
    # with a worker: with none, the worker-only keys are resolved (test_worker_only_keys...)
    # bench.min_window_s set: null resolves to a number (0 on a CPU), as image_size does
    # bench.steps >= bench.repeats: the repeats asked for are the windows that run
    cfg = compose_cfg("bench.optimizer=adamw", "tracking.backend=none", "dataset.on_corrupt=fail",
                      "loader.num_workers=1", "bench.min_window_s=0.5", "bench.device=cpu",
                      "bench.steps=6")
    s = resolve(cfg)
    moved = {"precision.name": "precision", "bench.device": "device", "bench.phases": "phases"}
    for k in KEYS:
        v = OmegaConf.select(cfg, k.name)
        v = OmegaConf.to_container(v) if isinstance(v, (DictConfig, ListConfig)) else v
        want = [p.value for p in v] if isinstance(v, list) and k.choices else (
            v.value if isinstance(v, Enum) else v)
        assert plain(OmegaConf.select(s, moved.get(k.name, k.name))) == want, k.name
    assert "device" not in s.bench and "phases" not in s.bench
    assert (s.bench.optimizer, s.tracking.backend, s.dataset.on_corrupt) == ("adamw", "none", "fail")
    assert type(s.bench.optimizer) is str and type(s.precision) is str  # values, not members


def test_resolve_never_looks_at_the_disk(compose_cfg, tmp_path):
    missing = tmp_path / "nope"
    s = resolve(compose_cfg("dataset=imagefolder", f"dataset.root={missing}"))
    with pytest.raises(ConfigError) as e:
        check_resources(s)
    assert e.value.key == "dataset.root" and str(e.value) == (
        f"dataset.root='{missing}' is not allowed: it must be an existing folder")
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
    ("tracking=mlflow tracking.uri=htp:/bad::uri", "tracking.uri"),
    ("dataset=imagefolder", "dataset.root"),
    ("dataset=device_synthetic dataset.augment_on=device", "dataset.augment_on"),
    ("dataset=custom", "dataset._target_"),
    ("dataset=custom dataset._target_=team.Data +dataset.transform._target_=team.tf "
     "dataset.preload=true", "dataset.transform._target_"),
    ("dataset=custom dataset._target_=team.Data +dataset.transform._target_=team.tf "
     "dataset.augment_on=device", "dataset.transform._target_"),
    ("loader.num_workers=0 loader.multiprocessing_context=threads", "loader.multiprocessing_context"),
    # keys only dataset=custom and step=custom read: on another choice they would be ignored
    ("+dataset.transform._target_=os.system", "dataset.transform._target_"),
    ("dataset=fake_jpeg +dataset.collate._target_=team.collate", "dataset.collate._target_"),
    ("dataset=synthetic dataset._target_=team.Data", "dataset._target_"),
    ("step._target_=team.loss", "step._target_"),
    pytest.param("precision=amp_fp16", "precision", marks=NO_CUDA),
    pytest.param("bench.device=cuda", "bench.device", marks=NO_CUDA),
    pytest.param("dataset=fake_jpeg dataset.decode_on=device", "dataset.decode_on", marks=NO_CUDA),
]

# refused on a CUDA machine too: resolved here with CUDA taken as present (the rules are the
# same code; only cuda_available answers otherwise)
BAD_ON_CUDA = [
    ("bench.device=cuda dataset=cifar10 dataset.root=/x dataset.decode_on=device",
     "dataset.decode_on"),
    ("bench.device=cuda dataset=fake_jpeg dataset.decode_on=device dataset.preload=true",
     "dataset.preload"),
    ("bench.device=cuda bench.warmup_steps=3", "bench.warmup_max_steps"),
]


@pytest.mark.parametrize("overrides,key", BAD_ON_CUDA, ids=lambda v: v[:60])
def test_bad_input_on_a_cuda_machine_fails_naming_the_key(compose_cfg, monkeypatch, overrides,
                                                          key):
    monkeypatch.setattr("gpubench.config.settings.cuda_available", lambda: True)
    test_bad_input_fails_in_resolve_naming_the_key(compose_cfg, overrides, key)


@pytest.mark.parametrize("overrides,key", BAD, ids=lambda v: v if " " not in v else v[:60])
def test_bad_input_fails_in_resolve_naming_the_key(compose_cfg, overrides, key):
    with pytest.raises(ConfigError) as e:
        resolve(compose_cfg(*overrides.split()))
    assert e.value.key == key, str(e.value)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{key}=") and "is not allowed: it must be " in line


# (overrides, key): resolve passes; this machine's limits fail in check_resources
TOO_BIG = [
    ("loader.num_workers=1024", "loader.num_workers"),
    ("loader.num_workers=1 loader.worker_threads=1024", "loader.worker_threads"),
    # 10 million 4096 px images: no machine holds that pool in RAM
    ("dataset.num_samples=10000000 dataset.image_size=4096", "dataset.num_samples"),
    # the same for fake_jpeg's pool of JPEGs (before: encoded until the machine gave out)
    ("dataset=fake_jpeg dataset.num_samples=10000000 dataset.image_size=1024",
     "dataset.num_samples"),
    # one image of the pool (74,897 px stored: 16 GiB) is more than half of any RAM here
    ("dataset.num_samples=1 dataset.image_size=65535", "dataset.image_size"),
    # device_synthetic's one batch is made on the host: 4 x 51 GiB of float32
    ("dataset=device_synthetic dataset.image_size=65535", "dataset.image_size"),
    # the batches in flight: 65536 images of 224 px are 147 GiB of float32 each
    ("loader.batch_size=65536 dataset.image_size=224 dataset.num_samples=1",
     "loader.batch_size"),
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
    with pytest.raises(ConfigError, match=r"dataset.preload=true .*GiB"):
        check_preload_fits(10**9, 4096)


def test_a_datasets_length_fits_the_order_shuffling_holds(monkeypatch):
    """A custom Dataset's __len__ of 10**15 (10**30 ended in OverflowError): the sampler's
    permutation of every index, in half of the free RAM (a stand-in for the machine's)."""
    from gpubench.config.settings import SAMPLED_BYTES, check_sampled

    monkeypatch.setattr("gpubench.config.settings.available_ram", lambda: 2 * SAMPLED_BYTES * 1000)
    check_sampled(1000, "dataset._target_", "team.Data")
    with pytest.raises(ConfigError) as e:
        check_sampled(1001, "dataset._target_", "team.Data")
    assert str(e.value) == ("dataset._target_='team.Data' is not allowed: it must be a Dataset of at most "
                            "1000 samples on this machine (its __len__ is 1001; shuffling holds "
                            "44 bytes a sample, in half of the free RAM)")


def test_a_sweepers_config_resolves_without_hydras_node(compose_cfg):
    """The sweeper resolves its composed config (max batch's first probe): Hydra's node there
    holds values only a job fills in (hydra.job.num); the run's config never includes it."""
    with_node = compose_cfg("sweep=max_batch", "loader.batch_size=null", hydra=True)
    s = resolve(with_node)
    assert "hydra" not in s.config and s.loader.batch_size == 16
    assert s.config == resolve(compose_cfg("sweep=max_batch", "loader.batch_size=null")).config


def test_a_runs_results_json_holds_the_composed_config(compose_cfg, tmp_path):
    """results.json's "config" is the composed config with the sizes filled in, written from
    the read-only settings as plain JSON."""
    import json

    from gpubench.run.runner import measure_run

    cfg = compose_cfg("dataset.image_size=null", "bench.phases=[compute]",
                      "+model.kwargs.width=4")
    measure_run(cfg, tmp_path)
    held = json.loads((tmp_path / "results.json").read_text())["config"]
    want = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    want["dataset"]["image_size"] = 32  # auto_sizes("cpu"); loader.batch_size=4 as given
    want["bench"]["min_window_s"] = 0.0  # null: no minimum on a CPU (settings.min_window_s)
    # loader.num_workers=0: the worker-only keys as the DataLoader had them
    want["loader"].update(prefetch_factor=None, persistent_workers=False)
    want["bench"]["repeats"] = 2  # the windows that ran: bench.steps=2 (settings._windows)
    assert held == want and held["model"]["kwargs"] == {"width": 4}


def test_sizes_follow_the_device_asked_for_without_its_rules(compose_cfg, monkeypatch):
    """Sizing only: bench.device=cuda on a machine without CUDA sizes for CUDA (a sweeper on a
    login node sizes jobs that run on GPU nodes); resolve alone says the device is missing."""
    cfg = compose_cfg("bench.device=cuda", "precision=amp_fp16", "dataset.image_size=null",
                      "loader.batch_size=null")
    monkeypatch.setattr("gpubench.config.settings.cuda_available", lambda: False)
    assert sizes(cfg) == ("cuda", 224, 128)
    with pytest.raises(ConfigError, match="bench.device"):
        resolve(cfg)
    auto = compose_cfg("bench.device=auto", "dataset.image_size=null", "loader.batch_size=null")
    assert sizes(auto) == ("cpu", 32, 16)
    monkeypatch.setattr("gpubench.config.settings.cuda_available", lambda: True)
    assert sizes(auto) == ("cuda", 224, 128)
    assert sizes(compose_cfg("bench.device=auto", "dataset.image_size=40")) == ("cuda", 40, 4)
    with pytest.raises(ConfigError) as e:
        sizes(compose_cfg("loader.batch_size=0"))
    assert e.value.key == "loader.batch_size"


def test_worker_only_keys_are_resolved_with_no_workers_and_said_so(compose_cfg):
    """With loader.num_workers=0 the DataLoader takes no worker-only option: they are recorded
    as it has them (a report then never recommends a prefetch_factor that did nothing), with a
    note where the config asked for another value than the default."""
    s = resolve(compose_cfg("loader.num_workers=0", "loader.prefetch_factor=4",
                            "loader.persistent_workers=true", "loader.worker_threads=2",
                            "loader.multiprocessing_context=spawn"))
    ld = s.loader
    assert (ld.prefetch_factor, ld.persistent_workers, ld.worker_threads,
            ld.multiprocessing_context) == (None, False, 1, None)
    assert s.config["loader"]["prefetch_factor"] is None  # what results.json records
    assert s.notes == (
        "loader.prefetch_factor=4 acts only with loader worker processes: recorded as null "
        "with loader.num_workers=0",
        "loader.multiprocessing_context=spawn acts only with loader worker processes: recorded "
        "as null with loader.num_workers=0",
        "loader.worker_threads=2 acts only with loader worker processes: recorded as 1 with "
        "loader.num_workers=0")
    assert resolve(compose_cfg("loader.num_workers=0")).notes == ()  # the defaults: no note
    s = resolve(compose_cfg("loader.num_workers=1", "loader.prefetch_factor=4"))
    assert (s.loader.prefetch_factor, s.loader.persistent_workers, s.notes) == (4, True, ())


@pytest.mark.parametrize("key", ["model.kwargs.width", "dataset.kwargs.root", "bench.lr"])
def test_a_value_left_to_set_is_refused_before_the_run(compose_cfg, key):
    """A team's YAML with `width: ???` under model.kwargs started the run, and the team's class
    got the text '???' (the run failed with a TypeError): a value the config leaves to set is
    one line naming it, before any work, wherever it sits."""
    cfg = compose_cfg("model=custom", "model._target_=torch.nn.Identity",
                      "dataset=custom", "dataset._target_=torch.utils.data.TensorDataset")
    OmegaConf.update(cfg, key, "???", force_add=True)
    with pytest.raises(ConfigError) as e:
        resolve(cfg)
    assert str(e.value).startswith(f"{key}='???' is not allowed: it must be a value")


def test_a_value_left_to_set_that_a_sweep_sets_is_no_error(compose_cfg):
    """`-m dataset.kwargs.root=/a,/b` on a team's `root: ???` was refused as not set: a
    multirun's config holds no swept value. Each job still gets its value checked."""
    from gpubench.config.prechecks import check_before_work

    cfg = compose_cfg("model=custom", "model._target_=torch.nn.Identity", hydra=True)
    OmegaConf.update(cfg, "model.kwargs", {"width": "???"}, force_add=True)
    with pytest.raises(ConfigError, match="^model.kwargs.width='...' is not allowed"):
        check_before_work(cfg)
    cfg.hydra.overrides.task.append("model.kwargs.width=8,16")
    check_before_work(cfg)
    # a plain value of hydra.sweeper.params: the sweeper gives it to every job
    cfg.hydra.overrides.task.pop()
    cfg.hydra.sweeper.params = {"model.kwargs.width": "8"}
    check_before_work(cfg)


def test_a_swept_value_left_to_set_resolves_what_interpolates_it(compose_cfg):
    """`path: ${.root}/train` beside a team's `root: ???` that the sweep sets was refused as an
    interpolation that does not resolve: it is resolved at one job's value. One that does not
    resolve at it is still refused."""
    from gpubench.config.prechecks import check_before_work

    cfg = compose_cfg("model=custom", "model._target_=torch.nn.Identity", hydra=True)
    OmegaConf.update(cfg, "model.kwargs", {"root": "???", "path": "${.root}/train",
                                           "bad": "${.nowhere}"}, force_add=True)
    cfg.hydra.overrides.task.append("model.kwargs.root=/a,/b")
    with pytest.raises(ConfigError, match=r"^model.kwargs.bad='\$\{.nowhere\}' is not allowed"):
        check_before_work(cfg)
    del cfg.model.kwargs.bad
    check_before_work(cfg)
    # hydra.sweeper.params setting it too: the command line's value is the jobs' (it wins)
    cfg.hydra.sweeper.params = {"model.kwargs.root": "${oc.env:GPUBENCH_NOT_SET}"}
    check_before_work(cfg)
    cfg.hydra.sweeper.params = {}
    cfg.hydra.overrides.task.pop()  # not swept: the `???` is named, not what interpolates it
    with pytest.raises(ConfigError, match=r"^model.kwargs.root='\?\?\?' is not allowed"):
        check_before_work(cfg)
