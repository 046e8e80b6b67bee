"""The typed schema of a gpubench run, and the one place where input is validated.

Hydra composes `conf/bench.yaml` on top of `BenchConfig` (registered in the ConfigStore as
`gpubench_schema`), so a wrong type or an unknown Enum value fails at compose time. The rules
that need more than a type (a model name torchvision knows, a folder that exists, CUDA being
there for fp16) live in `validate()`, which runs before any measurement starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, read_write


def _config_dir() -> Path:
    # Absolute, so `python -m gpubench` works from any directory (a relative config_path is
    # resolved as `pkg://conf` under `python -m` and fails). In a checkout the YAMLs are
    # ../conf; in a wheel they are packaged as gpubench/conf.
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "bench.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"gpubench configs not found next to {here}")


CONFIG_DIR = _config_dir()


class ConfigError(ValueError):
    """Bad input: one line naming the key, the bad value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r} is not allowed: {allowed}")


class DatasetKind(Enum):
    synthetic = "synthetic"
    device_synthetic = "device_synthetic"
    fake_jpeg = "fake_jpeg"
    imagefolder = "imagefolder"
    cifar10 = "cifar10"
    custom = "custom"  # the team's own Dataset class: dataset._target_ (gpubench.custom_data)


class Where(Enum):
    cpu = "cpu"
    device = "device"


class OnCorrupt(Enum):
    skip = "skip"
    fail = "fail"


class PrecisionName(Enum):
    torch_default = "torch_default"
    fp32 = "fp32"
    tf32 = "tf32"
    amp_fp16 = "amp_fp16"
    amp_bf16 = "amp_bf16"


class CompileMode(Enum):
    off = "off"
    default = "default"
    reduce_overhead = "reduce-overhead"
    max_autotune = "max-autotune"


