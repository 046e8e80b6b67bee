"""The typed schema of a gpubench run, its range table, and the checks that run before Hydra.

Hydra composes `conf/bench.yaml` on top of `BenchConfig` (registered in the ConfigStore as
`gpubench_schema`), so a wrong type or an unknown Enum value fails at compose time. The rules
that need more than a type (a model name torchvision knows, a folder that exists, CUDA being
there for fp16) are in gpubench/settings.py: `resolve` turns the composed config into frozen
settings, `check_resources` looks at the disk and RAM, both before any measurement starts. The
checks that need Hydra's own node (group names, the sweeper's storage) run in `InputCheck`,
before Hydra creates anything.

Why one module of this size: the schema and its range table must be read together (a key, its
type and its range sit side by side); the URI and group-name checks are the part of validation
that runs before Hydra builds anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpubench.core.ranges import range_last
from gpubench.core.secrets import mask_secrets
from gpubench.core.uris import MLFLOW_SQL_SCHEMES, SQL_SCHEMES


def _config_dir() -> Path:
    # Absolute, so `python -m gpubench` works from any directory (a relative config_path is
    # resolved as `pkg://conf` under `python -m` and fails). In a checkout the YAMLs are
    # ../../conf; in a wheel they are packaged as gpubench/conf.
    here = Path(__file__).resolve().parent.parent
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
    custom = "custom"  # the team's own Dataset class: dataset._target_ (gpubench.parts.custom_data)


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
    # null: sized by device (224 px on a GPU, 32 px on a CPU; see auto_sizes)
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
    # (at most `steps` windows: each measures at least one step; windows are of equal length,
    # so steps is rounded up to a multiple of repeats: 50 in 6 windows measure 54)
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


# ---------------------------------------------------------------- ranges (settings.resolve applies them)

# Every numeric key and its allowed range: (key, low, high, nullable). A bound of None is open;
# the bounds that depend on the machine are checked in settings.check_resources. docs/configuration.md
# lists the same ranges (tests/test_config.py keeps the two in step).
INT, FLOAT = "an integer", "a number"
RANGES: tuple[tuple[str, str, float, float, bool], ...] = (
    ("dataset.image_size", INT, 8, 65_535, True),  # JPEG's largest side; RAM bounds the pools
    ("dataset.num_classes", INT, 1, 1_000_000, False),
    ("dataset.num_samples", INT, 1, 10_000_000, False),
    ("dataset.jpeg_quality", INT, 1, 100, False),
    ("model.num_classes", INT, 1, 1_000_000, False),
    ("loader.batch_size", INT, 1, 65_536, True),
    ("loader.num_workers", INT, 0, 1024, False),  # and the machine's cores and RAM
    ("loader.prefetch_factor", INT, 1, 64, True),
    ("loader.worker_threads", INT, 1, 1024, False),  # and the machine's cores
    ("bench.warmup_steps", INT, 0, 10_000, False),  # and <= bench.warmup_max_steps
    ("bench.warmup_max_steps", INT, 0, 10_000, False),  # and >= bench.warmup_steps
    ("bench.steps", INT, 1, 10_000_000, False),
    ("bench.repeats", INT, 1, 100, False),
    ("bench.warmup_max_seconds", FLOAT, 0.001, 86_400, False),
    ("bench.max_seconds", FLOAT, 0.001, 86_400, False),
    ("bench.seed", INT, 0, 2**32 - 1, False),  # numpy seeds stop at 2**32 - 1
    ("bench.monitor_interval_s", FLOAT, 0.05, 60, False),  # and <= bench.max_seconds
    ("bench.lr", FLOAT, 1e-12, 10, False),
    ("bench.grad_accum_steps", INT, 1, 1024, False),
    ("bench.host_metrics_every", INT, 0, 100_000, False),  # 0: never
    ("bench.profile_steps", INT, 1, 1000, False),
    ("memory.ceiling", FLOAT, 1e-6, 1.0, False),  # any fraction > 0: a tiny one forces over_ceiling
    ("memory.reserve", FLOAT, 0.0, 0.99, False),
    ("tracking.timeout_s", FLOAT, 0.1, 3600, False),
    ("fault.oom_above_batch", INT, 0, None, True),
    ("fault.fail_after_windows", INT, 0, 1000, False),
    ("fault.stall_every", INT, 1, None, True),
    ("fault.stall_s", FLOAT, 0, 600, False),
    ("fault.rank", INT, 0, None, True),
)


def allowed_range(kind: str, low: float | None, high: float | None, nullable: bool) -> str:
    """The 'allowed' text of a range, as the docs and the error line spell it."""
    def fmt(v: float) -> str:
        return str(int(v)) if kind == INT else f"{v:g}"

    if low is not None and high is not None:
        text = f"{kind} in [{fmt(low)}, {fmt(high)}]"
    elif low is not None:
        text = f"{kind} >= {fmt(low)}"
    else:
        text = f"{kind} <= {fmt(high)}"
    return f"null or {text}" if nullable else text


def check_range(key: str, value: Any, kind: str, low: float | None, high: float | None,
                nullable: bool = False) -> None:
    allowed = allowed_range(kind, low, high, nullable)
    if value is None:
        if not nullable:
            raise ConfigError(key, value, allowed)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, value, allowed)
    if kind == INT and float(value) != int(value):
        raise ConfigError(key, value, allowed)
    # written as "not inside" so NaN (which compares False to everything) is rejected too
    if not ((low is None or value >= low) and (high is None or value <= high)):
        raise ConfigError(key, value, allowed)


def auto_sizes(device: str) -> tuple[int, int]:
    """(image_size, batch_size) for the null 'sized by device' keys: a meaningful default on a
    GPU, a quick one on a CPU (resnet50 at 224 px and batch 128 takes minutes per step there)."""
    return (224, 128) if device == "cuda" else (32, 16)


# ---------------------------------------------------------------- URIs

# MLflow tracking stores: its REST server, a local folder, or a SQLAlchemy database
TRACKING_SCHEMES = ("http", "https", "file", *MLFLOW_SQL_SCHEMES, "databricks", "databricks-uc", "uc")
# Optuna's RDB storage takes a SQLAlchemy URL
STORAGE_SCHEMES = SQL_SCHEMES
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$")


def check_tracking_uri(uri: Any) -> None:
    """tracking.uri (with tracking=mlflow): the one call site for its form, from `settings.resolve`
    and from `InputCheck` (before an MLflow parent run exists)."""
    check_uri("tracking.uri", uri, TRACKING_SCHEMES, path_ok=True)


def check_uri(key: str, uri: Any, schemes: tuple[str, ...], path_ok: bool = False) -> None:
    """Reject a malformed URI before any work (it would otherwise fail only when the run is
    logged or the study opened). `path_ok`: a bare local path is a store too (MLflow's)."""
    if uri is None:
        return
    try:
        _check_uri(key, str(uri), schemes, path_ok)
    except ConfigError as e:  # the line names the URI, never its password
        raise ConfigError(e.key, mask_secrets(str(e.value)), e.allowed) from None


def _check_uri(key: str, text: str, schemes: tuple[str, ...], path_ok: bool) -> None:
    allowed = f"a URI with scheme {', '.join(schemes)}" + (" or a local path" if path_ok else "")
    if not text.strip() or any(c.isspace() for c in text):
        raise ConfigError(key, text, allowed + " (no spaces)")
    m = _SCHEME.match(text)
    if m is None or (path_ok and len(m.group(1)) == 1):  # no scheme (or a Windows drive letter)
        if path_ok:
            return
        raise ConfigError(key, text, allowed)
    scheme, rest = m.group(1).lower(), m.group(2)
    base, _, driver = scheme.partition("+")
    if base not in schemes or (driver and base not in SQL_SCHEMES):
        raise ConfigError(key, text, allowed + (" (+driver for databases)" if driver else ""))
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in 0-65535
    except ValueError:
        raise ConfigError(key, text, f"{allowed}, with a numeric port") from None
    if base in ("http", "https") and not parts.hostname:
        raise ConfigError(key, text, f"{base}://host[:port][/path]")
    # an in-memory sqlite:// is an Optuna storage (a throwaway study), never a tracking store:
    # no run logged there would outlive the process
    memory_ok = key != "tracking.uri" and rest == "//"
    if base == "sqlite" and not (memory_ok or (rest.startswith("///") and len(rest) > 3)):
        raise ConfigError(key, text, "sqlite:///relative/path.db or sqlite:////absolute/path.db"
                          + (" or sqlite://" if key != "tracking.uri" else ""))
    if base in SQL_SCHEMES and base != "sqlite" and (not rest.startswith("//") or rest == "//"):
        raise ConfigError(key, text, f"{scheme}://[user[:password]@]host[:port]/database")
    if base == "file" and not parts.path:
        raise ConfigError(key, text, "file:///absolute/folder")


# ---------------------------------------------------------------- before Hydra runs anything

# `optional` in bench.yaml's defaults: Hydra skips a name that does not exist without a word
OPTIONAL_GROUPS = ("sweep", "experiment")


def group_options(group: str) -> list[str]:
    """Option names of a config group, from every folder on the search path (--config-dir too)."""
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return list(GlobalHydra.instance().config_loader().get_group_options(group))
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def check_choices(cfg: DictConfig) -> None:
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    for group in OPTIONAL_GROUPS:
        name = choices.get(group)
        if name is None:
            continue
        options = group_options(group)
        if name not in options:
            raise ConfigError(group, name, f"one of {', '.join(options) or '(none)'} "
                                           f"(conf/{group}/ or a --config-dir)")


_ABSENT = object()


def _swept_values(o) -> list:
    """The values a sweep override names: every choice, a range's ends, an interval's ends."""
    from hydra.core.override_parser.types import IntervalSweep, RangeSweep

    v = o.value()
    if isinstance(v, IntervalSweep):
        return [v.start, v.end]
    if isinstance(v, RangeSweep):
        last = range_last(v.start, v.stop, v.step)
        return [v.start, last] if last is not None else []
    return list(o.sweep_iterator())


def _keys(node: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Every dotted key under `node` (nodes read unresolved), the top-level `skip` left out."""
    if not isinstance(node, DictConfig):
        return []
    out = []
    for k in node.keys():
        if k in skip:
            continue
        key = f"{prefix}{k}"
        out.append(key)
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            out += _keys(child, key + ".")
    return out


def check_sweep_overrides(cfg: DictConfig) -> None:
    """Every swept key of a multirun (`key=a,b`, `choice(...)`, `range(...)`, `interval(...)`,
    on the command line or in hydra.sweeper.params) names a key of the config or a config
    group, and its values are in the key's range (RANGES) or among the group's options: a
    misspelled key or a value out of range would otherwise fail every trial, one by one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = list(OmegaConf.select(cfg, "hydra.overrides.task", default=None) or [])
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    texts = task + [f"{k}={v}" for k, v in params.items()]
    try:
        overrides = OverridesParser.create().parse_overrides(texts)
    except Exception:  # Hydra itself reports a malformed override
        return
    groups = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    ranges = {key: (kind, low, high, nullable) for key, kind, low, high, nullable in RANGES}
    for o in overrides:
        key = o.key_or_group
        if (not o.is_sweep_override() or o.is_add() or o.is_force_add() or o.is_delete()
                or key.startswith(("hydra.", "hydra/"))):
            continue
        values = _swept_values(o)
        if key in groups:
            options = group_options(key)
            for v in values:
                if str(v) not in options:
                    raise ConfigError(key, v, f"one of {', '.join(options)} (conf/{key}/ or a "
                                              "--config-dir)")
            continue
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            import difflib

            close = difflib.get_close_matches(key, _keys(cfg, skip=("hydra",)), n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise ConfigError(key, o.input_line.split("=", 1)[-1] if o.input_line else values,
                              f"a key of the config to sweep{hint}; +{key}=... adds a new one")
        if key in ranges:
            for v in values:
                check_range(key, v, *ranges[key])


def check_before_work(cfg: DictConfig) -> None:
    """What can be checked on the whole composed config (with its `hydra` node) before Hydra
    creates a run dir, a sweeper or an MLflow parent run: group names, swept keys and values,
    and URIs."""
    check_choices(cfg)
    check_sweep_overrides(cfg)
    if OmegaConf.select(cfg, "tracking.backend") == "mlflow":
        check_tracking_uri(OmegaConf.select(cfg, "tracking.uri"))
    storage = OmegaConf.select(cfg, "hydra.sweeper.storage", default=None)
    if isinstance(storage, str):
        check_uri("hydra.sweeper.storage", storage, STORAGE_SCHEMES)


class InputRejected(SystemExit):
    """Bad input found by `InputCheck`; its code is the ConfigError. A SystemExit because Hydra
    turns an Exception raised in a callback into a warning and carries on; this one ends the
    command (gpubench.cli.errors prints it as one line, exit 2)."""


class InputCheck(Callback):
    """Listed first in bench.yaml's hydra.callbacks: Hydra calls it on the composed config
    before the sweeper is built and before any other callback (the MLflow parent run) starts."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    @staticmethod
    def _check(config: DictConfig) -> None:
        try:
            check_before_work(config)
        except ConfigError as e:
            raise InputRejected(e) from None


def to_container(cfg: DictConfig) -> dict:
    """Plain, JSON-friendly dict of the resolved config (Enums by name, as OmegaConf writes
    them: what results.json's "config" has always held)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


__all__ = [
    "BenchConfig",
    "CONFIG_DIR",
    "ConfigError",
    "InputCheck",
    "RANGES",
    "auto_sizes",
    "check_range",
    "check_uri",
    "to_container",
]
