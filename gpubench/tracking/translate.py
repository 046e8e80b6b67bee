"""A run record as MLflow 3.17's UI shows it best at 1440 px: params, metrics, tags, a run name,
a description, and the experiment gpubench creates for them. Pure: no MLflow, no I/O. The runs
table shows metrics and tags only once picked: an experiment comes with a saved view. The
description shows 100 px before "Show more" and loses an image's size: the verdict and figure come
first, then the picture. Charts group metrics by the prefix before `/`: only the figures runs are
sorted by (`images_per_sec`, `objective`) stay unprefixed."""

from __future__ import annotations

import json
import math
import re
import time

from gpubench.analysis import labels
from gpubench.analysis.select import knob_of, setup_text
from gpubench.config.knobs import SHORT
from gpubench.core.files import flatten
from gpubench.core.record import HEADLINE_ORDER, PHASE_NAMES, Bottleneck, RunRecord, Status
from gpubench.core.secrets import mask_secrets
from gpubench.core.stats import (
    CPU_SHARES,
    MIN_CPU_SPAN_S,
    finite_number,
    outward,
    round_at,
    supported_place,
    text_at,
)

# an MLflow run's status for each record status (over_ceiling measured fine; running: the
# process died before a final status)
RUN_STATUS = {Status.ok: "FINISHED", Status.over_ceiling: "FINISHED", Status.oom: "FAILED",
              Status.failed: "FAILED", Status.killed: "KILLED", Status.running: "KILLED",
              Status.refused: "FAILED"}

PICTURE = "run.png"  # the run's picture, written beside results.json
SOURCE = {"mlflow.source.name": "gpubench", "mlflow.source.type": "LOCAL"}

MAX_PARAM_VALUE, MAX_TAG_VALUE, MAX_KEY = 6000, 8000, 250  # MLflow's (mlflow.utils.validation)
# metric names with ( % @ are rejected by MLflow; keep names plain
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")

# per phase: the summary figures worth a chart (the rest stays in results.json)
PHASE_FIGURES = ("images_per_sec", "data_wait_fraction", "step_time_p50_s", "step_time_p95_s",
                 "step_time_cv", "warmup_seconds")
PHASE_TELEMETRY = ("gpu_util_mean", "power_mean_w", "host_cpu_util_mean", "peak_rss_bytes")
# the monitor's samples drawn over time: is the device busy, is the host the limit
TELEMETRY_SERIES = ("gpu_util", "mem_util", "gpu_mem_used", "power_w", "host_cpu", "procs_cpu",
                    "rss")
RECORD_FIGURES = {  # metric name: the RunRecord field
    "memory/peak_fraction": "peak_memory_fraction", "memory/peak_bytes": "peak_memory_bytes",
    **{f"memory/{k}": k for k in ("torch_peak_allocated_bytes", "torch_peak_reserved_bytes")},
    "memory/device_bytes": "device_memory_bytes",
    **{f"efficiency/{k}": k for k in ("mfu", "achieved_tflops", "flops_per_step",
                                      "energy_per_image_j", "gpu_util_mean", "power_mean_w")},
}
# MLflow 3.17.2's UI bundle (mlflow/server/js/build/static/js): a saved runs-table view is an
# experiment tag `mlflow.sharedViewState.<key>` = {name, createdAt, state} (chunk 3448), `state`
# the page's UI state as JSON (module 1395; a column named by its sort key), opened by
# `?viewStateShareKey=<key>`. GenAI or training view: the URL's `workflowType`, else the browser's
# last choice (module 31080: `mlflow.experimentKind` is not read there, but says what it holds).
VIEW = "gpubench"  # the saved view's key and name
VIEW_COLUMNS = ("metrics.`images_per_sec`", "tags.`verdict`")
NAME_COLUMN = "attributes.`Run Name`"
# px: a setup and its figure under a sweep's parent, the metric's whole name; so that at 1440 px
# the verdict stays in view with the UI's assistant panel open
VIEW_WIDTHS = {NAME_COLUMN: 320, "runDateAndNestInfo": 135, VIEW_COLUMNS[0]: 125}
UI_QUERY = "workflowType=machine_learning"  # the training view, whatever the browser chose last
# what the first line says: MLflow folds the description to about a line and a half at 1440 px
EXPERIMENT_NOTE = f"""**Views → {VIEW}**: images/sec and verdict as columns; a sweep is a parent \
run with a child per job. A run's name is its setup and images/sec \
(`resnet50-bs128-w8-amp_bf16 812img/s`, rounded to what its interval supports); its page starts \
with the verdict and the figure with its interval, then its picture."""


