"""The typed schema of a run, every key declared once (keys.setting). Hydra composes bench.yaml
over `BenchConfig` (ConfigStore `gpubench_schema`): a wrong type or Enum name fails at compose
time; rules across keys: config.settings."""

from __future__ import annotations

import difflib
import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from gpubench.config.errors import ConfigError
from gpubench.config.keys import Key, Knob, Pipe, Role, check_keys, keys, name_rule, setting


def _choice(name: str, values: str) -> Any:
    """A key's choices named as a command line takes them (`-` as `_`); a str Enum, so readers
    of the composed config compare with plain strings (`Backend.none == "none"`)."""
    return Enum(name, [(v.replace("-", "_"), v) for v in values.split()], module=__name__, type=str)


DatasetKind = _choice("DatasetKind",
                      "synthetic device_synthetic fake_jpeg imagefolder cifar10 custom")
# read or decoded per sample, what dataset.preload does once; the others are made in RAM, where
# preload saves nothing (every advice of it asks this)
PRELOAD_HELPS = frozenset({DatasetKind.fake_jpeg, DatasetKind.imagefolder, DatasetKind.cifar10})
Where = _choice("Where", "cpu device")
OnCorrupt = _choice("OnCorrupt", "skip fail")
PrecisionName = _choice("PrecisionName", "torch_default fp32 tf32 amp_fp16 amp_bf16")
# the names are what a command line takes, the values torch.compile's mode strings
CompileMode = _choice("CompileMode", "off default reduce-overhead max-autotune")
DeviceKind = _choice("DeviceKind", "auto cuda cpu")
Phase = _choice("Phase", "loader compute e2e")
Optimizer = _choice("Optimizer", "sgd adamw")
OptimizerImpl = _choice("OptimizerImpl", "auto for_loop foreach fused")
Backend = _choice("Backend", "mlflow none")
WorkerType = _choice("WorkerType", "process thread")
StepKind = _choice("StepKind", "classification custom")
StepTakes = _choice("StepTakes", "output batch")


def is_amp(precision: str) -> bool:
    return precision in ("amp_fp16", "amp_bf16")


# shorthands of the knobs' declarations (gpubench.config.keys.Knob)
WORK, WORK_DATA = (partial(Knob, Role.workload, p) for p in (Pipe.compute, Pipe.data))
KNOB, DATA_KNOB = (partial(Knob, Role.knob, p) for p in (Pipe.compute, Pipe.data))


def check_phases(key: Key, phases: Any) -> None:
    """bench.phases: not empty, each once (a repeated phase's windows were pooled as one's)."""
    names = [p.value if isinstance(p, Enum) else p for p in phases]
    if not names or len(set(names)) != len(names):
        raise ConfigError(key.name, names, f"a non-empty list of {', '.join(Phase.__members__)}, "
                          "each at most once")


def check_start_method(key: Key, ctx: Any) -> None:
    """A start method of this platform (with 0 workers too: a misspelling is wrong)."""
    methods = multiprocessing.get_all_start_methods()  # torch.multiprocessing's own function
    if ctx not in methods:
        raise ConfigError(key.name, ctx, f"null or one of {methods}")


