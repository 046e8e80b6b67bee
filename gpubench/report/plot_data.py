"""What the sweep report's pictures show, as plain data (gpubench.report.plots draws it).

Each function takes the report's rows (`gpubench.analysis.recommend.Row`, or any row with a
`record`, `knob()`, `throughput`, `feasible` and `full`) and decides the points, whiskers,
lines, labels and axis ranges; the tests check these on constructed rows. The rules (each a
function of gpubench.report.plot_rules where it is more than a line here):

- a throughput point carries its 95% interval as a whisker: the row's (`Row.interval`: the
  confirm step's when it ran, else the run's own over its windows), and each loader/compute
  bound its phase's interval over that phase's windows;
- a line joins only runs that differ in the plotted knob alone: runs are grouped by every
  other knob that varied (whatever the report's `varying` shows, and measured knobs such as
  bench.cudnn_benchmark), one line per group, labelled by what the group holds fixed; the
  loader/compute bounds are drawn for one group (the recommended run's), so each bound sits
  beside the very runs it limits;
- a run that flagged itself (noise_reasons: disturbed, queue-timed, cut short, too few windows;
  or a confirm step that disagreed) is drawn apart, hollow, never joined into a line nor drawn
  as a bound, and does not set the axis range (one read 17,945 img/s against ~1,500 for the
  rest): past the top it is drawn at the edge with its figure written beside it; when every
  run flagged itself the title says there is no line (no front) and why;
- short screens and max-batch probes are apart too (hollow grey), never on a curve or front;
- a plot is made only when its knob varied (two or more values);
- loader-only runs plotted against their workers carry their setup's compute bound (the
  report's workers answer, gpubench.report.loader_answer) as a band across the plot: its
  interval, its figure, and the line a loader's low end must clear (the margin above it);
- on a CPU the memory figure is the summed RSS of the main process and its loader workers
  (pages they share count once per process: an upper bound), against host RAM, and says so;
  a memory ceiling far right of every run is named under the Pareto plot, not drawn;
- parameter importance needs `MIN_IMPORTANCE_TRIALS` complete trials and two knobs, and leaves
  out knobs that cannot act on the device every run used (on a CPU: pin_memory,
  cudnn.benchmark, and precisions that differ only in CUDA's TF32 flags).
"""

from __future__ import annotations

import textwrap

from gpubench.core.record import Status, interval_label_of
from gpubench.core.stats import TOLERANCE
from gpubench.report.plot_rules import (
    BOUND_PHASES,
    FRONT_LABEL,
    ceiling_of,
    flag_reasons,
    flagged_label,
    group_by,
    headline_phase,
    interval,
    is_int,
    knob,
    line_groups,
    memory_axis,
    peak_of,
    phase_interval,
    phase_ips,
    precision_of,
    record_of,
    status_of,
)

PARETO_QUESTION = "How much peak memory does more speed cost?"
# headroom above the highest point: the star and the top markers stay inside the axes
HEADROOM = 1.15
# the Pareto plot draws the memory ceiling when it lies within this factor of the largest peak
CEILING_VIEW = 2.5
# values spanning more than this factor get a log y axis
LOG_SPAN = 20.0


# --------------------------------------------------------------------------- the data


def _pt(row, x, chosen=None) -> dict:
    lo, hi = interval(row)
    # `run`: the ranking's run column, written beside a lone point so it can be looked up
    return {"x": x, "y": row.throughput, "lo": lo, "hi": hi, "run": getattr(row, "label", None),
            "chosen": row is chosen}


def _basis(points: list[dict], flagged: list[dict], star: dict | None) -> list[dict]:
    """The points that set the y range: all but the flagged ones (a queue-timed loader run
    read 10x the rest), and the star; the flagged ones only when nothing else was measured."""
    return (points or flagged) + ([{"y": star["y"], "lo": star["y"], "hi": star["y"]}]
                                  if star else [])


