"""What the sweep report's pictures show, as plain data for report.plots (rules: plot_rules)."""

from __future__ import annotations

import textwrap
from typing import Any

from gpubench.analysis.recommend import Row, interval_label
from gpubench.analysis.select import LeftOut, left_out
from gpubench.config.keys import Pipe
from gpubench.config.knobs import declared, knob_setting
from gpubench.config.settings import as_run
from gpubench.core.record import Status, interval_label_of
from gpubench.core.stats import TOLERANCE, Est
from gpubench.report import plot_rules
from gpubench.report.plot_rules import flag_reasons, flagged_label, knob, phase_est

HEADROOM = 1.15  # above the highest point: the star and the top markers stay inside the axes
CEILING_VIEW = 2.5  # the memory ceiling is drawn within this factor of the largest peak
LOG_SPAN = 20.0  # values spanning more get a log y axis
BATCH, WORKERS = "loader.batch_size", "loader.num_workers"


def _pt(row, x, chosen=None) -> dict:
    # the ranking's interval (pooled once confirmed) and run column (written by a lone point)
    return _est(x, Est(row.throughput, *row.interval), run=row.label, chosen=row is chosen)


def _est(x, e: Est, **more) -> dict:
    return {"x": x, "y": e.value, "lo": e.lo, "hi": e.hi, **more}


def _star(chosen, x, apart: list, flagged: list) -> dict | None:
    """The recommended run's star; a point apart is moved aside, its star with it."""
    return None if chosen is None or x is None else {
        "x": x, "y": chosen.throughput, "lone": any(r is chosen for r in apart),
        "flagged": any(r is chosen for r in flagged)}


def _basis(points: list[dict], flagged: list[dict], star: dict | None) -> list[dict]:
    """The y range's points: the star and the unflagged (a queue-timed loader read 10x), or all."""
    return (points or flagged) + ([{"y": star["y"], "lo": star["y"], "hi": star["y"]}]
                                  if star else [])


def curve_data(rows, name: str, xlabel: str, rec=None, log2: bool = False,
               band=None) -> dict | None:
    """Throughput against knob `name` (None: it did not vary), lines of full feasible runs apart
    in it alone; `band`: a row -> the compute bound drawn across."""
    full = [r for r in rows if r.feasible and r.full and knob(r, name) is not None]
    if len({knob(r, name) for r in full}) < 2:
        return None
    phase = plot_rules.headline_phase(rows)
    good = [r for r in full if not flag_reasons(r)]
    flagged = [r for r in full if flag_reasons(r)]
    chosen = rec.chosen if rec is not None else None
    groups, rest = plot_rules.line_groups(good, name, chosen) if good else ([], [])
    lines = []
    for i, (label, rs) in enumerate(groups):
        # the bounds of one group only: each bound must sit beside the runs it limits
        bounds = {p: pts for p in plot_rules.BOUND_PHASES if i == 0 and p != phase and (pts := [
            _est(knob(r, name), e) for r in rs if (e := phase_est(r.record, p)) is not None])}
        lines.append({"label": label, "points": [_pt(r, knob(r, name)) for r in rs],
                      "bounds": bounds})
    short = [r for r in rows if not r.full and r.throughput > 0 and knob(r, name) is not None]
    xticks = sorted({knob(r, name) for r in full + short})
    ask = ("How does {phase} throughput change with the batch size?" if name != "num_workers"
           else "How many loader workers does the data side need?" if phase == "loader"
           else "How many loader workers does training need?").format(phase=phase)
    # the bound of the first line's runs, else of the flagged ones (the answer judges them)
    anchor = groups[0][1][0] if groups else (flagged or full)[0]
    d = {"lines": lines, "rest": [{**_pt(r, knob(r, name), chosen), "apart": why}
                                  for r, why in rest],
         "short": [_pt(r, knob(r, name)) for r in short],
         "flagged": [_pt(r, knob(r, name), chosen) for r in flagged],
         "flagged_label": flagged_label(flagged),
         "star": _star(chosen, chosen and knob(chosen, name), [r for r, _ in rest] + flagged,
                       flagged),
         "phase": phase, "xlabel": xlabel,
         "title": ask + "\n" + (
             f"{phase} throughput; a line joins runs that differ in {xlabel} alone" if lines
             else f"no line: {plot_rules.all_flagged(flagged)}"),
         "xticks": xticks, "log2": log2,
         "integer_x": all(isinstance(x, int) and not isinstance(x, bool) for x in xticks),
         "band": band(anchor) if band else None}
    # the y range: `_basis` and a compute band (a flagged point past an end: off_scale)
    points = [p for ln in lines for p in ln["points"] + [b for v in ln["bounds"].values()
                                                         for b in v]]
    basis = _basis(points + d["rest"] + d["short"], d["flagged"], d["star"]) + [
        {"y": b["y"], "lo": b["lo"], "hi": b["threshold"]} for b in [d["band"]] if b]
    ys = [p["y"] for p in basis]
    span = [v for p in basis for v in (p["lo"], p["y"], p["hi"]) if v > 0]
    # a loader 20x faster than the training loop would flatten the curve that matters: log axis
    log_y = min(ys) > 0 and max(ys) > LOG_SPAN * min(ys)
    ymin, ymax = (min(span) / 1.5, 1.6 * max(span)) if log_y else (0.0, HEADROOM * max(span))
    for p in d["flagged"]:  # past either end: drawn at that edge, with its figure
        p["off_scale"] = "above" if p["y"] > ymax else "below" if p["y"] < ymin else False
    with_bounds = any(ln["bounds"] for ln in d["lines"])
    whisker = interval_label(rows, phases=with_bounds)
    what = "images/sec" if with_bounds else f"{d['phase']} images/sec"  # bounds: not only it
    d.update(log_y=log_y, ymin=ymin, ymax=ymax,
             ylabel=f"{what} (whiskers: {whisker})" + (", log scale" if log_y else ""))
    return d


