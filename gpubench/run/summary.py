"""A measured run's top-level figures, validity checks and verdict, filled into its record."""

from __future__ import annotations

import os

from gpubench.analysis import noise
from gpubench.analysis.labels import IMPOSSIBLE
from gpubench.analysis.verdict import Knobs, judge
from gpubench.core.pipe import batches_in_flight, serial_rate
from gpubench.core.record import PHASE_FIGURE, PHASE_NAMES, Flaw, Reason, Status
from gpubench.parts.precision import resolve_precision
from gpubench.telemetry import env
from gpubench.telemetry.nvml import energy_per_image, memory_gate_bytes

# telemetry of the headline phase (e2e, else the last measured) copied to the top level
HEADLINE_TELEMETRY = ("gpu_util_mean", "gpu_util_max", "gpu_mem_util_mean", "power_mean_w",
                      "host_cpu_util_mean", "process_cpu_util_mean", "main_cpu_util_mean",
                      "workers_cpu_util_mean", "main_peak_rss_bytes", "workers_peak_rss_bytes")


def _peak(key: str, rows: list[dict]):
    return max((r[key] for r in rows if r.get(key) is not None), default=None)


def figures(rec, device: str) -> None:
    """Headline throughputs with intervals, step times, memory, telemetry, MFU."""
    ph = rec.phases
    for name, attr in PHASE_FIGURE.items():
        p = ph.get(name)
        setattr(rec, attr, p.images_per_sec if p else None)
        setattr(rec, attr + "_ci", p.images_per_sec_ci if p else None)
    main = rec.headline
    for k in ("step_time_p50_s", "step_time_p95_s"):
        setattr(rec, k, getattr(main, k, None))
    rec.data_wait_fraction = ph["e2e"].data_wait_fraction if "e2e" in ph else None

    tel = [p.telemetry for p in ph.values()]
    mems = [p.memory for p in ph.values()]
    for k, rows in (("torch_peak_allocated_bytes", mems), ("torch_peak_reserved_bytes", mems),
                    ("nvml_memory_used_bytes", tel), ("peak_rss_bytes", tel)):
        setattr(rec, k, _peak(k, rows))
    main_tel = main.telemetry if main else {}
    for k in HEADLINE_TELEMETRY:
        setattr(rec, k, main_tel.get(k))
    # the loader phase is where the data side works alone: its I/O rate is the dataset's
    io = ph["loader"].telemetry if "loader" in ph else main_tel
    rec.read_mb_per_s = io.get("read_mb_per_s")
    rec.disk_read_mb_per_s = io.get("disk_read_mb_per_s")
    if main and main.images:
        # under torchrun every rank's GPU energy over every rank's images; else this GPU's
        energy = main_tel.get("energy_j_all_ranks", main_tel.get("energy_j"))
        rec.energy_per_image_j = energy_per_image(energy, main.images)

    if device == "cuda":
        # the gate: the larger of torch's reserved peak plus what lives outside its allocator
        # (CUDA context, cuBLAS/cuDNN workspaces, NCCL, nvJPEG) and the peak sampled in use
        rec.extra["device_used_peak_bytes"] = used = _peak("device_used_peak_bytes", tel)
        rec.peak_memory_bytes = memory_gate_bytes(
            rec.torch_peak_reserved_bytes, used, _peak("non_torch_peak_bytes", tel))
        if used is not None:
            rec.memory_source = "max(torch reserved + outside torch, device in use)"
    else:
        rec.peak_memory_bytes = rec.peak_rss_bytes
    if rec.peak_memory_bytes is not None and rec.device_memory_bytes:
        rec.peak_memory_fraction = rec.peak_memory_bytes / rec.device_memory_bytes

    # MFU: FLOPs of one step (counted once) x steps/s over the dense peak for this dtype
    comp = ph.get("e2e") or ph.get("compute")
    if rec.flops_per_step and comp and comp.images_per_sec and comp.batch_size:
        # per device: the run's images/sec is summed over torchrun ranks, the peak is one GPU's
        achieved = rec.flops_per_step * comp.images_per_sec / comp.batch_size / rec.world_size
        rec.achieved_tflops = achieved / 1e12
        plan = resolve_precision(rec.config["precision"]["name"], device)
        split = rec.extra.get("flops_by_kind") or {"conv": rec.flops_per_step, "matmul": 0.0}
        # the peak of this device's multiprocessors (a MIG slice's share); none: no MFU, and why
        pk, why = env.mfu_peak(
            rec.env.get("device_name", ""), plan.flops_by_math(split["conv"], split["matmul"]),
            rec.env.get("multiprocessors")) if device == "cuda" else (None, None)
        rec.mfu = achieved / pk if pk else None
        if why:
            rec.extra["mfu_note"] = why


