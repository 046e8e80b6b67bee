"""The composed config turned, once, into read-only and fully resolved settings; every input rule.

    compose (Hydra) ─► resolve(cfg) -> Settings ─► check_resources(settings) ─► Benchmark

`resolve` runs every rule that needs neither the disk nor the machine's RAM (ranges, cross-key
rules, a device that exists, a known model, the train step's knobs, tracking, the dataset's
combinations) and fills what the config leaves to the device (dataset.image_size,
loader.batch_size when null: `sizes`). The settings are OmegaConf's own read-only DictConfig of
the resolved values: Enums arrive as their values (plain str; `plain` copies a node back into
writable dicts and lists), so nothing downstream reads the composed config or an Enum again.
`check_resources` is the one explicit step for the rules that look at this machine: folders
that must exist, loader workers against cores and free RAM, in-memory pools against free RAM.
Two resource rules need the built dataset's length and run where it is known (data.py), but
are written here: `check_batch_fits`, `check_preload_fits`, `check_sampled` (and
`check_found_classes` for the classes a folder holds).

Torch-free at import (torch and torchvision are imported lazily by the device and model-name
rules); raises config.ConfigError, one line naming the key, the value and what is allowed. The
settings' groups are the composed config's (config.schema declares them), not written again.
"""

from __future__ import annotations

import difflib
import os
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from gpubench.config import knobs
from gpubench.config.errors import ConfigError
from gpubench.config.footprint import check_local_store, check_memory_sizes
from gpubench.config.keys import EXPERIMENT_NAME_MAX, RUN_NAME_MAX, check_name, keys
from gpubench.config.schema import (
    BenchSettings,
    LoaderConfig,
    auto_sizes,
    check_known_keys,
    check_ranges,
    to_container,
)
from gpubench.config.uris import check_tracking_uri, local_store
from gpubench.core.record import window_plan

# ---------------------------------------------------------------- the settings (read-only)
# The composed config's groups with the resolved values, then what resolve decided: `device`
# (bench.device=auto resolved), `precision` (precision.name), `channels_last`, `compile`
# (torch.compile's mode string: off, default, reduce-overhead, max-autotune), `phases`, `config`
# (the composed config with the device-sized keys filled in, Enums by name as OmegaConf writes
# them: what results.json's "config" and the MLflow params hold) and `notes` (what resolve
# decided for the user that the user should hear about, one line each). bench.device and
# bench.phases are left out of the bench group: resolved, they are `device` and `phases`.
# Read-only all the way down (OmegaConf's readonly flag): a rule checked once cannot be undone by a
# reader writing into it.
Settings = DictConfig
Dataset = Loader = Fault = DictConfig  # a group of the settings, as its readers annotate it


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def plain(v: Any) -> Any:
    """A settings node as plain, writable dicts and lists (JSON, YAML, OmegaConf.create and a
    team's own classes take those)."""
    return OmegaConf.to_container(v) if isinstance(v, (DictConfig, ListConfig)) else v


SIZED_KEYS = ("dataset.image_size", "loader.batch_size")


def sizes(cfg: DictConfig) -> tuple[str, int, int]:
    """(device, image_size, batch_size) of a composed config: bench.device as asked (auto: CUDA
    when this machine has it), the null keys sized by that device (config.auto_sizes). Sizing
    only, with no availability rule: a sweeper on a login node without a GPU sizes the first
    probe of jobs that run on GPU nodes (gpubench.search.maxbatch.start_batch). `resolve` takes its
    device from here and then applies the rules."""
    check_ranges(cfg, only=SIZED_KEYS)
    want = _plain(cfg.bench.device)
    device = want if want != "auto" else ("cuda" if cuda_available() else "cpu")
    image_size, batch_size = auto_sizes(device)
    if cfg.dataset.image_size is not None:
        image_size = int(cfg.dataset.image_size)
    if cfg.loader.batch_size is not None:
        batch_size = int(cfg.loader.batch_size)
    return device, image_size, batch_size


# Loader keys that act only through worker processes, and what each holds without any: torch's
# DataLoader refuses prefetch_factor and persistent_workers with num_workers=0 and starts no
# process. With 0 workers they are resolved to these values (recorded so, and so compared and
# recommended by a report), with a note when the config asked for something else than the
# schema's default: the alternative, refusing them, would fail every 0-worker trial of a sweep
# that also sweeps them.
WORKER_ONLY_KEYS = frozenset(knobs.WORKER_ONLY)  # declared in the schema (Knob.inert)
WORKER_ONLY: dict[str, Any] = {k.partition(".")[2]: v for k, v in knobs.WORKER_ONLY.items()}
# the same rule for thread workers (loader.worker_type=thread), for the worker-only keys that act
# through worker processes alone: no start method, threads started with each epoch (torchdata's
# nodes have no persistent workers), one torch thread each (torchdata/nodes/_apply_udf.py)
PROCESS_ONLY = tuple(k.partition(".")[2] for k in knobs.PROCESS_ONLY)  # declared: Knob.process_only
_LOADER_DEFAULTS = {k.path: _plain(k.default) for k in keys(LoaderConfig)}


