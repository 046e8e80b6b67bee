"""`run.png` beside results.json: each pipe's throughput and the bound e2e can reach (top), each
phase's step times with the warm-up shaded (bottom, reference article 003)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from gpubench.analysis.labels import PHASE_WORDS, verdict_words
from gpubench.analysis.select import setup_text
from gpubench.core.record import PHASE_NAMES, Bottleneck, RunRecord, Status, interval_label_of
from gpubench.core.stats import CONFIDENCE, Est, count, finite_number, positive
from gpubench.report.plot_rules import phase_est
from gpubench.report.plots import plain_log, pyplot, save

PICTURE_FILE = "run.png"
# one colour per pipe, in the bars and the traces: the eye pairs them
PHASE_COLORS = {"loader": "tab:blue", "compute": "tab:orange", "e2e": "tab:green"}
# 7.5 in at 92 dpi, about 690 px: MLflow's run page at 1440 px fits a picture beside "About this
# run" only up to about 700 px (it takes the picture's width as the description's least)
DPI = 92
LOG_SPAN = 3.0  # the top axis turns logarithmic past this factor
# outside the axes: a legend must not cover the points it explains
OUTSIDE = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)


def _wrap(text: str, lines: int = 2, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width, max_lines=lines, placeholder=" ..."))


def _title(record: RunRecord) -> str:
    verdict = record.bottleneck or Bottleneck.unknown
    head = f"Which pipe limits training? {verdict_words(verdict).sentence}"
    lean = record.extra.get("verdict_leaning")
    if verdict is Bottleneck.inconclusive and lean:
        head += f"; the figures lean to {lean}"
    if record.status is not Status.ok:
        head = f"[{record.status}] " + head
    tail = ""
    if record.measurement_stable is False:
        n = len(record.noise_reasons)
        tail = (f"measurement flagged, not to be trusted: {count(n, 'reason')}, "
                "listed below" if n else "measurement flagged: the runs disagree")
    elif verdict in (Bottleneck.data, Bottleneck.compute, Bottleneck.overlap) and record.reason:
        tail = _wrap(record.reason)
    device = str(record.env.get("device_name") or record.env.get("device") or "")
    setup = ", ".join(p for p in (device, setup_text(record)) if p)
    return "\n".join(x for x in (head, tail, setup) if x)


def run_picture_data(record: RunRecord) -> dict:
    """`bars` (per measured phase, `ci` None for a single window), the e2e `bound`, the `title`,
    `traces` (step times in ms, None where the clock could not tell)."""
    bars = [{"phase": name, "label": PHASE_WORDS[name].short, "images_per_sec": e.value,
             "ci": None if e.exact else [e.lo, e.hi],
             "coverage": None if e.exact else record.phase_coverage(name) or CONFIDENCE}
            for name in PHASE_NAMES if (e := phase_est(record, name)) is not None]
    # each whisker's coverage: one for all in the axis label, else each under its pipe's name
    covers = {round(100 * b["coverage"]) for b in bars if b["coverage"] is not None}
    bound_v = finite_number(record.extra.get("e2e_bound_images_per_sec"))
    traces = {}
    for name in PHASE_NAMES:
        s = record.series.get(name) or {}
        warm, steps = ([1000.0 * t if positive(t) else None for t in (s.get(k) or [])]
                       for k in ("warmup_step_times_s", "step_times_s"))
        if warm or steps:
            traces[name] = {"warmup_ms": warm, "steps_ms": steps}
    every = [t for tr in traces.values() for t in tr["warmup_ms"] + tr["steps_ms"] if t]
    span = (min(every), max(every)) if every else None
    ends = [v for b in bars for v in (b["ci"] or [b["images_per_sec"]]) if v > 0]
    flagged = record.measurement_stable is False
    return {"bars": bars, "title": _title(record), "traces": traces,
            "bound": None if bound_v is None else {"images_per_sec": bound_v},
            # a first step that compiles or autotunes can be 100x the rest: a log axis
            "trace_log_y": bool(every) and span[1] > 20 * span[0], "trace_span": span,
            "intervals": any(b["ci"] for b in bars),
            "interval_label": interval_label_of(b["coverage"] for b in bars if b["ci"]),
            "per_phase": len(covers) > 1,
            # pipes over LOG_SPAN apart on a linear axis leave the slower ones as slivers
            "log_x": bool(ends) and max(ends) > LOG_SPAN * min(ends), "flagged": flagged,
            "reasons": [_wrap(f"- {r.text}", 2, 110) for r in record.noise_reasons]
            if flagged else []}


def _figure(bar: dict) -> str:
    """`12.3 [12.1-12.4]`: one precision, so the interval never reads narrower (`12 [12-12]`)."""
    v = bar["images_per_sec"]
    spec = ",.0f" if abs(v) >= 100 else ",.1f"
    return format(Est(v, *bar["ci"]) if bar["ci"] else Est(v, v, v), spec)


def plot_run(record: RunRecord, out: Path) -> Path:
    """Into `out` (a folder: `out/run.png`, or a .png path)."""
    out = Path(out)
    path = out if out.suffix == ".png" else out / PICTURE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    d = run_picture_data(record)
    two = bool(d["traces"])
    fig, axes = pyplot().subplots(2 if two else 1, 1, figsize=(7.5, 7.6 if two else 4.4),
                                  squeeze=False, height_ratios=[1.0, 1.3] if two else None)
    _draw_pipes(axes[0][0], d)
    if two:
        _draw_traces(axes[1][0], d)
    fig.suptitle(d["title"], fontsize=10, ha="center")
    if d["reasons"]:  # under the picture, each reason whole: the title only counts them
        fig.text(0.01, 0.0, "why the measurement is flagged:\n" + "\n".join(d["reasons"]),
                 fontsize=7.5, va="top", ha="left", color="tab:red")
    return save(fig, path, DPI)  # the layout leaves the figure's text out: it hangs below


def _draw_pipes(ax, d: dict) -> None:
    bars = d["bars"]
    if not bars:
        ax.text(0.5, 0.5, "no phase measured a throughput", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    ys = list(range(len(bars)))[::-1]  # pipe order top to bottom: loader, compute, e2e
    for y, b in zip(ys, bars, strict=True):
        color, v = PHASE_COLORS[b["phase"]], b["images_per_sec"]
        # a single-window phase: no whisker rather than a fake one (an interval holds its
        # figure, core.stats.holding: no negative length)
        if b["ci"]:
            ax.errorbar([v], [y], xerr=[[v - b["ci"][0]], [b["ci"][1] - v]],
                        color=color, capsize=6, elinewidth=2, zorder=2)
        ax.plot([v], [y], marker="o", markersize=11, color=color, zorder=3,
                markerfacecolor="white" if d["flagged"] else color, markeredgewidth=2)
    # each figure under its pipe's name: beside the point it would run into the legend
    ax.set_yticks(ys, [f"{b['label']}\n{_figure(b)}" + (
        f"\n{interval_label_of([b['coverage']])}" if b["ci"] and d["per_phase"] else "")
        for b in bars], fontsize=9)
    ends = [x for b in bars for x in (b["ci"] or [b["images_per_sec"]])]
    ends += [d["bound"]["images_per_sec"]] if d["bound"] else []
    lo, hi = min(ends), max(ends)
    if d["bound"]:
        ax.axvline(d["bound"]["images_per_sec"], color="black", linestyle="--", linewidth=1.2,
                   label=f"combined bound\n(what e2e can reach)\n"
                         f"{d['bound']['images_per_sec']:,.1f} img/s")
        ax.legend(**OUTSIDE)
    if d["log_x"]:
        plain_log(ax, "x", lo, hi)
        ax.set_xlim(lo / 1.6, hi * 1.6)
    else:
        ax.set_xlim(0, 1.15 * hi)
    ax.set_ylim(-0.6, len(bars) - 0.4)
    what = (f"whiskers: {d['interval_label']} over repeated windows"
            + (", each pipe's under its name" if d["per_phase"] else "") if d["intervals"]
            else "one window per phase: no interval")
    ax.set_xlabel(f"images/sec ({what}" + ("; log scale" if d["log_x"] else "") + ")")
    ax.grid(alpha=0.3, axis="x")
    if d["flagged"]:
        ax.text(0.99, 0.02, "flagged: hollow points, not to be trusted", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="tab:red")


def _draw_traces(ax, d: dict) -> None:
    for name, t in d["traces"].items():
        w, s, color = t["warmup_ms"], t["steps_ms"], PHASE_COLORS[name]
        ax.plot(range(len(w), len(w) + len(s)), s, color=color, linewidth=1.0, marker=".",
                markersize=3, label=PHASE_WORDS[name].short)
        if w:  # each phase's own warm-up (they settle after different step counts), faded,
            # joined to its first measured step, its end a dotted line in its colour
            ax.plot(range(len(w) + bool(s)), [*w, *s[:1]], color=color, alpha=0.4,
                    linewidth=1.0, linestyle=":", marker=".", markersize=3)
            ax.axvline(len(w) - 0.5, color=color, linestyle=":", linewidth=0.8, alpha=0.7)
    if any(t["warmup_ms"] for t in d["traces"].values()):
        ax.plot([], [], color="grey", alpha=0.4, linestyle=":", marker=".",
                label="warm-up (faded; dotted line: its end)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("step (warm-up first, then the measured steps)")
    if d["trace_log_y"]:
        plain_log(ax, "y", *d["trace_span"])
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel("step time, ms" + (" (log scale)" if d["trace_log_y"] else ""))
    ax.grid(alpha=0.3)
    ax.set_title("step times: steady after the warm-up? (spikes: a stall, a busy host)", fontsize=9)
    ax.legend(**OUTSIDE)
