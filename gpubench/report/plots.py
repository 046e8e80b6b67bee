"""PNG plots of a sweep report (matplotlib's Agg backend: no display needed).

Each plot is split in two: a pure `*_data(rows, ...)` function that decides what is drawn (the
points, the bounds, the axis labels and ticks; tested on constructed rows) and a `_draw_*`
function that only draws it. The rules the data functions keep:

- a throughput plot draws, beside the headline figure, the loader-only and compute-only
  bounds of the same runs, so the picture shows which pipe limits each point;
- the y label names the phase the throughput came from (a loader-only sweep says loader);
- a plot is made only when its knob varied (two or more values);
- short screens and max-batch probes are drawn apart (hollow, grey) from full measurements,
  and never enter a curve, a front or the recommendation;
- the legend sits outside the axes and the star under the points, with headroom, so neither
  hides or clips data.

Rows are the report's rows (`gpubench.analysis.recommend.Row`); their run record is read through
`row.record` when present, else rebuilt from the row's results.json dict.

Longer than most modules (about 420 lines) on purpose: each plot's data function and its
drawing are kept in one file, so what a picture shows and how it is drawn read together.

Why one module of this size: each plot is a pure data function beside the drawing that uses it,
so a test of the data and the picture it draws are read together.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from gpubench.analysis.select import KNOBS
from gpubench.core.record import RunRecord

log = logging.getLogger("gpubench")

BOUND_PHASES = ("loader", "compute")
SHORT_LABEL = "short screen / probe (not ranked)"
# headroom above the highest point: the star and the top markers stay inside the axes
HEADROOM = 1.15
# values spanning more than this factor get a log y axis
LOG_SPAN = 20.0


# --------------------------------------------------------------------------- reading rows


def _record(row) -> RunRecord:
    rec = getattr(row, "record", None)
    if isinstance(rec, RunRecord):
        return rec
    return RunRecord.from_dict(getattr(row, "data", None) or {}, rung=getattr(row, "rung", None))


def knob(row, name: str) -> Any:
    """A knob by its short name (`batch_size`, gpubench.analysis.select.KNOBS), whether the
    row's `knob()` takes short names or config keys (`loader.batch_size`)."""
    for key in (name, *KNOBS[name]):
        try:
            v = row.knob(key)
        except KeyError:  # a row that knows only the other spelling
            continue
        # a config section is no knob value: by config key "precision" is the whole
        # {name: ...} node, its value is precision.name
        if v is not None and not isinstance(v, (dict, list)):
            return v
    return None


def _status(row) -> str:
    st = getattr(row, "status", None)
    return str(st if st is not None else _record(row).status)


def _peak(row) -> float | None:
    peak = getattr(row, "peak", None)
    return peak if peak is not None else _record(row).peak_memory_fraction


def _ceiling(rows) -> float:
    def one(r):
        c = getattr(r, "ceiling", None)
        return float(c if c is not None else _record(r).memory_ceiling)

    return Counter(one(r) for r in rows).most_common(1)[0][0]


def phase_ips(row, phase: str) -> float | None:
    """A row's images/sec in one phase (None when that phase did not measure)."""
    rec = _record(row)
    ph = rec.phases.get(phase)
    v = ph.images_per_sec if ph is not None else None
    if v is None:
        v = getattr(rec, {"loader": "loader_images_per_sec", "compute": "compute_images_per_sec",
                          "e2e": "images_per_sec"}[phase])
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def headline_phase(rows) -> str:
    """The phase the rows' throughput is (e2e, else compute, else loader, as RunRecord's
    `throughput`), by majority over rows that measured one; e2e when none says."""
    votes = Counter()
    for r in rows:
        for phase in ("e2e", "compute", "loader"):
            if phase_ips(r, phase) is not None:
                votes[phase] += 1
                break
    return votes.most_common(1)[0][0] if votes else "e2e"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _precision(r) -> str:
    return str(knob(r, "precision") or "?")


# --------------------------------------------------------------------------- the data