def _inert(workers: Any, kind: Any) -> tuple[tuple[str, ...], str]:
    """The loader keys that do not act with these workers, and why, as a note says it."""
    if workers == 0:
        return tuple(WORKER_ONLY), "with loader.num_workers=0"
    if _plain(kind) == "thread":
        return PROCESS_ONLY, "with loader.worker_type=thread"
    return (), ""


def as_run(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted config values as they act: with loader.num_workers=0 the worker-only keys act
    not at all (with thread workers the process-only ones), so they are left out (two such
    settings are one run)."""
    inert = _inert(values.get("loader.num_workers"), values.get("loader.worker_type"))[0]
    return {k: v for k, v in values.items() if k.removeprefix("loader.") not in inert}


def _without_workers(loader: DictConfig) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The worker-only keys' values where they do not act (0 workers; the process-only ones
    with thread workers), and a note for each one set on purpose."""
    inert, why = _inert(loader.num_workers, loader.get("worker_type"))
    notes = []
    for key in inert:
        given, value = _plain(loader.get(key)), WORKER_ONLY[key]
        if given != value and given != _LOADER_DEFAULTS[key]:
            notes.append(f"loader.{key}={given} acts only with loader worker processes: "
                         f"recorded as {'null' if value is None else str(value).lower()} {why}")
    return {k: WORKER_ONLY[k] for k in inert}, tuple(notes)


# bench.min_window_s=null on CUDA with the sampler on. NVML's readings average over up to
# NVML_AVERAGING_S (power 1 s on Ampere and newer, utilization 1/6 to 1 s), so those of a
# window's first NVML_AVERAGING_S still describe the phase before it and the sampler drops
# them (telemetry/monitor.py): twice that leaves as long again whose readings describe the
# window alone.
GPU_MIN_WINDOW_S = 2.0  # 2 x telemetry.nvml.NVML_AVERAGING_S (held so by tests/test_nvml.py)


def window_cap_s(max_seconds: float, repeats: int, steps: int) -> float:
    """A measured window's time cap: a phase's bench.max_seconds shared by its windows
    (bench.repeats of them, at most bench.steps: core.record.window_plan)."""
    return max_seconds / window_plan(steps, repeats)[0]


def min_window_s(bench: DictConfig, device: str) -> float:
    """bench.min_window_s as it acts: the given value; with null, GPU_MIN_WINDOW_S on CUDA with
    bench.monitor on (no longer than a window's cap), else 0: a CPU has no NVML readings to
    make readable, and a CPU run must not get longer for them."""
    given = _plain(bench.min_window_s)
    if given is not None:
        return float(given)
    if device != "cuda" or not bench.monitor:
        return 0.0
    return min(GPU_MIN_WINDOW_S, window_cap_s(bench.max_seconds, bench.repeats, bench.steps))


def _windows(bench: DictConfig) -> tuple[int, tuple[str, ...]]:
    """bench.repeats as it acts: the windows that run (core.record.window_plan: at most
    bench.steps, each window at least one step), recorded so; a note when the config asked for
    more on purpose (a value other than the schema's default)."""
    windows = window_plan(bench.steps, bench.repeats)[0]
    if windows == bench.repeats or bench.repeats == BenchSettings.repeats:
        return windows, ()
    return windows, (f"bench.repeats={bench.repeats} with bench.steps={bench.steps}: {windows} "
                     f"windows of one step ran, recorded as bench.repeats={windows}",)


def _build(cfg: DictConfig, device: str, image_size: int, batch_size: int) -> Settings:
    # without Hydra's own node: a job's config has none, a sweeper's has it (with values only a
    # job fills in, which would not resolve here)
    config = to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
                          if "hydra" in cfg else cfg)
    config["dataset"]["image_size"], config["loader"]["batch_size"] = image_size, batch_size
    inert, notes = _without_workers(cfg.loader)
    config["loader"].update(inert)
    config["bench"]["min_window_s"] = min_window_s(cfg.bench, device)
    config["bench"]["repeats"], ran = _windows(cfg.bench)
    # the groups' Enums written by name are their values (tests/test_settings.py holds them so);
    # compile's are not: its value is torch.compile's mode string
    bench = {k: v for k, v in config["bench"].items() if k not in ("device", "phases")}
    return OmegaConf.create(
        {**config, "bench": bench, "device": device, "precision": config["precision"]["name"],
         "compile": _plain(cfg.compile), "phases": config["bench"]["phases"], "config": config,
         "notes": [*notes, *ran]}, flags={"readonly": True})