class DeviceKind(Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


class Phase(Enum):
    loader = "loader"
    compute = "compute"
    e2e = "e2e"


@dataclass
class DatasetConfig:
    name: DatasetKind = DatasetKind.synthetic
    # null: sized by device (224 px on a GPU, 32 px on a CPU; see resolve_auto)
    image_size: int | None = None
    num_classes: int = 1000
    # images in the in-memory datasets (synthetic, fake_jpeg): a pool that is cycled
    num_samples: int = 512
    root: str | None = None
    jpeg_quality: int = 90
    # decode the whole dataset once into a shared uint8 tensor, then only augment per step
    preload: bool = False
    augment_on: Where = Where.cpu
    decode_on: Where = Where.cpu
    on_corrupt: OnCorrupt = OnCorrupt.skip
    # dataset=custom: the team's Dataset class (dotted path) and its constructor arguments, as
    # model._target_/model.kwargs; transform and collate are optional Hydra instantiate nodes
    # ({_target_: ..., other keys as its arguments}); see docs/data.md for the sample contract
    _target_: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    transform: dict[str, Any] = field(default_factory=dict)
    collate: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    name: str = "resnet50"
    num_classes: int = 1000
    # escape hatch: a dotted path to the team's own nn.Module class; its other keys go in kwargs
    _target_: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    # activation checkpointing over the model's stages (ResNets, ViTs, tiny): less memory for
    # activations, about one more forward of compute (gpubench/models.py)
    checkpointing: bool = False


@dataclass
class LoaderConfig:
    # null: sized by device (128 on a GPU, 16 on a CPU)
    batch_size: int | None = None
    num_workers: int = 2
    pin_memory: bool = True
    prefetch_factor: int | None = 2
    persistent_workers: bool = True
    drop_last: bool = True
    # null: the platform default (fork on Linux: workers share preloaded tensors for free)
    multiprocessing_context: str | None = None
    # torch threads per worker: 1 stops N workers from each spawning one thread per core
    worker_threads: int = 1


@dataclass
class PrecisionConfig:
    name: PrecisionName = PrecisionName.torch_default


@dataclass
class BenchSettings:
    device: DeviceKind = DeviceKind.auto
    phases: list[Phase] = field(default_factory=lambda: [Phase.loader, Phase.compute, Phase.e2e])
    # warm-up: at least warmup_steps, then on until steps are steady (at most warmup_max_steps)
    warmup_steps: int = 5
    warmup_max_steps: int = 50
    # measured steps per phase, split into `repeats` windows interleaved across the phases
    # (loader, compute, e2e, loader, ...): the windows give each phase its 95% interval
    # (at most `steps` windows: each measures at least one step)
    steps: int = 50
    repeats: int = 6
    # per-phase wall-clock caps, so no phase runs away on a slow device
    warmup_max_seconds: float = 60.0
    max_seconds: float = 60.0
    seed: int = 0
    monitor: bool = True
    monitor_interval_s: float = 0.2
    flops: bool = True
    optimizer: str = "sgd"
    # auto (torch's choice), for_loop, foreach or fused (where the device has the kernels)
    optimizer_impl: str = "auto"
    lr: float = 0.01
    # micro-batches per optimizer step: images/sec counts every micro-batch
    grad_accum_steps: int = 1
    # torch.backends.cudnn.benchmark; null: as the precision sets it (on for fp32/tf32/amp_*,
    # the process's own flag, PyTorch's default off, for torch_default)
    cudnn_benchmark: bool | None = None
    # every k-th micro-batch reads loss and accuracy back to the host (0: never)
    host_metrics_every: int = 0
    # after the measured windows: a torch.profiler trace of a few e2e steps (never timed)
    profile: bool = False
    profile_steps: int = 3


@dataclass
class MemoryConfig:
    # fraction of device memory a config may peak at and still count as feasible
    ceiling: float = 0.8
    # for sweep=max_batch: fraction of the ceiling kept free as a safety reserve
    reserve: float = 0.05


@dataclass
class TrackingConfig:
    backend: str = "mlflow"
    # null: sqlite:///<cwd>/outputs/mlflow.db (embedded, no server)
    uri: str | None = None
    experiment: str = "gpubench"
    run_name: str | None = None
    # seconds to wait for a tracking server before giving up (results stay on disk)
    timeout_s: float = 10.0


@dataclass
class FaultConfig:
    """Fault injection for testing recovery paths (never set in real runs)."""

    oom_above_batch: int | None = None
    fail_message: str | None = None
    # windows measured before fail_message is raised (0: while building, before any window)
    fail_after_windows: int = 0
    # every stall_every-th compute/e2e step sleeps stall_s seconds (a disturbed run)
    stall_every: int | None = None
    stall_s: float = 1.0
    # under torchrun: only this rank gets the faults above (null: every rank)
    rank: int | None = None


@dataclass
class BenchConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    bench: BenchSettings = field(default_factory=BenchSettings)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    channels_last: bool = False
    compile: CompileMode = CompileMode.off


def register_configs() -> None:
    cs = ConfigStore.instance()
    # One typed root: each group's YAML is merged into its typed field (BenchConfig.dataset is
    # a DatasetConfig, ...), so group options need no schema of their own.
    cs.store(name="gpubench_schema", node=BenchConfig)


register_configs()


# ---------------------------------------------------------------- validation (the one place)

TINY_MODELS = ("tiny",)


def known_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models)) + list(TINY_MODELS)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(cfg: DictConfig) -> str:
    want = cfg.bench.device
    want = want.value if isinstance(want, Enum) else str(want)
    if want == "auto":
        return "cuda" if cuda_available() else "cpu"
    return want


