"""One benchmark run: validate, build, measure the phases, write results.json, judge, report.

`run_benchmark(cfg)` is the plain function behind `python -m gpubench`; tests call it directly.
results.json is rewritten after every phase, so a crash, an OOM or Ctrl-C never loses what was
already measured, and it is written before any tracking server is contacted.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig

from gpubench import distributed, env
from gpubench.config import ConfigError, _enum_value, resolve_auto, to_container, validate
from gpubench.data import CorruptImage, build_pipeline
from gpubench.distributed import Dist
from gpubench.files import write_json
from gpubench.measure import WindowStats, run_window
from gpubench.models import build_model, maybe_compile, prepare_model
from gpubench.monitor import Monitor
from gpubench.precision import apply_backend_flags, resolve_precision
from gpubench.step import TrainStep, count_step_flops_split, is_oom, make_optimizer
from gpubench.verdict import Knobs, judge

log = logging.getLogger("gpubench")

RESULTS_FILE = "results.json"
# telemetry of the headline phase (e2e, else the last measured) copied to the top level
HEADLINE_TELEMETRY = (
    "gpu_util_mean", "gpu_util_max", "gpu_mem_util_mean", "power_mean_w",
    "host_cpu_util_mean", "process_cpu_util_mean", "main_cpu_util_mean",
    "workers_cpu_util_mean", "main_peak_rss_bytes", "workers_peak_rss_bytes",
)
# statuses a run ends with; only "ok" counts as feasible for a sweep
STATUSES = ("ok", "oom", "over_ceiling", "failed", "killed")


@dataclass
class Result:
    data: dict
    path: Path
    notes: list[str] = field(default_factory=list)
    # False: tracking was on but MLflow missed the run (results kept; `tracking sync` later)
    tracked: bool | None = None
    # False on torchrun ranks other than 0: they measure, but do not write, print or log
    main: bool = True

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def objective(self) -> float:
        """What a sweeper maximizes: e2e images/sec (or the last phase measured), and 0.0 for
        a run that did not finish within the memory ceiling; always a finite float."""
        v = self.data.get("objective")
        return float(v) if v is not None and math.isfinite(v) else 0.0


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def output_dir(out_dir: str | Path | None) -> Path:
    if out_dir is not None:
        p = Path(out_dir)
    else:
        try:
            from hydra.core.hydra_config import HydraConfig

            p = Path(HydraConfig.get().runtime.output_dir)
        except ValueError:  # not under @hydra.main: a fresh folder under ./outputs
            p = Path("outputs") / "runs" / time.strftime("%Y-%m-%d/%H-%M-%S")
    p.mkdir(parents=True, exist_ok=True)
    return p


def free_device_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


class _Run:
    """State of one run while it measures (kept small: the phases, the memory peaks)."""

    def __init__(self, cfg: DictConfig, device: str, out: Path, dist: Dist):
        self.cfg, self.device, self.out, self.dist = cfg, device, out, dist
        self.path = out / RESULTS_FILE
        self.total_mem = env.device_memory_bytes(device)
        self.data: dict = {
            # identifies this run everywhere (tracking tags, offline sync de-duplication)
            "run_uid": uuid.uuid4().hex,
            "status": "running",
            "error": None,
            "objective": None,
            "images_per_sec": None,
            "loader_images_per_sec": None,
            "compute_images_per_sec": None,
            "bottleneck": None,
            "reason": None,
            "advice": [],
            "step_time_p50_s": None,
            "step_time_p95_s": None,
            "data_wait_fraction": None,
            "peak_memory_bytes": None,
            "peak_memory_fraction": None,
            "memory_ceiling": float(cfg.memory.ceiling),
            "memory_source": "torch_cuda_reserved" if device == "cuda" else "host_rss",
            "torch_peak_allocated_bytes": None,
            "torch_peak_reserved_bytes": None,
            "nvml_memory_used_bytes": None,
            "device_memory_bytes": self.total_mem,
            "gpu_util_mean": None,
            "gpu_util_max": None,
            "gpu_mem_util_mean": None,
            "power_mean_w": None,
            "energy_per_image_j": None,
            "host_cpu_util_mean": None,
            "process_cpu_util_mean": None,
            "peak_rss_bytes": None,
            **dict.fromkeys(HEADLINE_TELEMETRY),
            "read_mb_per_s": None,
            "disk_read_mb_per_s": None,
            "mfu": None,
            "flops_per_step": None,
            "achieved_tflops": None,
            "skipped_samples": 0,
            "phases": {},
            "series": {},
            "data_info": {},
            "world_size": dist.world,
            "config": to_container(cfg),
            "env": env.facts(device),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": None,
        }
        self.t0 = time.perf_counter()

    def save(self) -> None:
        if not self.dist.main:  # one results.json per run, from rank 0
            return
        self.data["seconds"] = time.perf_counter() - self.t0
        write_json(self.path, self.data)

    def record_phase(self, stats: WindowStats, telemetry: dict, mem: dict) -> None:
        ph = stats.summary() | {"telemetry": telemetry, "memory": mem}
        self.data["phases"][stats.phase] = ph
        self.data["series"][stats.phase] = {
            "warmup_step_times_s": stats.warmup_step_times_s,
            "step_times_s": stats.step_times_s,
        }
        self.save()


def _phase_memory(device: str) -> dict:
    if device != "cuda":
        return {}
    return {
        "torch_peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "torch_peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def _reset_peaks(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def across_ranks(stats: WindowStats, dist: Dist) -> WindowStats:
    """The run's throughput under torchrun: all ranks' images over the slowest rank's window
    (data-parallel training steps together, so the slowest rank sets the pace). Step times and
    data wait stay rank 0's."""
    images = dist.gather(stats.images)
    seconds = dist.gather(stats.seconds)
    per_rank = dist.gather(stats.images_per_sec)
    merged = dataclasses.replace(stats, images=sum(images), seconds=max(seconds),
                                 images_per_sec=sum(images) / max(seconds))
    merged.ranks_images_per_sec = per_rank
    return merged