# ---------------------------------------------------------------- resolve: rules without disk/RAM

TINY_MODELS = ("tiny",)
# models whose stages gpubench/models.py apply_checkpointing knows how to wrap
CHECKPOINT_PREFIXES = ("resnet", "wide_resnet", "resnext", "vit_", "tiny")
CHECKPOINT_WIRED = "checkpointing is wired for torchvision ResNets, ViTs and tiny"


def known_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models)) + list(TINY_MODELS)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


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


def check_classes(width: int, num_classes: int, key: str = "model.num_classes",
                  value: Any = None) -> None:
    """A classifier narrower than the dataset's classes fails at the first loss ("Target 617 is
    out of bounds", a device-side assert on CUDA) after the loader was already measured.
    `resolve` calls this with model.num_classes (torchvision models); the runner with the built
    model's output width (a custom `_target_`, key model._target_), before any phase."""
    if width < num_classes:
        raise ConfigError(key, width if value is None else value,
                          f"a model whose output width covers the dataset's {num_classes} classes "
                          f"(dataset.num_classes); it outputs {width}")


def resolve(cfg: DictConfig) -> Settings:
    """The read-only settings of a composed config, after every rule that needs neither the disk
    nor the RAM. Raises ConfigError before any work; never changes `cfg`."""
    check_interpolations(cfg)
    check_known_keys(cfg)  # no key under gpubench's groups that the schema does not declare
    check_ranges(cfg)  # every key's declared range or choices
    check_start_method(_plain(cfg.loader.multiprocessing_context))
    device, image_size, batch_size = sizes(cfg)
    if device == "cuda" and not cuda_available():
        raise ConfigError("bench.device", "cuda", "auto or cpu (this machine has no CUDA device)")
    s = _build(cfg, device, image_size, batch_size)
    if s.precision == "amp_fp16" and device != "cuda":
        raise ConfigError(
            "precision", "amp_fp16", "torch_default, fp32, tf32 or amp_bf16 on CPU (fp16 autocast needs CUDA)"
        )
    _check_model(s)
    b = s.bench
    if b.warmup_max_steps < b.warmup_steps:
        raise ConfigError("bench.warmup_max_steps", b.warmup_max_steps,
                          f">= bench.warmup_steps ({b.warmup_steps})")
    cap = window_cap_s(b.max_seconds, b.repeats, b.steps)
    if b.min_window_s > cap:
        raise ConfigError("bench.min_window_s", b.min_window_s,
                          f"<= a window's time cap, bench.max_seconds / bench.repeats "
                          f"({cap:g} s), or null")
    if b.monitor and b.monitor_interval_s > b.max_seconds:  # no sampler, no sample needed
        raise ConfigError("bench.monitor_interval_s", b.monitor_interval_s,
                          f"<= bench.max_seconds ({b.max_seconds:g}) while bench.monitor is on: a "
                          "window needs a sample")
    check_phases(s.phases)
    _check_step(s)
    if s.tracking.backend == "mlflow":
        check_tracking_uri(s.tracking.uri)
    # checked with any backend: a run kept on disk is uploaded later under the same names
    check_name("tracking.experiment", s.tracking.experiment, EXPERIMENT_NAME_MAX)
    if s.tracking.run_name is not None:
        check_name("tracking.run_name", s.tracking.run_name, RUN_NAME_MAX, nullable=True)
    _check_data(s)
    return s


def check_interpolations(cfg: DictConfig) -> None:
    """Every ${...} of the run's config resolves (Hydra's own node aside: a sweeper's holds
    values only a job fills in). One that does not would fail every job, and inside Hydra's
    callbacks it would only be a warning."""
    run = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    try:
        OmegaConf.to_container(run, resolve=True)
    except InterpolationResolutionError as e:
        node: Any = cfg
        for part in str(e.full_key or "").split("."):
            node = node._get_node(part) if isinstance(node, DictConfig) and part in node else None
        raw = node._value() if node is not None else None
        reason = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(e.full_key or "config", raw,
                          f"an interpolation that resolves ({reason})") from None


