"""The pictures of a `sweep=pipes` search (gpubench.search.pipes), from its rows and pipes.json:
compute_pipe.png (each compute setting's img/s and peak memory against batch size, the kept
ones starred) and data_pipe.png (per kept compute setting, its bound and the loader-only img/s
of each data setting the walk tried there, the chosen one starred).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from gpubench.analysis.recommend import Row
from gpubench.config.settings import as_run
from gpubench.core.record import Status
from gpubench.report.plot_data import CEILING_VIEW
from gpubench.report.plot_rules import flag_reasons, memory_axis, phase_est, worker_groups
from gpubench.report.plots import _band, _plt, _save, _whiskers, _x_axis
from gpubench.report.runplot import plain_log

BATCH, WORKERS = "loader.batch_size", "loader.num_workers"


def _name(params: dict[str, Any], leave: str) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in sorted(params.items())
                     if k != leave) or "as composed"


def _params(row: Row, keys: list[str]) -> dict[str, Any]:
    return {k: row.flat.get(k) if k in row.flat else row.knob(k.rsplit(".", 1)[-1])
            for k in keys}


def compute_data(rows: list[Row], result: dict) -> dict | None:
    """Series of the compute pipe's runs: {label: [point]}, the kept points, the ceiling."""
    c = result.get("compute") or {}
    kept = [k["params"] for k in c.get("kept", [])]
    if not kept:
        return None
    keys = sorted(kept[0])
    series: dict[str, list[dict]] = {}
    ooms, ceiling, mine = [], 1.0, []
    for r in rows:
        e = phase_est(r.record, "compute")
        if not (r.trial or r.label).startswith("compute-") or e is None \
                and r.record.status is not Status.oom:
            continue
        mine.append(r)
        p = _params(r, keys)
        if p.get(BATCH) is None:
            continue
        ceiling = r.ceiling or ceiling
        if r.record.status is Status.oom:
            ooms.append(p[BATCH])
            continue
        series.setdefault(_name(p, BATCH), []).append(
            {"x": p[BATCH], "y": e.value, "lo": e.lo, "hi": e.hi,
             "mem": None if r.peak is None else 100 * r.peak, "kept": p in kept,
             "flagged": bool(flag_reasons(r))})
    if not series:
        return None
    for pts in series.values():
        pts.sort(key=lambda q: q["x"])
    xs = sorted({q["x"] for pts in series.values() for q in pts} | set(ooms))
    # the memory figure as every picture names it: device memory, or summed RSS of host RAM
    return {"series": series, "ooms": ooms, "ceiling": 100 * ceiling, "xticks": xs,
            "memory_label": memory_axis(mine)["label"]}


def data_panels(rows: list[Row], result: dict) -> list[dict]:
    """One panel per kept compute setting: its loader runs by data setting, its bound."""
    panels = []
    for d in result.get("data", []):
        stage = d["study"].split("-data-", 1)[-1]
        keys = sorted(d["params"])
        chosen = as_run(d["params"])
        points = []
        for r in rows:
            e = phase_est(r.record, "loader")
            if not (r.trial or r.label).startswith(f"data-{stage}-") or e is None:
                continue
            p = as_run(_params(r, keys))
            points.append((p, {"x": p.get(WORKERS, 0), "y": e.value, "lo": e.lo, "hi": e.hi,
                               "chosen": p == chosen}))
        if not points:
            continue
        # a line per setting of the other keys, named by a run with workers
        groups = worker_groups(points, lambda t: t[0].get(WORKERS),
                               lambda t: {k: v for k, v in t[0].items() if k != WORKERS})
        series = {_name(next((p for p, _ in g if p.get(WORKERS) != 0), g[0][0]), WORKERS):
                  sorted((q for _, q in g), key=lambda q: q["x"]) for g in groups}
        kept = next((k for k in result["compute"]["kept"] if k["params"] == d["for"]), None)
        bound = kept["rate"] if kept else None
        panels.append({"title": _name(d["for"], ""), "series": series, "bound": bound,
                       "clears": d["clears"],
                       "xticks": sorted({q["x"] for pts in series.values() for q in pts})})
    return panels


