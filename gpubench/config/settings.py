"""The composed config resolved once into read-only settings (`resolve`: the rules needing neither
disk nor RAM), this machine's rules (`check_resources`) and the built dataset's (from parts.data).
Torch-free at import."""

from __future__ import annotations

import contextlib
import copy
import difflib
import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from gpubench.config import knobs, schema
from gpubench.config.errors import ConfigError
from gpubench.config.footprint import check_local_store, check_memory_sizes
from gpubench.config.overrides import format_value
from gpubench.config.uris import check_tracking_uri, local_store
from gpubench.core.record import window_plan

# Read-only (no reader can undo a rule checked once): the groups resolved, Enums as values, plus
# `device`, `precision`, `compile` (mode string), `phases`, `config` (composed, sized keys filled,
# Enums by name: what results.json and MLflow hold) and `notes` (what the user should hear).
Settings = DictConfig
Loader = Fault = DictConfig  # a group of the settings, as its readers annotate it


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def plain(v: Any) -> Any:
    """A settings node as plain, writable dicts and lists (for JSON, YAML, a team's classes)."""
    return OmegaConf.to_container(v) if isinstance(v, (DictConfig, ListConfig)) else v


def device_of(cfg: DictConfig) -> str:
    want = _plain(cfg.bench.device)
    return want if want != "auto" else ("cuda" if cuda_available() else "cpu")


def sizes(cfg: DictConfig) -> tuple[str, int, int]:
    """(device, image_size, batch_size), the null keys sized by bench.device. No availability
    rule: a sweeper on a login node sizes the jobs that run on GPU nodes."""
    schema.check_ranges(cfg, only=("dataset.image_size", "loader.batch_size"))
    device = device_of(cfg)
    given, auto = (cfg.dataset.image_size, cfg.loader.batch_size), schema.auto_sizes(device)
    return device, *(a if g is None else int(g) for g, a in zip(given, auto, strict=True))