def phase_functions(name: str, pipe, step):
    """(fetch, work) for one phase; `work` returns the images it processed.

    loader: fetch from the DataLoader, copy to the device, no model. compute: the same step on
    one batch kept on the device, so fetch costs nothing. e2e: fetch, copy, step."""
    if name == "compute":
        x, y = pipe.device_batch()
        n = int(y.shape[0])

        def compute_only(batch):
            step(*batch)
            return n

        return (lambda: (x, y)), compute_only
    batches = pipe.batches()

    def load_or_train(batch):
        moved = pipe.to_device(batch)
        if moved is None:  # every sample of this batch failed to decode (on_corrupt=skip)
            return 0
        if name == "e2e":
            step(*moved)
        return int(moved[1].shape[0])

    return (lambda: next(batches)), load_or_train


def measure(cfg: DictConfig, device: str, run: _Run, monitor: Monitor) -> None:
    """Build everything, then the phases in order; each phase lands in results.json."""
    b, dist = cfg.bench, run.dist
    plan = resolve_precision(_enum_value(cfg.precision.name), device)
    apply_backend_flags(plan)
    pipe = build_pipeline(cfg, device, (dist.rank, dist.world) if dist.enabled else None)
    run.data["data_info"] = pipe.info
    try:
        phases = [_enum_value(p) for p in b.phases]
        bs = int(cfg.loader.batch_size)
        fault_here = distributed.fault_hits(cfg.fault.get("rank"), dist.rank)
        step = None
        if "compute" in phases or "e2e" in phases:
            model = prepare_model(build_model(cfg), device, bool(cfg.channels_last))
            opt = make_optimizer(model, b.optimizer, float(b.lr))
            if b.flops:
                x, y = pipe.device_batch()
                split = count_step_flops_split(model, plan, device, x, y)
                run.data["flops_per_step"] = split and split["total"]
                run.data["flops_by_kind"] = split  # conv vs matmul: MFU's peak per math
            compiled = maybe_compile(dist.wrap(model, device), cfg.compile)
            step = TrainStep(compiled, plan, device, opt,
                             cfg.fault.oom_above_batch if fault_here else None)
        if cfg.fault.fail_message and fault_here:
            raise RuntimeError(cfg.fault.fail_message)

        def window(name, fetch, work):
            _reset_peaks(device)
            holder = {}
            stats = run_window(
                name, fetch, work, bs, device,
                int(b.warmup_steps), int(b.steps), float(b.warmup_max_seconds), float(b.max_seconds),
                # all ranks open their windows together
                on_open=lambda: (dist.barrier(), monitor.start()),
                on_close=lambda: holder.setdefault("t", monitor.stop()),
            )
            if dist.enabled:
                # every rank reached this window's end healthy before figures are gathered
                # (a failed rank announces itself instead: Dist.watch ends the others)
                dist.agree(None)
                stats = across_ranks(stats, dist)
            tel = holder["t"]
            run.record_phase(stats, tel.as_dict(), _phase_memory(device))
            if tel.samples:
                run.data["series"][name]["telemetry"] = [
                    {k: v for k, v in vars(s).items() if v is not None} for s in tel.samples
                ]
            return stats

        for name in phases:
            window(name, *phase_functions(name, pipe, step))
        if b.profile:
            from gpubench.profile import profile_steps

            name = "e2e" if step is not None else "loader"
            run.data["profile"] = profile_steps(
                *phase_functions(name, pipe, step), device, run.out, int(b.profile_steps))
            run.save()
        run.data["skipped_samples"] = pipe.skipped
    finally:
        pipe.shutdown()