def experiment_tags(now_ms: int | None = None) -> dict[str, str]:
    """An experiment's description, kind and saved runs-table view (no Dataset, Source, Models)."""
    state = {"selectedColumns": list(VIEW_COLUMNS),
             "columnOrder": [NAME_COLUMN, "runDateAndNestInfo", "duration", *VIEW_COLUMNS],
             "columnWidths": VIEW_WIDTHS}
    view = {"name": VIEW, "createdAt": now_ms or int(time.time() * 1000),
            "state": json.dumps(state)}
    return {"mlflow.note.content": EXPERIMENT_NOTE,
            "mlflow.experimentKind": "custom_model_development",
            f"mlflow.sharedViewState.{VIEW}": json.dumps(view)}


def page(experiment_id: str, run_id: str | None = None) -> str:
    """The UI's route to a run's page, or to the runs table in gpubench's saved view."""
    if run_id:
        return f"#/experiments/{experiment_id}/runs/{run_id}?{UI_QUERY}"
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW}&{UI_QUERY}"


def tag_values(tags: dict) -> dict[str, str]:
    return {k: mask_secrets(str(v))[:MAX_TAG_VALUE] for k, v in tags.items()
            if v not in (None, "")}


def key(k: str) -> str:
    return _BAD_KEY_CHARS.sub("_", k)[:MAX_KEY]


def param_str(v) -> str:  # Hydra's own spelling: a value pastes back as an override
    return json.dumps(v) if v is None or isinstance(v, (bool, list, dict)) else str(v)


def run_params(run) -> dict[str, str]:
    """The knobs by plain name (config.knobs.SHORT: one column per knob), the device, then the rest
    of the config by dotted key; masked (a tracking URI or storage URL may carry a password)."""
    rec = run if isinstance(run, RunRecord) else RunRecord.from_dict(run)
    params = {k: knob_of(rec.knob, k) for k in SHORT}
    params["device"] = rec.env.get("device")
    named = {k for keys in SHORT.values() for k in keys}
    params |= {k: v for k, v in flatten(rec.config).items() if k not in named}
    return {key(k): mask_secrets(param_str(v))[:MAX_PARAM_VALUE] for k, v in params.items()}


def _number(v) -> float | None:
    return float(v) if isinstance(v, bool) else finite_number(v)


# throughputs are logged rounded to what their intervals support (812, not 812.3061);
# results.json keeps the raw figures
def shown_images_per_sec(rec: RunRecord) -> float | None:  # the `images_per_sec` metric
    return round_at(rec.images_per_sec, supported_place(rec.images_per_sec, rec.images_per_sec_ci))


def shown_objective(rec: RunRecord) -> float:
    """The objective as MLflow shows it: the throughput it is, rounded alike (0 stays 0)."""
    objective = rec.objective
    if objective and objective == rec.throughput:
        return round_at(objective, supported_place(objective, rec.throughput_interval))
    return objective