def curve_data(rows, name: str, xlabel: str, rec=None, log2: bool = False) -> dict | None:
    """Best feasible throughput at each value of knob `name`, one line per precision, and the
    loader/compute bounds of the very runs that make each point. Full-length measurements
    only (as the recommendation); short ones come apart in `short`. None when the knob did
    not vary over full feasible runs."""
    ok = [r for r in rows if r.feasible and r.full and knob(r, name) is not None]
    if len({knob(r, name) for r in ok}) < 2:
        return None
    phase = headline_phase(rows)
    lines = []
    for prec, rs in sorted(_group(ok, _precision).items()):
        best: dict = {}
        for r in rs:
            x = knob(r, name)
            if x not in best or r.throughput > best[x].throughput:
                best[x] = r
        xs = sorted(best)
        bounds = {p: [phase_ips(best[x], p) for x in xs] for p in BOUND_PHASES if p != phase}
        lines.append({"precision": prec, "xs": xs, "ys": [best[x].throughput for x in xs],
                      "bounds": {p: v for p, v in bounds.items() if any(y is not None for y in v)}})
    short = [r for r in rows if not r.full and r.throughput > 0 and knob(r, name) is not None]
    star = None
    if rec is not None and knob(rec.chosen, name) is not None:
        star = {"x": knob(rec.chosen, name), "y": rec.chosen.throughput}
    xs_all = sorted({knob(r, name) for r in ok} | {knob(r, name) for r in short})
    ys_all = [y for ln in lines for y in ln["ys"] + [b for v in ln["bounds"].values() for b in v]
              if y is not None] + [r.throughput for r in short]
    every = ys_all + ([star["y"]] if star else [])
    # a loader 20x faster than the training loop would flatten the curve that matters onto
    # the axis: a log axis keeps both readable
    log_y = min(every) > 0 and max(every) > LOG_SPAN * min(every)
    return {
        "lines": lines,
        "short": {"xs": [knob(r, name) for r in short], "ys": [r.throughput for r in short]},
        "star": star,
        "phase": phase,
        "xlabel": xlabel,
        "ylabel": f"{phase} images/sec (best feasible run per {xlabel})"
                  + (", log scale" if log_y else ""),
        "xticks": xs_all,
        "integer_x": all(_is_int(x) for x in xs_all),
        "log2": log2,
        "log_y": log_y,
        "ymin": min(every) / 1.5 if log_y else 0.0,
        "ymax": (1.6 if log_y else HEADROOM) * max(every),
    }


def memory_data(rows) -> dict | None:
    """Peak memory against batch size; None unless the batch size varied."""
    pts = [r for r in rows if knob(r, "batch_size") is not None
           and (_peak(r) is not None or _status(r) == "oom")]
    if len({knob(r, "batch_size") for r in pts}) < 2:
        return None
    fine = [r for r in pts if _status(r) != "oom" and _peak(r) is not None]
    groups = {}
    for prec, rs in sorted(_group([r for r in fine if r.full], _precision).items()):
        groups[prec] = {"xs": [knob(r, "batch_size") for r in rs],
                        "ys": [100 * _peak(r) for r in rs]}
    short = [r for r in fine if not r.full]
    oom = [r for r in pts if _status(r) == "oom"]
    return {
        "groups": groups,
        "short": {"xs": [knob(r, "batch_size") for r in short], "ys": [100 * _peak(r) for r in short]},
        # an OOM's peak is the whole device
        "oom": {"xs": [knob(r, "batch_size") for r in oom], "ys": [100.0] * len(oom)},
        "ceiling": 100 * _ceiling(rows),
        "xticks": sorted({knob(r, "batch_size") for r in pts}),
    }


def pareto_data(rows, rec=None) -> dict | None:
    """Throughput against peak memory for full measurements; the front is what no other
    configuration beats on both. None with fewer than two full measured points."""
    pts = [r for r in rows if r.throughput > 0 and _peak(r) is not None]
    full = [r for r in pts if r.full]
    if len(full) < 2:
        return None
    front, top = [], -1.0
    for r in sorted(full, key=lambda r: (_peak(r), -r.throughput)):
        if r.throughput > top:
            front.append(r)
            top = r.throughput
    short = [r for r in pts if not r.full]

    def xy(rs):
        return {"xs": [100 * _peak(r) for r in rs], "ys": [r.throughput for r in rs]}

    star = None
    if rec is not None and _peak(rec.chosen) is not None:
        star = {"x": 100 * _peak(rec.chosen), "y": rec.chosen.throughput}
    phase = headline_phase(rows)
    return {
        "feasible": xy([r for r in full if r.feasible]),
        "infeasible": xy([r for r in full if not r.feasible]),
        "short": xy(short),
        "front": xy(front),
        "star": star,
        "ceiling": 100 * _ceiling(rows),
        "ylabel": f"{phase} images/sec",
        "ymax": HEADROOM * max(r.throughput for r in pts),
    }


def _group(rows, key) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


# --------------------------------------------------------------------------- drawing


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure():
    # wide enough for a legend outside the axes, on the right, where it covers nothing
    return _plt().subplots(figsize=(8.4, 4.4))


def _legend(ax, **kw) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # keeps the outside legend in the file
    _plt().close(fig)
    return path


def _x_axis(ax, xticks, log2: bool, integer: bool) -> None:
    """Batch sizes on a log2 axis labelled with the sizes themselves (not 2^k); integer knobs
    get ticks at their values only (no 0.5 workers)."""
    if log2:
        ax.set_xscale("log", base=2)
        ticks = [x for x in xticks if x]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        lo, hi = min(ticks), max(ticks)
        ax.set_xlim(lo / 1.4, hi * 1.4)  # the end points (and a star there) are not clipped
    elif integer:
        ax.set_xticks(list(xticks), [str(t) for t in xticks])
        span = max(xticks) - min(xticks) or 1
        ax.set_xlim(min(xticks) - 0.08 * span, max(xticks) + 0.08 * span)


def _star(ax, star) -> None:
    if star is None:
        return
    # under the points (zorder 1 < 3) and bigger than them: it rings a point, never hides it
    ax.plot([star["x"]], [star["y"]], marker="*", markersize=20, color="gold",
            markeredgecolor="black", linestyle="none", zorder=1, clip_on=False,
            label="recommended")