def summarize(run: _Run, cfg: DictConfig, device: str, cpu_count: int) -> None:
    """Fill the top-level figures and the verdict from the phases measured."""
    d, ph = run.data, run.data["phases"]

    def ips(name):
        return ph.get(name, {}).get("images_per_sec")

    d["loader_images_per_sec"] = ips("loader")
    d["compute_images_per_sec"] = ips("compute")
    d["images_per_sec"] = ips("e2e")
    main = ph.get("e2e") or ph.get("compute") or ph.get("loader") or {}
    d["objective"] = main.get("images_per_sec")
    d["step_time_p50_s"] = main.get("step_time_p50_s")
    d["step_time_p95_s"] = main.get("step_time_p95_s")
    d["data_wait_fraction"] = ph.get("e2e", {}).get("data_wait_fraction")

    tel = [p["telemetry"] for p in ph.values()]
    mems = [p["memory"] for p in ph.values()]

    def peak(key, rows):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return max(vals) if vals else None

    d["torch_peak_allocated_bytes"] = peak("torch_peak_allocated_bytes", mems)
    d["torch_peak_reserved_bytes"] = peak("torch_peak_reserved_bytes", mems)
    d["nvml_memory_used_bytes"] = peak("nvml_memory_used_bytes", tel)
    d["peak_rss_bytes"] = peak("peak_rss_bytes", tel)
    main_tel = main.get("telemetry", {})
    for k in HEADLINE_TELEMETRY:
        d[k] = main_tel.get(k)
    # the loader phase is where the data side works alone: its I/O rate is the dataset's
    io = ph.get("loader", {}).get("telemetry") or main_tel
    d["read_mb_per_s"] = io.get("read_mb_per_s")
    d["disk_read_mb_per_s"] = io.get("disk_read_mb_per_s")
    if main_tel.get("energy_j") is not None and main.get("images"):
        d["energy_per_image_j"] = main_tel["energy_j"] / main["images"]

    if device == "cuda":
        d["peak_memory_bytes"] = d["torch_peak_reserved_bytes"]
    else:
        d["peak_memory_bytes"] = d["peak_rss_bytes"]
    if d["peak_memory_bytes"] is not None:
        d["peak_memory_fraction"] = d["peak_memory_bytes"] / run.total_mem

    # MFU: FLOPs of one step (counted once) x steps/s over the dense peak for this dtype
    fl, comp = d.get("flops_per_step"), ph.get("e2e") or ph.get("compute")
    if fl and comp and comp.get("step_time_mean_s"):
        # per device: the run's images/sec is summed over torchrun ranks, the peak is one GPU's
        achieved = fl * comp["images_per_sec"] / comp["batch_size"] / d["world_size"]
        d["achieved_tflops"] = achieved / 1e12
        plan = resolve_precision(_enum_value(cfg.precision.name), device)
        split = d.get("flops_by_kind") or {"conv": fl, "matmul": 0.0}
        pk = env.mixed_peak_flops(d["env"]["device_name"], plan.flops_by_math(
            split["conv"], split["matmul"])) if device == "cuda" else None
        d["mfu"] = achieved / pk if pk else None

    knobs = Knobs(
        device=device,
        num_workers=int(cfg.loader.num_workers),
        cpu_count=cpu_count,
        pin_memory=bool(cfg.loader.pin_memory),
        preload=bool(cfg.dataset.preload),
        augment_on=_enum_value(cfg.dataset.augment_on),
        precision=_enum_value(cfg.precision.name),
        channels_last=bool(cfg.channels_last),
        compile=_enum_value(cfg.compile),
        batch_size=int(cfg.loader.batch_size),
        dataset=_enum_value(cfg.dataset.name),
        memory_fraction=d["peak_memory_fraction"],
        ceiling=float(cfg.memory.ceiling),
        is_conv="vit" not in str(cfg.model.name),
    )
    v = judge(d["loader_images_per_sec"], d["compute_images_per_sec"], d["images_per_sec"],
              d["data_wait_fraction"], knobs)
    d["bottleneck"], d["reason"], d["advice"] = v.bottleneck, v.reason, v.advice


