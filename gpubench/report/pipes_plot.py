"""The pictures of a `sweep=pipes` search (gpubench.search.pipes), from its rows and pipes.json:

- compute_pipe.png: each compute setting's compute-only img/s (whiskers: its 95% interval)
  and its peak memory against batch size, one line per setting of the other compute knobs;
  the kept settings starred, memory.ceiling dashed, an OOM as a red cross at the top;
- data_pipe.png: per kept compute setting, the loader-only img/s of each data setting against
  loader workers, with that setting's compute bound across the panel (its interval shaded,
  the line a loader's low end must clear dashed) and the chosen data setting starred.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpubench.analysis.recommend import Row
from gpubench.config.settings import as_run
from gpubench.core.record import Status
from gpubench.report.plots import _plt, _save, _whiskers, _x_axis

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
    ooms, ceiling = [], 1.0
    for r in rows:
        if not r.label.startswith("compute-") or r.record.compute_images_per_sec is None \
                and r.record.status is not Status.oom:
            continue
        p = _params(r, keys)
        if p.get(BATCH) is None:
            continue
        ceiling = r.ceiling or ceiling
        if r.record.status is Status.oom:
            ooms.append(p[BATCH])
            continue
        ci = r.record.compute_images_per_sec_ci or [r.record.compute_images_per_sec] * 2
        series.setdefault(_name(p, BATCH), []).append(
            {"x": p[BATCH], "y": r.record.compute_images_per_sec, "lo": ci[0], "hi": ci[1],
             "mem": None if r.peak is None else 100 * r.peak, "kept": p in kept})
    if not series:
        return None
    for pts in series.values():
        pts.sort(key=lambda q: q["x"])
    xs = sorted({q["x"] for pts in series.values() for q in pts} | set(ooms))
    return {"series": series, "ooms": ooms, "ceiling": 100 * ceiling, "xticks": xs}


def data_panels(rows: list[Row], result: dict) -> list[dict]:
    """One panel per kept compute setting: its loader runs by data setting, its bound. A
    0-worker run joins each line of its other keys' values (it has no worker-only ones)."""
    panels = []
    for d in result.get("data", []):
        stage = d["study"].split("-data-", 1)[-1]
        keys = sorted(d["params"])
        chosen = as_run(d["params"])
        points = []
        for r in rows:
            if not r.label.startswith(f"data-{stage}-") or r.record.loader_images_per_sec is None:
                continue
            p = as_run(_params(r, keys))
            ci = r.record.loader_images_per_sec_ci or [r.record.loader_images_per_sec] * 2
            points.append((p, {"x": p.get(WORKERS, 0), "y": r.record.loader_images_per_sec,
                               "lo": ci[0], "hi": ci[1], "chosen": p == chosen}))
        if not points:
            continue
        # a line per setting of the other keys: (one of its settings, its points)
        lines: dict[str, tuple[dict, list[dict]]] = {}
        for p, q in points:
            if p.get(WORKERS) != 0:
                lines.setdefault(_name(p, WORKERS), (p, []))[1].append(q)
        for p, q in points:
            if p.get(WORKERS) == 0:
                joins = [n for n, (pp, _) in lines.items()
                         if all(pp.get(k) == v for k, v in p.items() if k != WORKERS)]
                for n in joins or [_name(p, WORKERS)]:
                    lines.setdefault(n, (p, []))[1].append(q)
        series = {n: pts for n, (_, pts) in lines.items()}
        for pts in series.values():
            pts.sort(key=lambda q: q["x"])
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
    kept = [q for pts in d["series"].values() for q in pts if q["kept"]]
    ax.plot([q["x"] for q in kept], [q["y"] for q in kept], marker="*", markersize=18,
            color="gold", markeredgecolor="black", linestyle="none", zorder=1,
            label="kept for the data pipe")
    if d["ooms"]:
        mx.scatter(d["ooms"], [104] * len(d["ooms"]), marker="x", color="red", s=60,
                   clip_on=False, label="out of memory")
    mx.axhline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    for a, ylabel in ((ax, "compute-only images/sec"), (mx, "peak memory, % of the device")):
        _x_axis(a, d["xticks"], log2=True, integer=True)
        a.set_xlabel("batch size")
        a.set_ylabel(ylabel)
        a.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    mx.set_ylim(0, 108)
    ax.set_title("compute pipe: what the device allows", fontsize=10)
    mx.set_title("memory of the training step", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    mx.legend(fontsize=8, loc="upper left")
    return _save(fig, out)


def _draw_data(panels: list[dict], margin: float, out: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.6), squeeze=False)
    for ax, p in zip(axes[0], panels, strict=True):
        for name, pts in p["series"].items():
            line, = ax.plot([q["x"] for q in pts], [q["y"] for q in pts], marker="v",
                            linestyle=":", label=f"loader-only: {name}")
            _whiskers(ax, pts, {"color": line.get_color(), "zorder": 3})
        chosen = [q for pts in p["series"].values() for q in pts if q["chosen"]]
        ax.plot([q["x"] for q in chosen], [q["y"] for q in chosen], marker="*", markersize=18,
                color="gold", markeredgecolor="black", linestyle="none", zorder=1,
                label="chosen: the cheapest that clears" if p["clears"] else
                "chosen: none clears, the fastest")
        if p["bound"]:
            y, lo, hi = p["bound"]
            ax.axhspan(lo, hi, color="tab:orange", alpha=0.15, zorder=1,
                       label=f"compute bound {y:.0f} (band: its interval)")
            ax.axhline(y, color="tab:orange", linewidth=1, alpha=0.7, zorder=1)
            ax.axhline(hi * (1 + margin), color="tab:orange", linestyle="--", linewidth=1,
                       label=f"to clear: a loader's low end above\ncompute's high end + "
                             f"{margin:.0%}")
        _x_axis(ax, p["xticks"], log2=False, integer=True)
        ax.set_xlabel("loader workers")
        ax.set_ylabel("loader-only images/sec")
        ax.set_ylim(bottom=0)
        ax.set_title(f"data pipe for {p['title']}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
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