def _enum_value(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def validate(cfg: DictConfig) -> str:
    """Check everything a type cannot; return the device. Raises ConfigError, no work done."""
    device = resolve_device(cfg)
    if device == "cuda" and not cuda_available():
        raise ConfigError("bench.device", "cuda", "auto or cpu (this machine has no CUDA device)")

    ds, ld, prec = cfg.dataset, cfg.loader, _enum_value(cfg.precision.name)
    if prec == "amp_fp16" and device != "cuda":
        raise ConfigError(
            "precision", "amp_fp16", "torch_default, fp32, tf32 or amp_bf16 on CPU (fp16 autocast needs CUDA)"
        )
    if cfg.model.get("_target_") is None:
        name = cfg.model.name
        if name == "custom":
            raise ConfigError("model._target_", None, "a dotted nn.Module class path, e.g. my_team.models.MyNet")
        if name not in known_models():
            close = [m for m in known_models() if m.startswith(str(name)[:4])][:6]
            hint = f" (close: {', '.join(close)})" if close else ""
            raise ConfigError(
                "model.name", name, f"a torchvision classification model or 'tiny'{hint}"
            )
    for key, value, low in (
        ("loader.batch_size", ld.batch_size, 1),
        ("dataset.image_size", ds.image_size, 8),
        ("dataset.num_classes", ds.num_classes, 1),
        ("model.num_classes", cfg.model.num_classes, 1),
        ("dataset.num_samples", ds.num_samples, 1),
        ("fault.rank", cfg.fault.get("rank"), 0),
    ):
        if value is not None and value < low:
            raise ConfigError(key, value, f"an integer >= {low}")
    if ld.num_workers < 0:
        raise ConfigError("loader.num_workers", ld.num_workers, "an integer >= 0")
    if ld.prefetch_factor is not None and ld.prefetch_factor < 1:
        raise ConfigError("loader.prefetch_factor", ld.prefetch_factor, "null or an integer >= 1")
    if not 0.0 < cfg.memory.ceiling <= 1.0:
        raise ConfigError("memory.ceiling", cfg.memory.ceiling, "a fraction in (0, 1]")
    if not 0.0 <= cfg.memory.reserve < 1.0:
        raise ConfigError("memory.reserve", cfg.memory.reserve, "a fraction in [0, 1)")
    b = cfg.bench
    if b.steps < 1:
        raise ConfigError("bench.steps", b.steps, "an integer >= 1")
    if b.warmup_steps < 0:
        raise ConfigError("bench.warmup_steps", b.warmup_steps, "an integer >= 0")
    if not 1 <= b.repeats <= 100:
        raise ConfigError("bench.repeats", b.repeats, "an integer in [1, 100]")
    if not b.warmup_steps <= b.warmup_max_steps <= 10000:
        raise ConfigError("bench.warmup_max_steps", b.warmup_max_steps,
                          f"an integer in [bench.warmup_steps ({b.warmup_steps}), 10000]")
    f = cfg.fault
    if f.stall_every is not None and f.stall_every < 1:
        raise ConfigError("fault.stall_every", f.stall_every, "null or an integer >= 1")
    if not 0 <= f.fail_after_windows <= 1000:
        raise ConfigError("fault.fail_after_windows", f.fail_after_windows, "an integer in [0, 1000]")
    if not 0.0 <= f.stall_s <= 600.0:
        raise ConfigError("fault.stall_s", f.stall_s, "seconds in [0, 600]")
    if b.max_seconds <= 0:
        raise ConfigError("bench.max_seconds", b.max_seconds, "seconds > 0")
    if not b.phases:
        raise ConfigError("bench.phases", [], "a non-empty list of loader, compute, e2e")
    if b.profile_steps < 1:
        raise ConfigError("bench.profile_steps", b.profile_steps, "an integer >= 1")
    if b.optimizer not in ("sgd", "adamw"):
        raise ConfigError("bench.optimizer", b.optimizer, "sgd or adamw")
    _validate_step(cfg, device)
    if cfg.tracking.backend not in ("mlflow", "none"):
        raise ConfigError("tracking.backend", cfg.tracking.backend, "mlflow or none")

    kind = _enum_value(ds.name)
    if kind in ("imagefolder", "cifar10"):
        if not ds.root:
            raise ConfigError("dataset.root", ds.root, f"a folder path ({kind} reads local files)")
        root = Path(os.path.expanduser(str(ds.root)))
        if not root.is_dir():
            raise ConfigError("dataset.root", str(ds.root), "an existing folder")
    if _enum_value(ds.decode_on) == "device":
        if device != "cuda":
            raise ConfigError("dataset.decode_on", "device", "cpu (device decode needs CUDA/nvJPEG)")
        if kind not in ("imagefolder", "fake_jpeg"):
            raise ConfigError("dataset.decode_on", "device", f"cpu for {kind} (not JPEG files)")
    if _enum_value(ds.augment_on) == "device" and kind == "device_synthetic":
        raise ConfigError("dataset.augment_on", "device", "cpu for device_synthetic (no augment)")
    return device


# auto: torch's own choice (foreach on CUDA, the per-parameter loop elsewhere); for_loop,
# foreach and fused force one implementation (gpubench/step.py make_optimizer)
OPTIMIZER_IMPLS = ("auto", "for_loop", "foreach", "fused")
# models whose stages gpubench/models.py apply_checkpointing knows how to wrap
CHECKPOINT_PREFIXES = ("resnet", "wide_resnet", "resnext", "vit_", "tiny")


def checkpointable(name: str) -> bool:
    return str(name).startswith(CHECKPOINT_PREFIXES)


def impl_devices(impl: str) -> list[str] | None:
    """Device types that have the kernels for an optimizer implementation, as torch lists
    them (None: any device). Elsewhere torch either raises (fused) or runs foreach as a slow
    per-tensor fallback, so forcing them there would benchmark something nobody runs."""
    if impl not in ("foreach", "fused"):
        return None
    from torch.optim import optimizer as o

    name = f"_get_{impl}_kernels_supported_devices"
    if hasattr(o, name):
        return list(getattr(o, name)())
    return ["cuda"]  # older torch: CUDA only


def _validate_step(cfg: DictConfig, device: str) -> None:
    """The train step's knobs (gpubench/step.py, gpubench/models.py)."""
    b = cfg.bench
    impl = b.get("optimizer_impl", "auto")
    if impl not in OPTIMIZER_IMPLS:
        raise ConfigError("bench.optimizer_impl", impl, ", ".join(OPTIMIZER_IMPLS))
    devices = impl_devices(impl)
    if devices is not None and device not in devices:
        raise ConfigError("bench.optimizer_impl", impl,
                          f"auto or for_loop on {device} (torch has {impl} optimizer kernels "
                          f"for {', '.join(devices)} only)")
    if not 1 <= b.get("grad_accum_steps", 1) <= 1024:
        raise ConfigError("bench.grad_accum_steps", b.grad_accum_steps, "an integer in [1, 1024]")
    if not 0 <= b.get("host_metrics_every", 0) <= 100000:
        raise ConfigError("bench.host_metrics_every", b.host_metrics_every,
                          "an integer in [0, 100000] (0: never)")
    if cfg.model.get("checkpointing"):
        if cfg.model.get("_target_"):
            raise ConfigError("model.checkpointing", True,
                              "false with model._target_ (checkpointing is wired for "
                              "torchvision ResNets, ViTs and tiny)")
        if not checkpointable(cfg.model.name):
            raise ConfigError("model.checkpointing", True,
                              f"false for {cfg.model.name} (checkpointing is wired for "
                              f"torchvision ResNets, ViTs and tiny)")


def resolve_auto(cfg: DictConfig, device: str) -> None:
    """Fill the null 'sized by device' keys in place: a meaningful default on a GPU, a quick one
    on a CPU (resnet50 at 224 px and batch 128 would take minutes per step there)."""
    on_gpu = device == "cuda"
    with read_write(cfg):
        if cfg.dataset.image_size is None:
            cfg.dataset.image_size = 224 if on_gpu else 32
        if cfg.loader.batch_size is None:
            cfg.loader.batch_size = 128 if on_gpu else 16


def to_container(cfg: DictConfig) -> dict:
    """Plain, JSON-friendly dict of the resolved config (Enums as their values)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


__all__ = [
    "BenchConfig",
    "CONFIG_DIR",
    "ConfigError",
    "resolve_auto",
    "resolve_device",
    "to_container",
    "validate",
]