def measure_run(cfg: DictConfig, out_dir: str | Path | None = None) -> Result:
    """Validate (raises ConfigError before any work), measure, write results.json.

    Out-of-memory and other runtime errors do not raise: they end the run with status
    "oom" / "failed" and whatever phases finished. Ctrl-C marks it "killed" and re-raises.
    """
    device = validate(cfg)
    resolve_auto(cfg, device)
    dist = distributed.from_env(device)
    out = output_dir(out_dir)
    _seed(int(cfg.bench.seed))
    run = _Run(cfg, device, out, dist)
    monitor = Monitor(device, float(cfg.bench.monitor_interval_s), bool(cfg.bench.monitor))
    notes = [monitor.gpu_note] if monitor.gpu_note else []
    run.save()

    def peer_failed(status: str, message: str) -> None:  # on the watcher thread, then exit
        if dist.main:  # a peer's OOM is the run's OOM (the same batch on every rank)
            run.data.update(status=status if status in ("oom", "killed") else "failed",
                            objective=0.0, error=f"another rank failed: {message}")
            run.save()

    dist.watch(peer_failed)
    try:
        measure(cfg, device, run, monitor)
        run.data["status"] = "ok"
    except KeyboardInterrupt as e:
        run.data["status"], run.data["error"] = "killed", "interrupted (Ctrl-C)"
        summarize(run, cfg, device, os.cpu_count() or 1)
        run.save()
        # so run_benchmark can still track the run, as KILLED
        e.result = Result(run.data, run.path, notes)  # type: ignore[attr-defined]
        raise
    except CorruptImage as e:
        run.data["status"], run.data["error"] = "failed", str(e)
    except Exception as e:
        if not is_oom(e, device):
            if isinstance(e, ConfigError):
                # bad input found while building (an empty folder, a preload too big for
                # RAM): nothing was measured, so no results.json is left behind either
                if not run.data["phases"]:
                    run.path.unlink(missing_ok=True)
                raise
            log.debug("run failed", exc_info=True)
            run.data["status"], run.data["error"] = "failed", f"{type(e).__name__}: {e}"
        else:
            run.data["status"], run.data["error"] = "oom", f"{type(e).__name__}: {str(e)[:500]}"
    finally:
        if run.data["status"] != "ok":  # the other ranks must not wait for this one
            dist.announce(run.data["status"], run.data["error"] or "stopped before measuring")
        monitor.stop()
        free_device_memory(device)
        dist.close()
    summarize(run, cfg, device, os.cpu_count() or 1)
    frac = run.data["peak_memory_fraction"]
    if run.data["status"] == "ok" and frac is not None and frac > cfg.memory.ceiling:
        run.data["status"] = "over_ceiling"
        run.data["error"] = f"peak memory {frac:.1%} of the device > memory.ceiling {cfg.memory.ceiling:.0%}"
    if run.data["status"] != "ok":
        run.data["objective"] = 0.0
    run.save()
    return Result(run.data, run.path, notes, main=dist.main)


def run_benchmark(cfg: DictConfig, out_dir: str | Path | None = None, quiet: bool = False) -> Result:
    """The whole run: measure (results.json first), then the console summary and tracking."""
    try:
        result = measure_run(cfg, out_dir)
    except KeyboardInterrupt as e:
        if cfg.tracking.backend != "none" and hasattr(e, "result"):
            from gpubench import tracking

            tracking.log_result(cfg, e.result)
        raise
    if not result.main:
        return result
    if not quiet:
        from gpubench.console import print_result

        print_result(result)
    if cfg.tracking.backend != "none":
        from gpubench import tracking

        result.tracked = tracking.log_result(cfg, result)
    return result