def curve_data(rows, name: str, xlabel: str, rec=None, log2: bool = False,
               band=None) -> dict | None:
    """Throughput against knob `name`: lines of runs that differ in it alone, each point with
    its interval, the loader/compute bounds of the first line's runs; flagged runs, other
    groups' lone runs and short ones as separate points. Full-length feasible measurements
    only on lines (as the recommendation). None when the knob did not vary over them.
    `band`: a row -> the compute bound drawn across the plot (y, lo, hi, threshold, margin,
    label), or None: the first line's runs', else the flagged runs'."""
    full = [r for r in rows if r.feasible and r.full and knob(r, name) is not None]
    if len({knob(r, name) for r in full}) < 2:
        return None
    phase = headline_phase(rows)
    good = [r for r in full if not flag_reasons(r)]
    flagged = [r for r in full if flag_reasons(r)]
    chosen = rec.chosen if rec is not None else None
    groups, rest = line_groups(good, name, chosen) if good else ([], [])
    lines = []
    for i, (label, rs) in enumerate(groups):
        bounds = {}
        for p in BOUND_PHASES:
            # the bounds of one group only: each bound must sit beside the runs it limits
            if p == phase or i > 0:
                continue
            pts = [{"x": knob(r, name), "y": phase_ips(r, p), "lo": iv[0], "hi": iv[1]}
                   for r in rs if (iv := phase_interval(r, p)) is not None]
            if pts:
                bounds[p] = pts
        lines.append({"label": label, "points": [_pt(r, knob(r, name)) for r in rs],
                      "bounds": bounds})
    short = [r for r in rows if not r.full and r.throughput > 0 and knob(r, name) is not None]
    star = None
    if chosen is not None and knob(chosen, name) is not None:
        star = {"x": knob(chosen, name), "y": chosen.throughput}
    if star is not None:  # a point apart is drawn moved aside: its star is drawn with it
        star["lone"] = any(r is chosen for r in rest + flagged)
        star["flagged"] = any(r is chosen for r in flagged)
    d = {
        "lines": lines,
        "rest": [_pt(r, knob(r, name), chosen) for r in rest],
        "short": [_pt(r, knob(r, name)) for r in short],
        "flagged": [_pt(r, knob(r, name), chosen) for r in flagged],
        "flagged_label": flagged_label(flagged),
        "star": star,
        "phase": phase,
        "xlabel": xlabel,
        "title": question(name, phase) + "\n" + (
            f"{phase} throughput; a line joins runs that differ in {xlabel} alone" if lines
            else "no line: every full run flagged its own measurement (rerun on a quiet machine)"),
        "xticks": sorted({knob(r, name) for r in full} | {knob(r, name) for r in short}),
        "log2": log2,
    }
    d["integer_x"] = all(is_int(x) for x in d["xticks"])
    # the bound of the first line's runs (of the flagged runs' when there is no line: the
    # report's answer still judges them, unconfirmed)
    anchor = groups[0][1][0] if groups else (flagged or full)[0]
    d["band"] = band(anchor) if band else None
    bands = [{"y": b["y"], "lo": b["lo"], "hi": b["threshold"]} for b in [d["band"]] if b]
    _y_axis(d, [p for ln in lines for p in ln["points"] + [b for v in ln["bounds"].values()
                                                            for b in v]]
            + d["rest"] + d["short"], rows, bands)
    return d


def question(name: str, phase: str) -> str:
    """The question a throughput picture answers, first in its title."""
    if name == "num_workers":
        return ("How many loader workers does the data side need?" if phase == "loader"
                else "How many loader workers does training need?")
    return f"How does {phase} throughput change with the batch size?"


def _y_axis(d: dict, points: list[dict], rows, bounds: list[dict] = ()) -> None:
    """The y range from every point but the flagged ones (they must not set the scale: a
    queue-timed loader run read 10x the rest); a flagged point past the top is drawn at the
    edge (`off_scale`: "above") with its figure beside it, one under a log axis's floor likewise
    ("below"). With nothing but flagged points, they set it."""
    basis = _basis(points, d["flagged"], d["star"]) + list(bounds)  # a compute band
    ys = [p["y"] for p in basis]
    span = [v for p in basis for v in (p["lo"], p["y"], p["hi"]) if v > 0]
    # a loader 20x faster than the training loop would flatten the curve that matters onto
    # the axis: a log axis keeps both readable
    log_y = min(ys) > 0 and max(ys) > LOG_SPAN * min(ys)
    ymin, ymax = (min(span) / 1.5, 1.6 * max(span)) if log_y else (0.0, HEADROOM * max(span))
    for p in d["flagged"]:  # past either end: drawn at that edge, with its figure
        p["off_scale"] = "above" if p["y"] > ymax else "below" if p["y"] < ymin else False
    whisker = interval_label_of([record_of(r) for r in rows])
    # beside the bounds of the same runs the axis holds more than the headline phase
    what = "images/sec" if any(ln["bounds"] for ln in d["lines"]) else \
        f"{d['phase']} images/sec"
    d.update(log_y=log_y, ymin=ymin, ymax=ymax,
             ylabel=f"{what} (whiskers: {whisker})" + (", log scale" if log_y else ""))


def memory_data(rows) -> dict | None:
    """Peak memory against batch size; None unless the batch size varied."""
    pts = [r for r in rows if knob(r, "batch_size") is not None
           and (peak_of(r) is not None or status_of(r) is Status.oom)]
    if len({knob(r, "batch_size") for r in pts}) < 2:
        return None
    fine = [r for r in pts if status_of(r) is not Status.oom and peak_of(r) is not None]
    groups = {}
    for prec, rs in sorted(group_by([r for r in fine if r.full], precision_of).items()):
        groups[prec] = {"xs": [knob(r, "batch_size") for r in rs],
                        "ys": [100 * peak_of(r) for r in rs]}
    short = [r for r in fine if not r.full]
    oom = [r for r in pts if status_of(r) is Status.oom]
    axis = memory_axis(pts)
    return {
        "groups": groups,
        "short": {"xs": [knob(r, "batch_size") for r in short], "ys": [100 * peak_of(r) for r in short]},
        # an OOM's peak is the whole device
        "oom": {"xs": [knob(r, "batch_size") for r in oom], "ys": [100.0] * len(oom)},
        "ceiling": 100 * ceiling_of(rows),
        "xticks": sorted({knob(r, "batch_size") for r in pts}),
        "ylabel": axis["label"],
        "note": axis["note"],
    }