def validity(bench) -> list[Reason]:
    """Every named check over every measured phase (analysis/noise.py). Steps that vary or
    stall in windows too short to judge are `too_short`, unless other processes competed."""
    rec, ld = bench.record, bench.settings.loader
    reasons: list[Reason] = []
    in_flight = batches_in_flight(ld.num_workers, ld.prefetch_factor)
    loads = [noise.WindowLoad(name, i, w.get("host_cpu_util_mean"), w.get("process_cpu_util_mean"),
                              w.get("samples") or 0, w.get("seconds") or 0.0,
                              rec.extra.get("cpu_demand_cores"))
             for name, p in rec.phases.items() for i, w in enumerate(p.windows)]
    competed = noise.load_checks(loads, int(rec.env.get("cpu_count") or os.cpu_count() or 1))
    for name, p in rec.phases.items():
        steps = rec.series.get(name, {}).get("step_times_s", [])
        window_s = None if competed else noise.window_seconds(p.windows)
        reasons += noise.step_checks(name, steps, p.step_time_cv, window_s)
        reasons += noise.window_checks(name, p.windows, p.warmup_settled, p.warmup_steps)
        reasons += noise.interval_checks(name, p.windows, p.images_per_sec_ci_coverage)
        reasons += noise.queue_checks(name, p.windows, in_flight)
        reasons += noise.gpu_checks(name, p.telemetry)
    return reasons + competed


def rule_figures(rec) -> dict:
    """What analysis.verdict.classify reads of a record, by parameter name (run and check alike)."""
    loader = rec.phases.get("loader")
    return {"loader": rec.loader_images_per_sec, "compute": rec.compute_images_per_sec,
            "e2e": rec.images_per_sec, "data_wait_fraction": rec.data_wait_fraction,
            "intervals": {name: rec.phase_figure(name)[1] for name in PHASE_NAMES},
            "device_data_s_per_image": (loader.extra.get("device_data_seconds_per_image")
                                        if loader else None),
            # every window's figure: the ratios are taken pairwise over interleaved rounds
            "windows": {n: [w.get("images_per_sec") for w in p.windows]
                        for n, p in rec.phases.items()}}


def summarize(bench, status: Status = Status.ok) -> None:
    rec, s, device = bench.record, bench.settings, bench.device
    figures(rec, device)
    rec.noise_reasons = reasons = validity(bench)
    rec.measurement_stable = not reasons if rec.phases else None
    competitors = _competitors(reasons)
    ld, ds = s.loader, s.dataset
    # by name: neighbouring fields share a type, and a positional list swaps them silently
    knobs = Knobs(device=device, num_workers=ld.num_workers, cpu_count=os.cpu_count() or 1,
                  pin_memory=ld.pin_memory, preload=ds.preload, augment_on=ds.augment_on,
                  precision=s.precision, channels_last=s.channels_last, compile=s.compile,
                  batch_size=ld.batch_size, dataset=ds.name,
                  memory_fraction=rec.peak_memory_fraction, ceiling=s.memory.ceiling,
                  memory_of=rec.memory_of, is_conv="vit" not in s.model.name,
                  oom=status is Status.oom)
    rule = rule_figures(rec)
    # the serial bound: the step plus the data side's device work on the training stream
    # (run/merge.py; an nvJPEG decode bounds e2e through the loader's host-side rate instead)
    if (device_data := rule["device_data_s_per_image"]) and rec.compute_images_per_sec:
        rec.extra["e2e_bound_images_per_sec"] = serial_rate(rec.compute_images_per_sec, device_data)

    def verdict():
        return judge(**rule, knobs=knobs, noise_reasons=reasons,
                     remedies=noise.remedies(reasons, competitors, rec), record=rec)

    v = verdict()
    if v.impossible:  # e2e above its own bound: a flawed measurement, judged as one
        e2e = rec.phases.get("e2e")
        short = e2e and not any(r.kind is Flaw.disturbed for r in reasons)
        reasons.append(noise.finding(v.impossible, IMPOSSIBLE,
                                     noise.window_seconds(e2e.windows) if short else None))
        rec.measurement_stable = False
        competitors = competitors or _competitors(reasons[-1:])  # who, as above
        v = verdict()
    rec.bottleneck, rec.reason, rec.advice = v.bottleneck, v.reason, v.advice
    rec.verdict_margin = v.margin
    if v.ratio is not None:
        rec.extra["verdict_ratio"] = v.ratio.value
        rec.extra["verdict_ratio_ci"] = [v.ratio.lo, v.ratio.hi]
    if v.leaning:
        rec.extra["verdict_leaning"] = v.leaning
    if v.overlap_loss is not None:  # the share of the narrower bound e2e loses to overlap
        rec.extra["overlap_loss"] = v.overlap_loss.value
        rec.extra["overlap_loss_ci"] = [v.overlap_loss.lo, v.overlap_loss.hi]
    if competitors:
        rec.extra["competing_processes"] = competitors


def _competitors(reasons: list[Reason]) -> list[str]:
    """The busiest processes outside this run, where a check found it disturbed."""
    if not any(r.kind is Flaw.disturbed for r in reasons):
        return []
    import psutil

    me = psutil.Process()
    try:
        own = {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        own = {me.pid}
    return noise.top_other_processes(own)