def as_run(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted values as they act (knobs.acts): settings differing only in inert keys are one run."""
    return {k: v for k, v in values.items() if knobs.acts(k, values.get)}


def _without_workers(loader: DictConfig) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The loader keys inert with these workers as their Knob.inert, a note for each set on
    purpose: torch refuses prefetch_factor and persistent_workers with 0 workers, and refusing
    them would fail every 0-worker trial of a sweep (thread workers: process_only keys alike)."""
    workers = loader.num_workers
    get = {"loader.num_workers": workers, "loader.worker_type": _plain(loader.get("worker_type"))}
    why = "with loader.num_workers=0" if workers == 0 else "with loader.worker_type=thread"
    values, notes = {}, []
    for key in (k for k in knobs.WORKER_ONLY if not knobs.acts(k, get.get)):
        name, value = key.partition(".")[2], knobs.WORKER_ONLY[key]
        given = _plain(loader.get(name))
        if given != value and given != _plain(knobs.KEYS[key].default):
            notes.append(f"{key}={given} acts only with loader worker processes: "
                         f"recorded as {format_value(value)} {why}")
        values[name] = value
    return values, tuple(notes)


# bench.min_window_s=null on CUDA with the sampler: it drops a window's first NVML_AVERAGING_S
# (power 1 s, utilization 1/6-1 s; telemetry/monitor.py), twice that leaves as long again.
GPU_MIN_WINDOW_S = 2.0


def window_cap_s(max_seconds: float, repeats: int, steps: int) -> float:
    return max_seconds / window_plan(steps, repeats)[0]


def min_window_s(bench: DictConfig, device: str) -> float:
    """bench.min_window_s as it acts; null: GPU_MIN_WINDOW_S (at most a window's cap) on CUDA
    with bench.monitor on, else 0 (a CPU has no NVML readings)."""
    if bench.min_window_s is not None:
        return float(bench.min_window_s)
    if device != "cuda" or not bench.monitor:
        return 0.0
    return min(GPU_MIN_WINDOW_S, window_cap_s(bench.max_seconds, bench.repeats, bench.steps))


def _windows(bench: DictConfig) -> tuple[int, tuple[str, ...]]:
    """bench.repeats as it acts (at most bench.steps), a note when more were set on purpose."""
    windows = window_plan(bench.steps, bench.repeats)[0]
    if windows == bench.repeats or bench.repeats == schema.BenchSettings.repeats:
        return windows, ()
    return windows, (f"bench.repeats={bench.repeats} with bench.steps={bench.steps}: {windows} "
                     f"windows of one step ran, recorded as bench.repeats={windows}",)


def _run(cfg: DictConfig) -> DictConfig:
    """The config without Hydra's node (a sweeper's has values only a job fills in)."""
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg


# models whose stages gpubench/parts/models.py apply_checkpointing knows how to wrap
CHECKPOINT_PREFIXES = ("resnet", "wide_resnet", "resnext", "vit_", "tiny")
CHECKPOINT_WIRED = "checkpointing is wired for torchvision ResNets, ViTs and tiny"


def known_models() -> list[str]:
    import torchvision  # 1.3 s here, most of it torch._dynamo: only when a name is not tiny

    return sorted(torchvision.models.list_models(module=torchvision.models)) + ["tiny"]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def checkpointable(name: str) -> bool:
    return str(name).startswith(CHECKPOINT_PREFIXES)


def impl_devices(impl: str) -> list[str] | None:
    """Devices with kernels for an optimizer impl (None: any); else fused raises, foreach crawls."""
    if impl not in ("foreach", "fused"):
        return None
    from torch.utils import _foreach_utils

    return list(getattr(_foreach_utils, f"_get_{impl}_kernels_supported_devices")())


def impls_on(device: str) -> str:
    names = [i.value for i in schema.OptimizerImpl
             if (d := impl_devices(i.value)) is None or device in d]
    return " or ".join(", ".join(names).rsplit(", ", 1))


def check_classes(width: int, num_classes: int, key: str = "model.num_classes",
                  value: Any = None) -> None:
    """A classifier narrower than the classes fails at the first loss, after the loader ran."""
    if width < num_classes:
        raise ConfigError(key, width if value is None else value,
                          f"a model whose output width covers the dataset's {num_classes} classes "
                          f"(dataset.num_classes); it outputs {width}")


def resolve(cfg: DictConfig, *, checked: bool = False) -> Settings:
    """The read-only settings of `cfg` (left unchanged). `checked`: check_before_work passed."""
    if not checked:
        check_interpolations(cfg)
        schema.check_known_keys(cfg)
    schema.check_ranges(cfg)
    device, image_size, batch_size = sizes(cfg)
    if device == "cuda" and not cuda_available():
        raise ConfigError("bench.device", "cuda", "auto or cpu (this machine has no CUDA device)")
    config = OmegaConf.to_container(_run(cfg), resolve=True, enum_to_str=True)
    config["dataset"]["image_size"], config["loader"]["batch_size"] = image_size, batch_size
    inert, notes = _without_workers(cfg.loader)
    config["loader"].update(inert)
    config["bench"]["min_window_s"] = min_window_s(cfg.bench, device)
    config["bench"]["repeats"], ran = _windows(cfg.bench)
    bench = {k: v for k, v in config["bench"].items() if k not in ("device", "phases")}
    s = OmegaConf.create(
        {**config, "bench": bench, "device": device, "precision": config["precision"]["name"],
         "compile": _plain(cfg.compile), "phases": config["bench"]["phases"], "config": config,
         "notes": [*notes, *ran]}, flags={"readonly": True})
    for bad, key, value, allowed in _rules(s):
        if bad:
            raise ConfigError(key, value, allowed)
    if s.model._target_ is None:  # after the table's cheap rules: torchvision takes about 1.3 s
        check_model_name(s.model.name)
        check_classes(s.model.num_classes, s.dataset.num_classes)
    if s.tracking.backend == "mlflow" and not checked:
        check_tracking_uri(s.tracking.uri)
    return s


def _missing_keys(cfg: DictConfig | ListConfig) -> set[str]:
    """OmegaConf.missing_keys without resolving (its ${...} of a `???` raised, naming no key)."""
    out = set()
    for k in range(len(cfg)) if isinstance(cfg, ListConfig) else cfg.keys():
        if OmegaConf.is_missing(cfg, k):
            out.add(cfg._get_full_key(k))
        elif isinstance(node := cfg._get_node(k), (DictConfig, ListConfig)):
            out |= set() if OmegaConf.is_interpolation(cfg, k) else _missing_keys(node)
    return out


def check_interpolations(cfg: DictConfig, swept: Mapping[str, Any] | None = None) -> None:
    """No `???` left (it reached a team's class as that text) and every ${...} resolves: either
    would fail every job. `swept`: keys a sweep sets in each job (absent from a multirun's
    config), with one job's value: a `???` one is filled so `${.root}/train` resolves."""
    run, swept = _run(cfg), swept or {}
    missing = _missing_keys(run)
    if left := sorted(missing - set(swept)):  # named itself, not a ${...} of it that fails
        raise ConfigError(left[0], "???", "a value (??? marks one its config leaves to set: "
                          f"{left[0]}=... on the command line, or in the YAML)")
    if fill := {k: v for k, v in swept.items() if k in missing}:
        run = copy.deepcopy(run)
        with read_write(run), open_dict(run):
            for k, v in fill.items():
                with contextlib.suppress(OmegaConfBaseException):  # the override's check names it
                    OmegaConf.update(run, k, v, merge=False)
    try:
        OmegaConf.to_container(run, resolve=True)
    except InterpolationResolutionError as e:
        node = dict(schema.walk(cfg)).get(e.full_key)
        raw = node._value() if node is not None else None
        reason = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(e.full_key or "config", raw,
                          f"an interpolation that resolves ({reason})") from None


def check_model_name(name: Any) -> None:
    if name == "tiny" or name in (names := known_models()):  # tiny: without torchvision
        return
    close = [n for n in names if n.startswith(str(name)[:4])][:6]
    if not close:  # a typo early in the name (an accent, a letter swapped)
        close = difflib.get_close_matches(str(name), names, n=6, cutoff=0.6)
    hint = f" (close: {', '.join(close)})" if close else ""
    raise ConfigError("model.name", name, f"a torchvision classification model or 'tiny'{hint}")


def node_set(node: dict) -> bool:
    return bool(node and node.get("_target_"))


def _rules(s: Settings) -> list[tuple[bool, str, Any, str]]:
    """(broken, key, value, allowed) of each rule across keys, in checking order."""
    b, m, ds, kind = s.bench, s.model, s.dataset, s.dataset.name
    cap = window_cap_s(b.max_seconds, b.repeats, b.steps)
    impl, devices = b.optimizer_impl, impl_devices(b.optimizer_impl)
    decode = ds.decode_on == "device"
    return [
        (s.precision == "amp_fp16" and s.device != "cuda", "precision", "amp_fp16",
         "torch_default, fp32, tf32 or amp_bf16 on CPU (fp16 autocast needs CUDA)"),
        (b.warmup_max_steps < b.warmup_steps, "bench.warmup_max_steps", b.warmup_max_steps,
         f">= bench.warmup_steps ({b.warmup_steps})"),
        (b.min_window_s > cap, "bench.min_window_s", b.min_window_s,
         f"<= a window's time cap, bench.max_seconds / bench.repeats ({cap:g} s), or null"),
        # no sampler, no sample needed
        (b.monitor and b.monitor_interval_s > b.max_seconds, "bench.monitor_interval_s",
         b.monitor_interval_s, f"<= bench.max_seconds ({b.max_seconds:g}) while bench.monitor "
         "is on: a window needs a sample"),
        (devices is not None and s.device not in devices, "bench.optimizer_impl", impl,
         f"{impls_on(s.device)} on {s.device} (torch has {impl} optimizer kernels for "
         f"{', '.join(devices or ())} only)"),
        (m.checkpointing and bool(m._target_), "model.checkpointing", True,
         f"false with model._target_ ({CHECKPOINT_WIRED})"),
        (m.checkpointing and not checkpointable(m.name), "model.checkpointing", True,
         f"false for {m.name} ({CHECKPOINT_WIRED})"),
        (kind in ("imagefolder", "cifar10") and not ds.root, "dataset.root", ds.root,
         f"a folder path ({kind} reads local files)"),
        (decode and s.device != "cuda", "dataset.decode_on", "device",
         "cpu (device decode needs CUDA/nvJPEG)"),
        (decode and kind not in ("imagefolder", "fake_jpeg"), "dataset.decode_on", "device",
         f"cpu for {kind} (not JPEG files)"),
        (decode and ds.preload, "dataset.preload", True,
         "false with decode_on=device (the cache holds decoded pixels)"),
        (ds.augment_on == "device" and kind == "device_synthetic", "dataset.augment_on",
         "device", "cpu for device_synthetic (no augment)"),
        # only a custom dataset reads them: set on another, they would be ignored in silence
        *((kind != "custom" and bool(value), key, value,
           f"unset with dataset={kind} (dataset=custom reads it)")
          for key, value in (("dataset._target_", ds._target_),
                             ("dataset.transform._target_", ds.transform.get("_target_")),
                             ("dataset.collate._target_", ds.collate.get("_target_")))),
        (s.step.name != "custom" and bool(s.step._target_), "step._target_", s.step._target_,
         f"unset with step={s.step.name} (step=custom reads it)"),
        (kind == "custom" and not ds._target_, "dataset._target_", ds._target_,
         "a dotted Dataset class path with dataset=custom, e.g. my_team.data.MyDataset"),
        # both replace the host transform with gpubench's fixed-size decode and crop
        (kind == "custom" and node_set(ds.transform) and (ds.preload or ds.augment_on == "device"),
         "dataset.transform._target_", ds.transform.get("_target_"),
         "unset with dataset.preload=true or dataset.augment_on=device"),
        (m._target_ is None and m.name == "custom", "model._target_", None,
         "a dotted nn.Module class path, e.g. my_team.models.MyNet"),
    ]


# A forked worker measured ~410 MiB RSS, mostly shared: 256 MiB of its own is conservative (1000
# workers exhausted a 24 GiB host). More than 4 per core only queue (each holding its batches).
WORKER_RAM_BYTES, WORKERS_PER_CORE = 256 * 2**20, 4


def usable_cpus() -> int:
    """Cores this process may run on (a container's or taskset's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def check_resources(s: Settings) -> None:
    """This machine's rules (folders, cores, free RAM), once before any work."""
    ds, ld = s.dataset, s.loader
    if ds.name in ("imagefolder", "cifar10") and not Path(str(ds.root)).expanduser().is_dir():
        raise ConfigError("dataset.root", str(ds.root), "an existing folder")
    cpus, free = usable_cpus(), available_ram()
    by_ram = free // WORKER_RAM_BYTES
    most = min(WORKERS_PER_CORE * cpus, by_ram)
    workers = (f"{WORKERS_PER_CORE} per core, {cpus} cores" if most < by_ram
               else f"{WORKER_RAM_BYTES >> 20} MiB each, {free / 2**30:.1f} GiB RAM free")
    for key, high, why in (("loader.num_workers", most, workers),
                           ("loader.worker_threads", cpus, f"{cpus} cores")):
        k = schema.BY_NAME[key]
        if (value := OmegaConf.select(s, key)) > high:
            raise ConfigError(key, value, f"{k.within(high)} on this machine ({why})")
    check_memory_sizes(ds, ld, free)
    if s.tracking.backend == "mlflow" and s.tracking.uri is not None:
        check_local_store("tracking.uri", *local_store(s.tracking.uri), value=s.tracking.uri)


def check_preload_fits(n: int, size: int) -> None:
    need, free = n * 3 * size * size, available_ram()
    # 80%: the run itself (model, optimizer, worker batches) needs the rest
    if need > 0.8 * free:
        raise ConfigError("dataset.preload", True, f"false here (the cache of {n} images at {size} "
                          f"px needs {need / 2**30:.2f} GiB and only {free / 2**30:.2f} GiB of "
                          "RAM is free; lower dataset.image_size or use a smaller folder)")


# RandomSampler's order per epoch, torch.randperm(n).tolist() (torch 2.4-2.14): 8 bytes an index in
# the tensor, ~36 more in the list
SAMPLED_BYTES = 44


def check_sampled(n: int, key: str, value: Any) -> None:
    """`n` samples' shuffled order in half the free RAM (a __len__ of 10**15 exhausted it)."""
    most = available_ram() // 2 // SAMPLED_BYTES
    if n > most:
        raise ConfigError(key, value, f"a Dataset of at most {most} samples on this machine "
                                      f"(its __len__ is {n}; shuffling holds {SAMPLED_BYTES} "
                                      "bytes a sample, in half of the free RAM)")


def check_batch_fits(s: Settings, n: int) -> None:
    if n < s.loader.batch_size and s.loader.drop_last:
        raise ConfigError("loader.batch_size", s.loader.batch_size,
                          f"<= {n} (the dataset size) with drop_last")


def check_found_classes(s: Settings, n: int, where: str) -> None:
    """Classes found on disk within dataset/model.num_classes (past them the loss fails)."""
    for key, value in (("dataset.num_classes", s.dataset.num_classes),
                       ("model.num_classes", s.model.num_classes)):
        if value < n:
            raise ConfigError(key, value, f">= {n} ({where})")