def memory_data(rows) -> dict | None:  # None unless the batch size varied
    pts = [r for r in rows if knob(r, "batch_size") is not None
           and (r.peak is not None or r.record.status is Status.oom)]
    if len({knob(r, "batch_size") for r in pts}) < 2:
        return None
    fine = [r for r in pts if r.record.status is not Status.oom and r.peak is not None]

    def xy(rs: list) -> dict:  # an OOM's peak is the whole device
        return {"xs": [knob(r, "batch_size") for r in rs],
                "ys": [100.0 if r.record.status is Status.oom else 100 * r.peak for r in rs]}

    full = [r for r in fine if r.full]
    axis = plot_rules.memory_axis(pts)
    # a series per setting of what else varied and acts on the memory read: the compute knobs
    # (adamw holds two more states per weight than sgd), every knob for host RSS (workers)
    rss = axis["note"] is not None
    varied = plot_rules.held_fixed(full, BATCH)
    keys = [k for k in varied if k != "precision.name"
            and (rss or (d := declared(k)) is None or d.knob.pipe is not Pipe.data)]
    # the precision names a series where it varied, or where nothing else did
    named_precision = not keys or "precision.name" in varied

    def series(r) -> str:  # `fp32`, `fp32, optimizer=adamw`, `optimizer=adamw`
        f = plot_rules.knobs_of(r)
        return ", ".join([str(knob(r, "precision") or "?")] * named_precision + [
            knob_setting(k, f.get(k)) for k in keys])

    groups = plot_rules.group_by(full, series)
    return {"groups": {name: xy(rs) for name, rs in sorted(groups.items())},
            "short": xy([r for r in fine if not r.full]),
            "oom": xy([r for r in pts if r.record.status is Status.oom]),
            "ceiling": 100 * plot_rules.ceiling_of(rows),
            "xticks": sorted({knob(r, "batch_size") for r in pts}),
            "ylabel": axis["label"], "note": axis["note"]}


def pareto_data(rows, rec=None) -> dict | None:
    """Throughput against peak memory of 2+ full training runs (a loader-only run's peak is its
    workers'); the front: what no other unflagged full run beats on both."""
    pts = [r for r in rows if r.throughput > 0 and r.peak is not None
           and left_out(r.record) is not LeftOut.no_e2e]  # screens, probes: hollow, no front
    full = [r for r in pts if r.full]
    if len(full) < 2:
        return None
    flagged = [r for r in full if flag_reasons(r)]
    good = [r for r in full if not flag_reasons(r)]
    front, top = [], -1.0
    for r in sorted(good, key=lambda r: (r.peak, -r.throughput)):
        if r.throughput > top:
            front.append(r)
            top = r.throughput
    # peaks within TOLERANCE are one figure measured again (4.99-5.04% of host RAM): a front
    # through them would draw noise as a trade-off
    peaks = [100 * r.peak for r in full]
    alike = max(peaks) - min(peaks) <= TOLERANCE * max(peaks)
    chosen = rec.chosen if rec is not None else None

    def xy(rs):
        return [_pt(r, 100 * r.peak, chosen) for r in rs]

    star = _star(chosen, chosen and chosen.peak and 100 * chosen.peak, flagged, flagged)
    axis = plot_rules.memory_axis(pts)
    d = {"feasible": xy([r for r in good if r.feasible]),
         "infeasible": xy([r for r in good if not r.feasible]),
         "short": xy([r for r in pts if not r.full]), "flagged": xy(flagged),
         "flagged_label": flagged_label(flagged), "front": xy(front),
         "front_label": plot_rules.FRONT_LABEL, "star": star,
         "ceiling": 100 * plot_rules.ceiling_of(rows), "phase": plot_rules.headline_phase(rows),
         "xlabel": axis["label"], "note": axis["note"]}
    basis = _basis(d["feasible"] + d["infeasible"] + d["short"], d["flagged"], star)
    # a ceiling far right of every run (a CPU's RSS) would clump them at the left: a note
    d["ceiling_in_view"] = d["ceiling"] <= CEILING_VIEW * max(100 * r.peak for r in pts)
    if not d["ceiling_in_view"]:
        d["note"] = "; ".join(x for x in (
            d["note"], f"memory.ceiling ({d['ceiling']:.0f}%) is far right of every run") if x)
    fastest = max(good or full, key=lambda r: r.throughput)
    flagged_all = plot_rules.all_flagged(flagged) if not good else ""
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
    d["title"] = "How much peak memory does more speed cost?\n" + textwrap.fill(why, 95)
    if alike or len(front) < 2:  # no trade-off to draw: no line, no legend entry for one
        d["front"] = []
    d["best"] = [_pt(fastest, 100 * fastest.peak, chosen)] if good and not d["front"] else []
    # alike peaks look far apart on an axis of hundredths: span at least a quarter of the largest
    mid, shown = (max(peaks) + min(peaks)) / 2, [100 * r.peak for r in pts]
    shown += [1.03 * d["ceiling"]] if d["ceiling_in_view"] else []
    d["xlim"] = (max(0.0, min(mid - max(peaks) / 8, *shown)),
                 max(mid + max(peaks) / 8, *shown)) if alike else None
    d["ymax"] = HEADROOM * max(max(p["hi"], p["y"]) for p in basis)
    for p in d["flagged"]:
        p["off_scale"] = "above" if p["y"] > d["ymax"] else False
    d["ylabel"] = f"{d['phase']} images/sec (whiskers: {interval_label(full)})"
    return d