@dataclass
class DatasetConfig:
    name: DatasetKind = setting(
        DatasetKind.synthetic, "synthetic: random uint8 images made once on the host, through "
        "the real train transforms; device_synthetic: one fixed batch already on the device (the "
        "compute bound); fake_jpeg: in-memory JPEGs decoded with PIL per sample; imagefolder: a "
        "folder of class sub-folders; cifar10: CIFAR-10's python files from a local root; custom: "
        "your own Dataset class ([data.md](data.md))", knob=WORK_DATA(short="dataset"))
    image_size: int | None = setting(
        None, "side of the training crop; null: 224 on a GPU, 32 on a CPU. The upper bound is "
        "JPEG's largest side; the RAM checks bound the in-memory pools", bounds=(8, 65_535),
        knob=WORK(short="image_size"))
    num_classes: int = setting(1000, "labels in the dataset (model.num_classes follows it)",
                               bounds=(1, 1_000_000), knob=WORK())
    num_samples: int = setting(
        512, "images in the in-memory pools (synthetic, fake_jpeg), cycled; the pool (synthetic: "
        "samples x 3 x (8/7 x size)² bytes; fake_jpeg: their JPEGs) must fit in half of the free "
        "RAM", bounds=(1, 10_000_000))
    root: str | None = setting(None, "the folder imagefolder and cifar10 read (never downloaded)",
                               allowed="null or an existing folder", knob=Knob(place=True))
    jpeg_quality: int = setting(90, "fake_jpeg's encoding quality", bounds=(1, 100))
    preload: bool = setting(
        False, "decode the whole dataset once into a shared uint8 tensor in RAM, then only augment "
        "per step (must fit in 80% of free RAM)", knob=DATA_KNOB(short="preload", cheap=(2, bool)))
    # CPU work before device work: the device's time is the scarce one
    augment_on: Where = setting(
        Where.cpu, "device: ship uint8 batches, crop/flip/normalize on the device",
        knob=DATA_KNOB(short="augment_on", cheap=(4, lambda v: v != "cpu")))
    decode_on: Where = setting(
        Where.cpu, "device: decode JPEGs on the GPU (nvJPEG); CUDA, imagefolder and fake_jpeg only",
        knob=DATA_KNOB(short="decode_on", cheap=(3, lambda v: v != "cpu")))
    on_corrupt: OnCorrupt = setting(
        OnCorrupt.skip, "skip (and count) or fail on an image that does not decode")
    _target_: str | None = setting(None, "dataset=custom: your Dataset class as a dotted path "
                                   "(my_team.data.MyDataset)", knob=WORK_DATA(short="dataset"))
    kwargs: dict[str, Any] = setting(factory=dict,
                                     help="dataset=custom: its constructor's arguments")
    transform: dict[str, Any] = setting(
        factory=dict, help="dataset=custom: your transform instead of gpubench's, as a Hydra "
        "instantiate node ({_target_: ..., its arguments})")
    collate: dict[str, Any] = setting(
        factory=dict, help="dataset=custom: your collate function, as a Hydra instantiate node")


@dataclass
class ModelConfig:
    name: str = setting(
        "resnet50", "a torchvision classification model (torchvision.models.list_models()) or tiny",
        allowed="a torchvision classifier's name or tiny", knob=WORK(short="model"))
    num_classes: int = setting(
        "${dataset.num_classes}", "classifier outputs: at least dataset.num_classes (one per "
        "label)", bounds=(1, 1_000_000), knob=WORK())
    _target_: str | None = setting(
        None, "your own nn.Module class (model=custom model._target_=my_team.nets.Net); it gets "
        "num_classes if it takes one", knob=WORK(short="model"))
    kwargs: dict[str, Any] = setting(
        factory=dict, help="model._target_'s other constructor arguments", knob=WORK())
    checkpointing: bool = setting(
        False, "activation checkpointing over the model's stages (a ResNet's layers, each ViT "
        "block, tiny's features): less memory, about one more forward; torchvision "
        "ResNets/Wide ResNets/ResNeXts, ViTs and tiny only", knob=KNOB())


@dataclass
class LoaderConfig:
    batch_size: int | None = setting(
        None, "null: 128 on a GPU, 16 on a CPU; at most the dataset's size with drop_last "
        "(checked when the data is built)", bounds=(1, 65_536), knob=KNOB(short="batch_size"))
    num_workers: int = setting(
        2, "DataLoader worker processes; at most 4 per usable core and 256 MiB of free RAM each "
        "(a forked worker measured ~410 MiB RSS, mostly shared)", bounds=(0, 1024),
        knob=DATA_KNOB(short="num_workers", cheap=(1, int)))
    pin_memory: bool = setting(True, "pinned host memory and non_blocking copies (GPU only)",
                               knob=DATA_KNOB(short="pin_memory", cheap=(7, bool), cuda_only=True))
    prefetch_factor: int | None = setting(
        2, "batches each worker prepares ahead; null with 0 workers", bounds=(1, 64),
        knob=DATA_KNOB(short="prefetch_factor", inert=None,
                       cheap=(5, lambda v: -1 if v is None else v)))
    persistent_workers: bool = setting(
        True, "keep the workers between epochs and phases; false with 0 workers",
        knob=DATA_KNOB(short="persistent_workers", cheap=(6, bool), inert=False, process_only=True))
    drop_last: bool = setting(True, "every measured step is a full batch")
    multiprocessing_context: str | None = setting(
        None, "the workers' start method; null: the platform's default (fork on Linux: workers "
        "share preloaded tensors for free); null with 0 workers",
        allowed="null or a start method of this platform (fork, spawn, forkserver)",
        rule=check_start_method, knob=DATA_KNOB(inert=None, process_only=True))
    worker_threads: int = setting(1, "torch threads per worker (1 stops N workers each spawning "
                                  "one per core); at most the usable cores; 1 with 0 workers",
                                  bounds=(1, 1024), knob=DATA_KNOB(inert=1, process_only=True))
    # thread first: a thread holds no process of its own (RAM, start-up)
    worker_type: WorkerType = setting(
        WorkerType.process, "process: torch's DataLoader, a process per worker; thread: "
        "torchdata.nodes, loader.num_workers threads in the main process running the same "
        "Dataset, transform and collate (one torch thread each; the start method, "
        "persistent_workers and worker_threads do not act: recorded as with 0 workers); "
        "process with 0 workers ([data.md](data.md#thread-workers))",
        knob=DATA_KNOB(short="worker_type", cheap=(8, lambda v: v != "thread"), inert="process"))
    # in order first: the sampler's, reproducible
    in_order: bool = setting(
        True, "batches in the sampler's order; false: each batch as soon as a worker has it, so "
        "a slow sample holds back no other (process workers need torch >= 2.6); true with 0 "
        "workers", knob=DATA_KNOB(short="in_order", cheap=(9, lambda v: not v), inert=True))