def run_metrics(rec: RunRecord, now_ms: int | None = None) -> list[tuple[str, float, int, int]]:
    """(name, value, step, timestamp_ms); per-step series under their phase, warm-up first."""
    now_ms = now_ms or int(time.time() * 1000)
    out: list[tuple[str, float, int, int]] = []

    def add(name, v, step=0, ts=now_ms):
        if (x := _number(v)) is not None:
            out.append((key(name), x, step, ts))

    add("images_per_sec", shown_images_per_sec(rec))
    if rec.status.final:
        add("objective", shown_objective(rec))
    add("verdict/margin", rec.verdict_margin)
    for name, field in RECORD_FIGURES.items():
        add(name, getattr(rec, field))
    add("data/skipped_samples", rec.skipped_samples)

    for phase, ph in rec.phases.items():
        ci = ph.images_per_sec_ci or []
        at = supported_place(ph.images_per_sec, ci)
        for k in PHASE_FIGURES:
            v = getattr(ph, k, None)
            add(f"{phase}/{k}", round_at(v, at) if k == "images_per_sec" else v)
        for end, x in zip(("low", "high"), outward(ci, at) if len(ci) == 2 else (), strict=False):
            add(f"{phase}/images_per_sec_ci_{end}", x)
        tel = {**ph.telemetry, **ph.memory}
        for k in PHASE_TELEMETRY:
            add(f"{phase}/{k}", tel.get(k))

    # telemetry sample times are a monotonic clock: keep their spacing, anchored at now
    times = [x["t"] for s in rec.series.values() for x in s.get("telemetry", []) if "t" in x]
    t0 = min(times) if times else 0.0
    for phase, s in rec.series.items():
        bs = getattr(rec.phases.get(phase), "batch_size", None)
        steps = [*s.get("warmup_step_times_s", []), *s.get("step_times_s", [])]
        for i, dt in enumerate(steps):
            add(f"{phase}/step_time_s", dt, i)
            if bs and dt and dt > 0:
                add(f"{phase}/step_images_per_sec", bs / dt, i)
        for i, sample in enumerate(s.get("telemetry", [])):
            ts = now_ms + int((sample.get("t", t0) - t0) * 1000)
            short = sample.get("dt", MIN_CPU_SPAN_S) < MIN_CPU_SPAN_S  # ticks, not a rate
            for k in TELEMETRY_SERIES:
                add(f"{phase}/telemetry/{k}", None if short and k in CPU_SHARES else sample.get(k),
                    i, ts)
    return out


def run_tags(rec: RunRecord, overrides: str | None = None,
             user: str | None = None) -> dict[str, str]:
    env, stable = rec.env, rec.measurement_stable
    return tag_values({
        # first: the run page lists tags in this order. One word (`data`, `compute`, ...), or
        # the status of a run that measured nothing: a column of the saved view
        "verdict": (str(rec.bottleneck or Bottleneck.unknown) if rec.status.measured
                    else rec.status.value),
        "run_uid": rec.run_uid, "status": rec.status.value, "bottleneck": rec.bottleneck,
        "measurement_stable": None if stable is None else str(stable).lower(), "error": rec.error,
        "device_name": env.get("device_name"), "device_kind": env.get("device"),
        **{k: env.get(k) for k in ("driver", "cuda", "cudnn", "torch", "torchvision", "python",
                                   "cpu_count", "host", "platform")},
        "gpubench_version": env.get("gpubench"), "git_commit": env.get("git_commit"),
        "overrides": overrides,
        "study": rec.extra.get("study"),  # a sweep job's Optuna study, across all its workers
        # the sweeper's rung (screen, full, ...): a report from MLflow tells short from full
        "rung": rec.extra.get("rung"),
        **SOURCE, "mlflow.source.git.commit": env.get("git_commit"), "mlflow.user": user,
    })


def run_name(rec: RunRecord, name: str | None = None) -> str:
    """`tracking.run_name`, else the setup and the throughput (`resnet50-bs128 812img/s`),
    `over-ceiling` above the memory ceiling, or the status of a run that measured nothing."""
    if name:
        return mask_secrets(name)
    parts = [setup_text(rec, compact=True)]
    ips = rec.images_per_sec
    if not rec.status.measured:
        parts.append(rec.status.value)
    elif _number(ips) and ips > 0:
        # to its interval's place, no finer than 3 figures or whole images (a name, not a figure:
        # two narrow windows supported `1808.23img/s`)
        coarsest = min(0, math.floor(math.log10(ips)) - 2)
        place = supported_place(ips, rec.images_per_sec_ci)
        parts.append(f"{text_at(ips, coarsest if place is None else max(place, coarsest))}img/s")
    if rec.status is Status.over_ceiling:
        parts.append("over-ceiling")
    return " ".join(parts)