# sweep=pipes, from its rows and pipes.json: compute_pipe.png and data_pipe.png


def _name(params: dict[str, Any], leave: str) -> str:
    return ", ".join(knob_setting(k, v) for k, v in sorted(params.items())
                     if k != leave) or "as composed"


def _params(row: Row, keys: list[str]) -> dict[str, Any]:
    return {k: row.flat.get(k) if k in row.flat else row.knob(k.rsplit(".", 1)[-1]) for k in keys}


def compute_data(rows: list[Row], result: dict) -> dict | None:
    """The compute pipe's runs: {label: [point]}, the kept points, the ceiling."""
    kept = [k["params"] for k in (result.get("compute") or {}).get("kept", [])]
    if not kept:
        return None
    keys = sorted(kept[0])
    series: dict[str, list[dict]] = {}
    ooms, ceiling, mine = [], 1.0, []
    for r in rows:
        e = phase_est(r.record, "compute")
        if r.stage != "compute" or e is None and r.record.status is not Status.oom:
            continue
        mine.append(r)
        p = _params(r, keys)
        if p.get(BATCH) is None:
            continue
        ceiling = r.ceiling or ceiling
        if r.record.status is Status.oom:
            ooms.append(p[BATCH])
            continue
        series.setdefault(_name(p, BATCH), []).append(_est(
            p[BATCH], e, mem=None if r.peak is None else 100 * r.peak, kept=p in kept,
            flagged=bool(flag_reasons(r))))
    if not series:
        return None
    for pts in series.values():
        pts.sort(key=lambda q: q["x"])
    xs = sorted({q["x"] for pts in series.values() for q in pts} | set(ooms))
    return {"series": series, "ooms": ooms, "ceiling": 100 * ceiling, "xticks": xs,
            "memory_label": plot_rules.memory_axis(mine)["label"],
            "ylabel": f"compute-only images/sec (whiskers: {_coverage(mine, 'compute')})"}


def _coverage(rows: list[Row], phase: str) -> str:
    """The interval label of these runs' own `phase` figures (unpooled)."""
    return interval_label_of(c for r in rows if (c := r.record.phase_coverage(phase)) is not None)


def data_panels(rows: list[Row], result: dict) -> list[dict]:
    """A panel per kept compute setting: its loader runs by data setting, its bound."""
    panels, loaders = [], []
    for d in result.get("data", []):
        # `<study>-data-<digest>`: the last part whatever the study's name holds
        # (`imagenet-data-v2`); a row's trial is `data-<digest>-<number>` (search.rows)
        stage = d["study"].rsplit("-data-", 1)[-1]
        keys, chosen = sorted(d["params"]), as_run(d["params"])
        points = []
        for r in rows:
            e = phase_est(r.record, "loader")
            if r.stage == f"data-{stage}" and e is not None:
                loaders.append(r)
                p = as_run(_params(r, keys))
                points.append((p, _est(p.get(WORKERS, 0), e, chosen=p == chosen)))
        if not points:
            continue
        # a line per setting of the other keys, named by a run with workers
        groups = plot_rules.worker_groups(
            points, lambda t: t[0].get(WORKERS),
            lambda t: {k: v for k, v in t[0].items() if k != WORKERS})
        series = {_name(next((p for p, _ in g if p.get(WORKERS) != 0), g[0][0]), WORKERS):
                  sorted((q for _, q in g), key=lambda q: q["x"]) for g in groups}
        kept = next((k for k in result["compute"]["kept"] if k["params"] == d["for"]), None)
        panels.append({"title": _name(d["for"], ""), "series": series,
                       "bound": kept["rate"] if kept else None, "clears": d["clears"]})
    for panel in panels:
        panel["ylabel"] = f"loader-only images/sec (whiskers: {_coverage(loaders, 'loader')})"
    return panels