@dataclass
class PrecisionConfig:
    name: PrecisionName = setting(PrecisionName.torch_default, "torch_default: PyTorch's own TF32 "
                                  "flags, what a plain job runs; fp32: strict, TF32 off; tf32; "
                                  "amp_fp16 (CUDA only); amp_bf16", knob=KNOB(short="precision"))


@dataclass
class StepConfig:
    name: StepKind = setting(StepKind.classification, "classification: cross-entropy on the "
                             "model's logits; custom: your loss function, step._target_ "
                             "([data.md](data.md#your-own-training-step))", knob=WORK())
    _target_: str | None = setting(None, "step=custom: your loss function as a dotted path "
                                   "(my_team.train.loss), returning a scalar tensor", knob=WORK())
    takes: StepTakes = setting(
        StepTakes.output, "step=custom: output: loss(model(inputs), targets), the batch an "
        "(inputs, targets) pair; batch: loss(model, batch), for a model that computes its own "
        "loss (the batch a tuple or a dict, moved to the device whole)", knob=WORK())


@dataclass
class BenchSettings:
    ROLE = Role.measure  # how long and how a run was measured, its keys with a knob aside
    device: DeviceKind = setting(DeviceKind.auto, "auto: CUDA when this machine has it",
                                 knob=Knob(place=True))
    phases: list[Phase] = setting(factory=lambda: [Phase.loader, Phase.compute, Phase.e2e],
                                  help="the phases measured, in order; not empty",
                                  rule=check_phases, knob=Knob())
    warmup_steps: int = setting(
        5, "steps run before measuring: at least these, then on until steps are steady; at most "
        "bench.warmup_max_steps", bounds=(0, 10_000))
    warmup_max_steps: int = setting(50, "the warm-up's most steps; at least bench.warmup_steps",
                                    bounds=(0, 10_000))
    steps: int = setting(
        50, "measured steps per phase, split into bench.repeats windows of equal length: rounded "
        "up to a multiple of them (50 steps in 6 windows measure 54)", bounds=(1, 10_000_000))
    repeats: int = setting(
        6, "windows per phase, interleaved across the phases (loader, compute, e2e, loader, ...): "
        "they give each phase its 95% interval; at most bench.steps (more are recorded as "
        "bench.steps: a window is at least one step)", bounds=(1, 100))
    warmup_max_seconds: float = setting(60.0, "wall-clock cap of a phase's warm-up",
                                        bounds=(0.001, 86_400))
    max_seconds: float = setting(60.0, "wall-clock cap of a phase, so nothing runs away on a slow "
                                 "device", bounds=(0.001, 86_400))
    min_window_s: float | None = setting(
        None, "a measured window runs on past its share of bench.steps until it has lasted this "
        "long, so NVML's readings (utilization averaged over 1/6-1 s, power over 1 s) describe "
        "the window, not the phase before; null: 2 s on CUDA with bench.monitor on, else 0 (off); "
        "at most a window's cap, bench.max_seconds / bench.repeats. Under torchrun the step count "
        "is fixed before each window from the last step time", bounds=(0, 3600))
    seed: int = setting(0, "seeds data, crops and weights (NumPy's seed range)",
                        bounds=(0, 2**32 - 1))
    monitor: bool = setting(True, "sample NVML and the host in one thread: each window's figures, "
                            "and gpu_metrics.csv for the whole run")
    monitor_interval_s: float = setting(
        0.2, "the sampling period; at most bench.max_seconds when bench.monitor is on (a window "
        "needs a sample); the floor: at 0 the sampler busy-looped on the host it measures",
        bounds=(0.05, 60))
    flops: bool = setting(True, "count one step's FLOPs once, for MFU")
    optimizer: Optimizer = setting(Optimizer.sgd, "sgd (momentum 0.9) or adamw",
                                   knob=KNOB(short="optimizer"))
    optimizer_impl: OptimizerImpl = setting(
        OptimizerImpl.auto, "auto: torch's choice (foreach on CUDA); for_loop, foreach, fused "
        "force one; foreach and fused only where torch has their kernels", knob=KNOB())
    lr: float = setting(0.01, "the optimizer's learning rate", bounds=(1e-12, 10), knob=Knob())
    grad_accum_steps: int = setting(
        1, "micro-batches per optimizer step (effective batch: loader.batch_size x this); "
        "images/sec counts every micro-batch", bounds=(1, 1024), knob=KNOB())
    cudnn_benchmark: bool | None = setting(
        None, "torch.backends.cudnn.benchmark, the same for every precision (a precision "
        "comparison changes one thing); null: the process's own flag (PyTorch's: off)",
        knob=KNOB(cuda_only=True))
    host_metrics_every: int = setting(
        0, "every k-th micro-batch reads loss and accuracy back to the host (a device sync), as "
        "many training loops do; 0: never", bounds=(0, 100_000), knob=KNOB())
    profile: bool = setting(False, "after the measured windows, a torch.profiler trace of "
                            "bench.profile_steps e2e steps (never timed): traces/ beside "
                            "results.json, logged to MLflow ([profiling.md](profiling.md))")
    profile_steps: int = setting(3, "active steps in the trace", bounds=(1, 1000))