def _draw_curve(d: dict, out: Path) -> Path:
    fig, ax = _figure()
    colors = _plt().rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"loader": (":", "v"), "compute": ("--", "^")}
    for i, ln in enumerate(d["lines"]):
        c = colors[i % len(colors)]
        ax.plot(ln["xs"], ln["ys"], marker="o", color=c, zorder=4,  # over its bounds
                label=f"{d['phase']} ({ln['precision']})")
        for p, ys in ln["bounds"].items():
            pts = [(x, y) for x, y in zip(ln["xs"], ys, strict=True) if y is not None]
            ls, m = styles[p]
            ax.plot([x for x, _ in pts], [y for _, y in pts], linestyle=ls, marker=m, color=c,
                    alpha=0.75, zorder=3, label=f"{p} only, same runs ({ln['precision']})")
    if d["short"]["xs"]:
        ax.scatter(d["short"]["xs"], d["short"]["ys"], facecolors="none", edgecolors="grey",
                   zorder=2, label=SHORT_LABEL)
    _star(ax, d["star"])
    _x_axis(ax, d["xticks"], d["log2"], d["integer_x"])
    ax.set_xlabel(d["xlabel"])
    ax.set_ylabel(d["ylabel"])
    if d["log_y"]:
        ax.set_yscale("log")
    ax.set_ylim(d["ymin"], d["ymax"])
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, out)


def _draw_memory(d: dict, out: Path) -> Path:
    fig, ax = _figure()
    for prec, g in d["groups"].items():
        ax.scatter(g["xs"], g["ys"], zorder=3, label=prec)
    if d["short"]["xs"]:
        ax.scatter(d["short"]["xs"], d["short"]["ys"], facecolors="none", edgecolors="grey",
                   zorder=2, label=SHORT_LABEL)
    if d["oom"]["xs"]:
        ax.scatter(d["oom"]["xs"], d["oom"]["ys"], marker="x", color="red", s=60, zorder=3,
                   clip_on=False, label="out of memory")
    ax.axhline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    _x_axis(ax, d["xticks"], log2=True, integer=True)
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory, % of the device")
    ax.set_ylim(0, 108)  # room above 100% for the OOM crosses
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, out)


def _draw_pareto(d: dict, out: Path) -> Path:
    fig, ax = _figure()
    ax.scatter(d["feasible"]["xs"], d["feasible"]["ys"], zorder=3, label="feasible")
    if d["infeasible"]["xs"]:
        ax.scatter(d["infeasible"]["xs"], d["infeasible"]["ys"], color="grey", zorder=3,
                   label="over the ceiling / not ok")
    if d["short"]["xs"]:
        ax.scatter(d["short"]["xs"], d["short"]["ys"], facecolors="none", edgecolors="grey",
                   zorder=2, label=SHORT_LABEL)
    ax.step(d["front"]["xs"], d["front"]["ys"], where="post", color="black", alpha=0.6,
            zorder=2, label="Pareto front (full runs)")
    ax.axvline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    _star(ax, d["star"])
    ax.set_xlabel("peak memory, % of the device")
    ax.set_ylabel(d["ylabel"])
    ax.set_ylim(0, d["ymax"])
    ax.margins(x=0.08)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, out)


def importance(study, out: Path, min_trials: int = 4, phase: str = "e2e") -> Path | None:
    """Optuna's parameter importance; needs a few completed trials with varied parameters."""
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varied = {k for k in (done[0].params if done else {})
              if len({repr(t.params.get(k)) for t in done}) > 1}
    if len(done) < min_trials or not varied:
        log.info("parameter importance skipped: %d completed trials, %d varied parameters",
                 len(done), len(varied))
        return None
    try:
        imp = optuna.importance.get_param_importances(study)
    except ImportError:  # fANOVA's forest needs scikit-learn; PED-ANOVA needs only numpy
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as e:
        log.info("parameter importance skipped: %s", e)
        return None
    if not imp:
        return None
    plt = _plt()
    names = list(imp)[::-1]
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(names) + 1.5))
    ax.barh(names, [imp[n] for n in names])
    ax.set_xlabel(f"importance for {phase} images/sec (Optuna)")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, out)


def plot_all(rows, out_dir: Path, rec, study=None) -> list[Path]:
    made = []
    for name, png, xlabel, log2 in (
        ("batch_size", "throughput_vs_batch.png", "batch size", True),
        ("num_workers", "throughput_vs_workers.png", "loader workers", False),
    ):
        d = curve_data(rows, name, xlabel, rec, log2)
        if d is not None:
            made.append(_draw_curve(d, out_dir / png))
    d = memory_data(rows)
    if d is not None:
        made.append(_draw_memory(d, out_dir / "memory_vs_batch.png"))
    d = pareto_data(rows, rec)
    if d is not None:
        made.append(_draw_pareto(d, out_dir / "pareto.png"))
    if study is not None:
        made.append(importance(study, out_dir / "importance.png", phase=headline_phase(rows)))
    return [p for p in made if p is not None]