def pareto_data(rows, rec=None) -> dict | None:
    """Throughput against peak memory for full measurements; the front is what no other
    unflagged full run beats on both. None with fewer than two full measured points."""
    pts = [r for r in rows if r.throughput > 0 and peak_of(r) is not None]
    full = [r for r in pts if r.full]
    if len(full) < 2:
        return None
    flagged = [r for r in full if flag_reasons(r)]
    good = [r for r in full if not flag_reasons(r)]
    front, top = [], -1.0
    for r in sorted(good, key=lambda r: (peak_of(r), -r.throughput)):
        if r.throughput > top:
            front.append(r)
            top = r.throughput
    # peaks within TOLERANCE of each other are one figure measured several times (4.99-5.04%
    # of host RAM): a front through them would draw noise as a trade-off
    peaks = [100 * peak_of(r) for r in full]
    alike = max(peaks) - min(peaks) <= TOLERANCE * max(peaks)
    short = [r for r in pts if not r.full]

    chosen = rec.chosen if rec is not None else None

    def xy(rs):
        return [_pt(r, 100 * peak_of(r), chosen) for r in rs]

    star = None
    if chosen is not None and peak_of(chosen) is not None:
        # a flagged point may be drawn moved aside from a neighbour: its star is drawn with it
        star = {"x": 100 * peak_of(chosen), "y": chosen.throughput,
                "lone": any(r is chosen for r in flagged),
                "flagged": any(r is chosen for r in flagged)}
    axis = memory_axis(pts)
    d = {
        "feasible": xy([r for r in good if r.feasible]),
        "infeasible": xy([r for r in good if not r.feasible]),
        "short": xy(short),
        "flagged": xy(flagged),
        "flagged_label": flagged_label(flagged),
        "front": xy(front),
        "front_label": FRONT_LABEL,
        "star": star,
        "ceiling": 100 * ceiling_of(rows),
        "phase": headline_phase(rows),
        "xlabel": axis["label"],
        "note": axis["note"],
    }
    basis = _basis(d["feasible"] + d["infeasible"] + d["short"], d["flagged"], star)
    # a ceiling far right of every run (a CPU's RSS is a few % of host RAM) would squeeze the
    # runs into one clump at the left edge: it is named in a note instead of drawn
    most = max(100 * peak_of(r) for r in pts)
    d["ceiling_in_view"] = d["ceiling"] <= CEILING_VIEW * most
    if not d["ceiling_in_view"]:
        d["note"] = "; ".join(x for x in (
            d["note"], f"memory.ceiling ({d['ceiling']:.0f}%) is far right of every run") if x)
    fastest = max(good or full, key=lambda r: r.throughput)
    flagged_all = ("every full run flagged its own measurement (rerun on a quiet machine)"
                   if not good else "")
    if alike:
        why = (f"no trade-off: every full run peaks at {min(peaks):.2f}-{max(peaks):.2f}% (alike "
               f"within {TOLERANCE:.0%}), so the fastest, run {fastest.label}, is the answer"
               + (f"; {flagged_all}" if flagged_all else ""))
    elif not front:
        why = f"no front: {flagged_all}"
    elif len(front) == 1:
        why = (f"no trade-off: run {fastest.label} is both the fastest and the smallest in peak "
               "memory")
    else:
        why = "the line: runs no other full run beats on both speed and peak memory"
    d["title"] = f"{PARETO_QUESTION}\n" + textwrap.fill(why, 95)
    if alike or len(front) < 2:  # no trade-off to draw: no line, no legend entry for one
        d["front"] = []
    d["best"] = [_pt(fastest, 100 * peak_of(fastest), chosen)] if good and not d["front"] \
        else []
    # alike peaks on an axis of their own hundredths would look far apart: a span of at least
    # a quarter of the largest keeps them as close as they are
    mid, shown = (max(peaks) + min(peaks)) / 2, [100 * peak_of(r) for r in pts]
    shown += [1.03 * d["ceiling"]] if d["ceiling_in_view"] else []
    d["xlim"] = (max(0.0, min(mid - max(peaks) / 8, *shown)),
                 max(mid + max(peaks) / 8, *shown)) if alike else None
    d["ymax"] = HEADROOM * max(max(p["hi"], p["y"]) for p in basis)
    for p in d["flagged"]:
        p["off_scale"] = "above" if p["y"] > d["ymax"] else False
    whisker = interval_label_of([record_of(r) for r in full])
    d["ylabel"] = f"{d['phase']} images/sec (whiskers: {whisker})"
    return d