def check_phases(phases: Any) -> None:
    """bench.phases: not empty, each phase once (a phase listed twice would be measured twice
    per round into the same record, its windows pooled as if they were one phase's)."""
    names = [_plain(p) for p in phases]
    if not names or len(set(names)) != len(names):
        raise ConfigError("bench.phases", names, "a non-empty list of loader, compute, e2e, "
                                                 "each at most once")


def _check_model(s: Settings) -> None:
    m = s.model
    if m._target_ is not None:
        return
    if m.name == "custom":
        raise ConfigError("model._target_", None, "a dotted nn.Module class path, e.g. my_team.models.MyNet")
    check_model_name(m.name)
    # a torchvision model gets model.num_classes outputs: every label must have one
    check_classes(m.num_classes, s.dataset.num_classes)


def check_model_name(name: Any) -> None:
    """model.name is one of torchvision's classifiers or tiny; the error names close ones."""
    if name in TINY_MODELS:  # no torchvision import (1.3 s here, most of it torch._dynamo)
        return
    names = known_models()
    if name in names:
        return
    close = [n for n in names if n.startswith(str(name)[:4])][:6]
    if not close:  # a typo early in the name (an accent, a letter swapped)
        close = difflib.get_close_matches(str(name), names, n=6, cutoff=0.6)
    hint = f" (close: {', '.join(close)})" if close else ""
    raise ConfigError("model.name", name, f"a torchvision classification model or 'tiny'{hint}")


def _check_step(s: Settings) -> None:
    """The train step's knobs (gpubench/step.py, gpubench/models.py)."""
    impl, device = s.bench.optimizer_impl, s.device
    devices = impl_devices(impl)
    if devices is not None and device not in devices:
        raise ConfigError("bench.optimizer_impl", impl,
                          f"auto or for_loop on {device} (torch has {impl} optimizer kernels "
                          f"for {', '.join(devices)} only)")
    m = s.model
    if m.checkpointing:
        if m._target_:
            raise ConfigError("model.checkpointing", True,
                              f"false with model._target_ ({CHECKPOINT_WIRED})")
        if not checkpointable(m.name):
            raise ConfigError("model.checkpointing", True, f"false for {m.name} ({CHECKPOINT_WIRED})")


def node_set(node: dict) -> bool:
    """An instantiate node (dataset.transform, dataset.collate) that names a target."""
    return bool(node) and bool(node.get("_target_"))


def _check_data(s: Settings) -> None:
    ds, kind = s.dataset, s.dataset.name
    if kind in ("imagefolder", "cifar10") and not ds.root:
        raise ConfigError("dataset.root", ds.root, f"a folder path ({kind} reads local files)")
    if ds.decode_on == "device":
        if s.device != "cuda":
            raise ConfigError("dataset.decode_on", "device", "cpu (device decode needs CUDA/nvJPEG)")
        if kind not in ("imagefolder", "fake_jpeg"):
            raise ConfigError("dataset.decode_on", "device", f"cpu for {kind} (not JPEG files)")
        if ds.preload:
            raise ConfigError("dataset.preload", True,
                              "false with decode_on=device (the cache holds decoded pixels)")
    if ds.augment_on == "device" and kind == "device_synthetic":
        raise ConfigError("dataset.augment_on", "device", "cpu for device_synthetic (no augment)")
    if kind != "custom":
        # only a custom dataset reads them: set on another, they would be ignored in silence
        for key, value in (("dataset._target_", ds._target_),
                           ("dataset.transform._target_", ds.transform.get("_target_")),
                           ("dataset.collate._target_", ds.collate.get("_target_"))):
            if value:
                raise ConfigError(key, value, f"unset with dataset={kind} (dataset=custom "
                                  "reads it)")
    if s.step.name != "custom" and s.step._target_:
        raise ConfigError("step._target_", s.step._target_,
                          f"unset with step={s.step.name} (step=custom reads it)")
    if kind == "custom":
        if not ds._target_:
            raise ConfigError("dataset._target_", ds._target_, "a dotted Dataset class path with "
                              "dataset=custom, e.g. my_team.data.MyDataset")
        if node_set(ds.transform) and (ds.preload or ds.augment_on == "device"):
            # both replace the host transform with gpubench's fixed-size decode and crop
            raise ConfigError("dataset.transform._target_", ds.transform["_target_"],
                              "unset with dataset.preload=true or dataset.augment_on=device")


def check_start_method(ctx: str | None) -> None:
    """loader.multiprocessing_context is a start method of this platform (checked even with 0
    workers, where it is then recorded as null: a misspelled one is an error either way)."""
    if ctx is not None:
        # the standard library's list: torch.multiprocessing re-exports the same function
        import multiprocessing

        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ConfigError("loader.multiprocessing_context", ctx, f"null or one of {methods}")