def _figure(v, ci) -> str:
    """`812 [772-853]`: the figure and its interval to the place the interval supports."""
    at = supported_place(v, ci)
    if at is None or not ci or len(ci) != 2:
        return text_at(v, None)
    lo, hi = outward(ci, at)
    return f"{text_at(v, at)} [{text_at(lo, at)}-{text_at(hi, at)}]"


def headline(rec: RunRecord) -> str:
    """`**compute-bound** · 812 [772-853] img/s end-to-end · overlap costs 0%-18%`."""
    word = labels.verdict_words(rec.bottleneck).tag
    lean = rec.extra.get("verdict_leaning")  # what an inconclusive verdict leans to
    if rec.bottleneck is Bottleneck.inconclusive and lean in labels.VERDICT_WORDS:
        word += f" (leans to {Bottleneck(lean)})"
    if rec.status is Status.over_ceiling:
        word += ", over ceiling"
    parts = [f"**{word}**"]
    for phase in HEADLINE_ORDER:
        v, ci = rec.phase_figure(phase)
        if _number(v):
            words = labels.PHASE_WORDS.get(phase)
            parts.append(f"{_figure(v, ci)} img/s {words.short if words else phase}")
            break
    loss, loss_ci = rec.extra.get("overlap_loss"), rec.extra.get("overlap_loss_ci")
    if _number(loss) is not None:  # 0 is a figure too: its interval says what it may be
        lo, hi = loss_ci if isinstance(loss_ci, list) and len(loss_ci) == 2 else (loss, loss)
        span = f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}-{hi:.0%}"
        parts.append(f"overlap costs {span}")
    if rec.measurement_stable is False:
        parts.append("measurement not stable")
    return " · ".join(parts)


def describe(rec: RunRecord, run_id: str | None = None, picture: bool = False) -> str:
    """The run's description (Markdown): the headline, the picture (by the server's relative
    `get-artifact` route: it works behind a path prefix), the reason, the phases, the advice."""
    lines = []
    if rec.status.measured:
        lines.append(headline(rec))
        if picture and run_id:
            lines += ["", f"![run picture](get-artifact?path={PICTURE}&run_uuid={run_id})"]
        if rec.reason:
            lines += ["", rec.reason]
        if rec.measurement_stable is False:
            why = "; ".join(r.text for r in rec.noise_reasons) or "noisy"
            lines.append(f"\nmeasurement not stable: {why}")
        rows = ["", f"| phase | images/sec | {rec.interval_label} | data wait |",
                "|---|---|---|---|"]
        for name, ph in ((n, rec.phases[n]) for n in PHASE_NAMES if n in rec.phases):
            ci = ph.images_per_sec_ci or []
            at = supported_place(ph.images_per_sec, ci)
            value = "-" if _number(ph.images_per_sec) is None else text_at(ph.images_per_sec, at)
            interval = ("{} - {}".format(*(text_at(x, at) for x in outward(ci, at)))
                        if len(ci) == 2 and _number(ci[0]) and _number(ci[1]) else "-")
            wait = "-" if _number(ph.data_wait_fraction) is None else f"{ph.data_wait_fraction:.0%}"
            rows.append(f"| {name} | {value} | {interval} | {wait} |")
        if len(rows) > 3:
            lines += rows
    else:
        lines.append(f"**{rec.status.value}**: {rec.error or ''}".rstrip(": "))
    if rec.advice:
        lines += ["", *(f"{i}. {a}" for i, a in enumerate(rec.advice, 1))]
    return mask_secrets("\n".join(lines))[:MAX_TAG_VALUE]