@dataclass
class MemoryConfig:
    ROLE = Role.measure  # the ceiling judges a run, it does not change it
    # any fraction > 0: a tiny one forces over_ceiling
    ceiling: float = setting(0.8, "fraction of device memory a config may peak at and still be "
                             "feasible", bounds=(1e-6, 1.0))
    reserve: float = setting(0.05, "sweep=max_batch keeps this fraction of the ceiling free",
                             bounds=(0.0, 0.99))


@dataclass
class TrackingConfig:
    ROLE = Role.measure
    backend: Backend = setting(Backend.mlflow, "where runs are logged ([tracking.md](tracking.md))")
    uri: str | None = setting(
        None, "the MLflow store; null: sqlite:///<cwd>/outputs/mlflow.db (embedded, no server)",
        allowed="null, http(s)://host[:port], sqlite:///path.db (a missing folder is made only "
        "under the working directory), postgresql[+driver]://..., mysql[+driver]://..., "
        "mssql[+driver]://..., databricks[://profile]; file:///folder or a local folder only with "
        "MLFLOW_ALLOW_FILE_STORE=true (MLflow 3.17 refuses its file store otherwise)")
    # checked with any backend (a run kept on disk is uploaded later under the same names), at
    # MLflow's limits: 500 characters an experiment name, 250 a run's (its mlflow.runName column)
    experiment: str = setting("gpubench", "the MLflow experiment", rule=name_rule(500))
    run_name: str | None = setting(None, "the MLflow run's name; null: made from the setup",
                                   rule=name_rule(250))
    timeout_s: float = setting(10.0, "seconds to wait for a tracking server before giving up "
                               "(results stay on disk)", bounds=(0.1, 3600))