# ---------------------------------------------------------------- this machine: disk and RAM

# A forked DataLoader worker measured ~410 MiB RSS here, most of it pages shared with the main
# process; 256 MiB of its own is a conservative share of free RAM per worker (1000 workers
# exhausted a 24 GiB host).
WORKER_RAM_BYTES = 256 * 2**20
# More workers than 4 per core only queue for the same cores (and each holds its batches).
WORKERS_PER_CORE = 4


def usable_cpus() -> int:
    """Cores this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def check_resources(s: Settings) -> None:
    """The rules that look at this machine: the dataset's folder, workers against cores and
    free RAM, the in-memory pools and the batches in flight against free RAM, a local tracking
    store's folders (config.footprint). Run once, before any work."""
    ds, ld = s.dataset, s.loader
    if ds.name in ("imagefolder", "cifar10"):
        if not Path(os.path.expanduser(str(ds.root))).is_dir():
            raise ConfigError("dataset.root", str(ds.root), "an existing folder")
    cpus, free = usable_cpus(), available_ram()
    by_ram = free // WORKER_RAM_BYTES
    most = min(WORKERS_PER_CORE * cpus, by_ram)
    if ld.num_workers > most:
        why = (f"{WORKERS_PER_CORE} per core, {cpus} cores" if most < by_ram
               else f"{WORKER_RAM_BYTES >> 20} MiB each, {free / 2**30:.1f} GiB RAM free")
        raise ConfigError("loader.num_workers", ld.num_workers, f"an integer in [0, {most}] on this machine ({why})")
    if ld.worker_threads > cpus:
        raise ConfigError("loader.worker_threads", ld.worker_threads,
                          f"an integer in [1, {cpus}] on this machine ({cpus} cores)")
    check_memory_sizes(ds, ld, free)
    if s.tracking.backend == "mlflow" and s.tracking.uri is not None:
        check_local_store("tracking.uri", *local_store(s.tracking.uri), value=s.tracking.uri)


def check_preload_fits(n: int, size: int) -> None:
    """dataset.preload: the decoded cache of `n` images at `size` px against free RAM. A resource
    check run where the built dataset's length is known (data.preload), before decoding."""
    need, free = n * 3 * size * size, available_ram()
    # 80%: the run itself (model, optimizer, worker batches) needs the rest
    if need > 0.8 * free:
        raise ConfigError(
            "dataset.preload", True,
            f"false here (the cache of {n} images at {size} px needs {need / 2**30:.2f} GiB "
            f"and only {free / 2**30:.2f} GiB of RAM is free; lower dataset.image_size or use "
            "a smaller folder)")


# RandomSampler draws each epoch's order as torch.randperm(n).tolist() (torch/utils/data/
# sampler.py RandomSampler.__iter__, torch 2.4 to 2.14): 8 bytes an index in the tensor, about
# 36 more in the list of Python ints
SAMPLED_BYTES = 44


def check_sampled(n: int, key: str, value: Any) -> None:
    """A dataset's length against the order shuffling it holds, in half of the free RAM: a
    custom Dataset's __len__ of 10**15 would exhaust memory in the sampler. A resource check
    run where the built dataset's length is known (parts.custom_data)."""
    most = available_ram() // 2 // SAMPLED_BYTES
    if n > most:
        raise ConfigError(key, value, f"a Dataset of at most {most} samples on this machine "
                                      f"(its __len__ is {n}; shuffling holds {SAMPLED_BYTES} "
                                      "bytes a sample, in half of the free RAM)")


def check_batch_fits(s: Settings, n: int) -> None:
    """loader.batch_size against the built dataset's `n` samples: with drop_last a batch larger
    than the dataset never comes. A resource check run where the length is known (data.py)."""
    if n < s.loader.batch_size and s.loader.drop_last:
        raise ConfigError("loader.batch_size", s.loader.batch_size,
                          f"<= {n} (the dataset size) with drop_last")


def check_found_classes(s: Settings, n: int, where: str) -> None:
    """The classes found on disk (folders, CIFAR-10 labels) against dataset.num_classes and
    model.num_classes: a label at or past the classifier's width fails deep inside the loss (a
    device-side assert on CUDA). Run where the dataset was read (data.py)."""
    for key, value in (("dataset.num_classes", s.dataset.num_classes),
                       ("model.num_classes", s.model.num_classes)):
        if value is not None and int(value) < n:
            raise ConfigError(key, int(value), f">= {n} ({where})")


__all__ = ["Settings", "check_batch_fits", "plain", "sizes", "check_classes", "check_found_classes",
           "check_preload_fits", "check_resources", "check_sampled", "resolve"]