def _draw_compute(d: dict, out: Path) -> Path:
    plt = _plt()
    fig, (ax, mx) = plt.subplots(1, 2, figsize=(12.4, 4.6))
    for name, pts in d["series"].items():
        line, = ax.plot([q["x"] for q in pts], [q["y"] for q in pts], marker="o", label=name)
        _whiskers(ax, pts, {"color": line.get_color(), "zorder": 3})
        mem = [q for q in pts if q["mem"] is not None]
        mx.plot([q["x"] for q in mem], [q["mem"] for q in mem], marker="o",
                color=line.get_color(), label=name)
    flagged = [q for pts in d["series"].values() for q in pts if q["flagged"]]
    if flagged:  # a run that flagged its own measurement: ringed, as the other pictures do
        ax.plot([q["x"] for q in flagged], [q["y"] for q in flagged], marker="o", markersize=12,
                markerfacecolor="none", markeredgecolor="tab:red", linestyle="none", zorder=4,
                label="flagged its own measurement")
    kept = [q for pts in d["series"].values() for q in pts if q["kept"]]
    ax.plot([q["x"] for q in kept], [q["y"] for q in kept], marker="*", markersize=18,
            color="gold", markeredgecolor="black", linestyle="none", zorder=1,
            label="kept for the data pipe")
    mems = [q["mem"] for pts in d["series"].values() for q in pts if q["mem"] is not None]
    # a ceiling far above every run (a CPU's RSS is a few % of host RAM) would flatten them
    # onto the axis: it is named in the title instead, as pareto.png does
    far = bool(mems) and not d["ooms"] and d["ceiling"] > CEILING_VIEW * max(mems)
    if d["ooms"]:
        mx.scatter(d["ooms"], [104] * len(d["ooms"]), marker="x", color="red", s=60,
                   clip_on=False, label="out of memory")
    if not far:
        mx.axhline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    for a, ylabel in ((ax, "compute-only images/sec"),
                      (mx, textwrap.fill(d["memory_label"], 40))):
        _x_axis(a, d["xticks"], log2=True, integer=True)
        a.set_xlabel("batch size")
        a.set_ylabel(ylabel, fontsize=9)
        a.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    mx.set_ylim(0, 1.3 * max(mems) if far else 108)
    ax.set_title("What does the device allow?\ncompute-only img/s by batch size, a line per "
                 "setting of the other knobs", fontsize=10)
    mx.set_title("...at what peak memory?" + (f"\n(memory.ceiling, {d['ceiling']:.0f}%, is far "
                                              "above every run)" if far else ""), fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    mx.legend(fontsize=8, loc="upper left")
    return _save(fig, out)


def _draw_data(panels: list[dict], margin: float, out: Path) -> Path:
    """A column per kept compute setting (a walk that stops at the first setting that clears
    leaves one point a setting: columns, not a panel each, keep that readable)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0 + 1.6 * len(panels), 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    every: list[float] = []
    starred: set[str] = set()  # one legend entry per kind of star
    for i, p in enumerate(panels):
        if p["bound"]:  # over its own column (-0.6 to len(panels) - 0.4 across the axes)
            y, lo, hi = p["bound"]
            band = {"y": y, "lo": lo, "hi": hi, "threshold": hi * (1 + margin), "margin": margin}
            _band(ax, band, "tab:orange", "compute bound of that setting" if i == 0 else None,
                  (i + 0.18) / len(panels), (i + 1.02) / len(panels))
            every += [lo, band["threshold"]]
        pts = [(name, q) for name, qs in p["series"].items() for q in qs]
        pts = list({(q["x"], q["y"]): (name, q) for name, q in pts}.values())  # 0 workers once
        for k, (name, q) in enumerate(sorted(pts, key=lambda t: (t[1]["x"], t[0]))):
            x = i + (k - (len(pts) - 1) / 2) * min(0.2, 0.7 / max(1, len(pts)))
            c = colors[k % len(colors)]
            pt = {**q, "x": x}
            if q["chosen"]:
                star = ("chosen: the cheapest that clears" if p["clears"] else
                        "chosen: none clears, the fastest")
                ax.plot([x], [q["y"]], marker="*", markersize=18, color="gold",
                        markeredgecolor="black", linestyle="none", zorder=2,
                        label=None if star in starred else star)
                starred.add(star)
            ax.plot([x], [q["y"]], marker="v", color=c, linestyle="none", zorder=3)
            _whiskers(ax, [pt], {"color": c, "zorder": 3})
            what = f"{q['x']} worker{'s' * (q['x'] != 1)}" + (
                "" if name == "as composed" else f"\n{name}")
            ax.annotate(what, (x, q["hi"]), xytext=(0, 9), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, color=c)
            every += [q["lo"], q["hi"]]
    ax.set_xticks(range(len(panels)), [p["title"].replace(", ", "\n") for p in panels],
                  fontsize=8)
    ax.set_xlim(-0.6, len(panels) - 0.4)
    lo, hi = min(v for v in every if v > 0), max(every)
    if hi > 20 * lo:
        ax.set_yscale("log")
        plain_log(ax.yaxis, lo, hi)
        ax.set_ylim(lo / 1.5, hi * 2.0)
    else:
        ax.set_ylim(0, hi * 1.25)
    ax.set_xlabel("kept compute setting (from compute_pipe.png)")
    ax.set_ylabel("loader-only images/sec (whiskers: interval)")
    ax.set_title("Which data setting keeps up with compute?\nper kept compute setting: each "
                 "data setting the walk tried, cheapest first, against that setting's bound",
                 fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return _save(fig, out)


def plot_pipes(rows: list[Row], result: dict, out_dir: Path, margin: float) -> list[Path]:
    made = []
    d = compute_data(rows, result)
    if d is not None:
        made.append(_draw_compute(d, out_dir / "compute_pipe.png"))
    panels = data_panels(rows, result)
    if panels:
        made.append(_draw_data(panels, margin, out_dir / "data_pipe.png"))
    return made