@dataclass
class FaultConfig:
    ROLE = Role.fault  # fault injection for testing recovery paths (never set in real runs)
    oom_above_batch: int | None = setting(None, "testing: an out-of-memory error in the train step "
                                          "for larger batches", bounds=(0, None))
    fail_message: str | None = setting(None, "testing: the run fails with this message")
    fail_after_windows: int = setting(0, "testing: windows measured before fail_message is raised "
                                      "(0: while building)", bounds=(0, 1000))
    stall_every: int | None = setting(None, "testing: every k-th compute/e2e step sleeps "
                                      "fault.stall_s (a disturbed run)", bounds=(1, None))
    stall_s: float = setting(1.0, "testing: seconds of each stall", bounds=(0, 600))
    rank: int | None = setting(None, "testing: under torchrun, only this rank gets the faults "
                               "(null: every rank)", bounds=(0, None))


@dataclass
class BenchConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    step: StepConfig = field(default_factory=StepConfig)
    bench: BenchSettings = field(default_factory=BenchSettings)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    channels_last: bool = setting(False, "NHWC memory format for model and input",
                                  knob=KNOB(short="channels_last"))
    compile: CompileMode = setting(
        CompileMode.off, "torch.compile's mode (compile time falls in the warm-up, reported as "
        "first_step_s)", knob=KNOB(short="compile"))


# one typed root: each group's YAML merges into its typed field
ConfigStore.instance().store(name="gpubench_schema", node=BenchConfig)

KEYS: tuple[Key, ...] = tuple(keys(BenchConfig))
BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
# gpubench's groups: every key under them is declared above
GROUP_NAMES: frozenset[str] = frozenset(k.name.split(".")[0] for k in KEYS if "." in k.name)
# every top-level name gpubench uses: keys, groups, the experiment= and sweep= overlays
ROOT_NAMES: frozenset[str] = frozenset({k.name.split(".")[0] for k in KEYS}
                                       | {"experiment", "sweep"})
# free-form mappings: a team's own constructor arguments and instantiate nodes, any keys
FREE_FORM: tuple[str, ...] = tuple(f"{k.name}." for k in KEYS if k.type is dict)


def check_ranges(cfg: Any, only: tuple[str, ...] | None = None) -> None:
    """Every key with a rule (or `only` these); this machine's: settings.check_resources."""
    check_keys(cfg, KEYS, only)


def check_known_key(key: str, value: Any) -> None:
    """A key under gpubench's groups is declared (free-form mappings aside): `+loader.nosuch=1`
    would be recorded and compared, acting on nothing. Own top-level keys stay allowed (a team
    may keep values there for interpolations)."""
    group = key.split(".")[0]
    if group not in ROOT_NAMES:
        # a root key of one's own that is a near-miss of gpubench's (`+precison=bf16`) would
        # run the default precision and record the typo as if it were a setting
        if close := difflib.get_close_matches(group, sorted(ROOT_NAMES), n=3, cutoff=0.8):
            rest = key[len(group):]
            raise ConfigError(key, value, f"a key gpubench declares (close: "
                              f"{', '.join(c + rest for c in close)}); a top-level key of your "
                              "own needs a name apart")
    if key in BY_NAME or key.startswith(FREE_FORM) or group not in GROUP_NAMES:
        return
    names = [k.name for k in KEYS if k.name.startswith(f"{group}.")]  # declaration order
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.7)
    hint = f"close: {', '.join(close)}" if close else f"one of {', '.join(names)}"
    raise ConfigError(key, value, f"a key gpubench declares ({hint}); a custom class's own "
                                  "arguments go under model.kwargs or dataset.kwargs")


def walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, node) of everything under a node, parents first, unresolved."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            child = node._get_node(k)
            yield f"{prefix}{k}", child
            yield from walk(child, f"{prefix}{k}.")


def config_keys(cfg: Any) -> list[str]:
    return [k for k, _ in walk(cfg) if k.partition(".")[0] != "hydra"]


def check_known_keys(cfg: DictConfig) -> None:
    roots = [(str(k), cfg._get_node(k)) for k in cfg.keys() if k != "hydra" and k not in ROOT_NAMES]
    for group in sorted(GROUP_NAMES):
        roots += walk(cfg._get_node(group) if group in cfg else None, f"{group}.")
    for key, node in roots:
        check_known_key(key, OmegaConf.to_container(node, resolve=False)
                        if isinstance(node, DictConfig) else node._value())


def auto_sizes(device: str) -> tuple[int, int]:
    """(image_size, batch_size) of the null keys: meaningful on a GPU, quick on a CPU (resnet50
    at 224 px, batch 128 takes minutes a step there)."""
    return (224, 128) if device == "cuda" else (32, 16)
