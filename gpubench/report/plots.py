"""PNG pictures of a sweep report and a sweep=pipes search (Agg), drawn from report.plot_data;
also the set-up and saving report.runplot shares."""

from __future__ import annotations

import itertools
import logging
import math
import textwrap
from collections import Counter
from pathlib import Path

from matplotlib import rcParams, transforms
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from gpubench.analysis.workers import clear_line
from gpubench.core.files import open_own
from gpubench.core.stats import count
from gpubench.report import plot_data, plot_rules
from gpubench.report.plot_rules import SHORT_LABEL, Apart

log = logging.getLogger("gpubench")
# a curve's runs on no line, grey, told apart by their marker
APART_MARKERS = {Apart.repeat: "o", Apart.alone: "s", Apart.beyond: "D"}


def pyplot():  # imported when a picture is drawn: the report's text needs none of it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


FIGSIZE = (10.4, 4.8)  # wide enough for a legend outside the axes, on the right, covering nothing
# a legend line's most characters: six knobs on one line (about 110) left the axes a sliver
LEGEND_CHARS = 52
# under a run's number: legible over a whisker
LABEL_BOX = dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85)


def _finish(fig, ax, out: Path, title: str, xlabel: str, ylabel: str, note: str | None = None,
            xsize: float | None = None, ysize: float | None = 9, grid: str = "both",
            placed: list[tuple[float, float]] = ()) -> Path:
    ax.set_xlabel(xlabel, fontsize=xsize)
    ax.set_ylabel(ylabel, fontsize=ysize)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis=grid)
    if note:
        ax.text(0.0, -0.16, note, transform=ax.transAxes, fontsize=8, va="top", color="dimgray")
    handles, labels = ax.get_legend_handles_labels()
    wrapped = ["\n".join(textwrap.fill(line, LEGEND_CHARS, break_long_words=False,
                                       break_on_hyphens=False) for line in label.split("\n"))
               for label in labels]
    ax.legend(handles, wrapped, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              fontsize=8)
    # after the layout: only the axes' final width says what a point's offset is in data units
    return save(fig, out, laid_out=lambda: _hold(ax, placed) if placed else None)


# room beyond a point moved aside, in points: its marker's half width (8 / 2) and a little
HOLD_PAD = 6.0


def _hold(ax, placed: list[tuple[float, float]]) -> None:
    """The x-limits widened until every point drawn `dx` points beside its x lies inside (one
    past the last tick was cut off); widening changes what a point is in data units: rounds."""
    px = ax.figure.dpi / 72.0  # pixels per point
    for _ in range(10):
        lo, hi = ax.get_xlim()
        at = [ax.transData.transform((x, 0.0))[0] + dx * px for x, dx in placed]
        (left, _), (right, _) = ax.transData.transform([(lo, 0.0), (hi, 0.0)])
        short_l = left - (min(at) - HOLD_PAD * px)
        short_r = max(at) + HOLD_PAD * px - right
        if short_l <= 0 and short_r <= 0:
            return
        back = ax.transData.inverted().transform
        ax.set_xlim(lo if short_l <= 0 else back((left - 1.25 * short_l, 0.0))[0],
                    hi if short_r <= 0 else back((right + 1.25 * short_r, 0.0))[0])


def save(fig, path: Path, dpi: int = 110, laid_out=None) -> Path:
    fig.tight_layout()
    if laid_out is not None:
        laid_out()
    with open_own(path, "wb") as f:  # never through a symbolic link
        fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight")  # tight: legends outside kept
    pyplot().close(fig)
    return path


def _plain(x: float, _pos=None) -> str:
    return f"{x:,.0f}" if x >= 1 else f"{x:g}"


class _FittedLog(LogLocator):
    """Log ticks at 1-2-5 (past two decades: powers of ten), thinned until no two labels meet
    (`5,000` and `10,000` ran into `5,00010,000`)."""

    def __init__(self, which: str, lo: float, hi: float) -> None:
        super().__init__(base=10)
        self.which = which
        self.steps = [(1.0, 2.0, 5.0), (1.0, 3.0), (1.0,)] if hi <= 100 * lo else [(1.0,)]

    def tick_values(self, vmin: float, vmax: float):
        tries = [LogLocator(base=10, subs=s).tick_values(vmin, vmax) for s in self.steps]
        # every other, every third ... power of ten (LogLocator strides decades by numticks)
        tries += [LogLocator(base=10, subs=(1.0,), numticks=n).tick_values(vmin, vmax)
                  for n in range(len(tries[-1]) - 1, 2, -1)]
        return next((t for t in tries if self._apart(t, vmin, vmax)), tries[-1])

    def _apart(self, ticks, vmin: float, vmax: float) -> bool:
        from matplotlib.font_manager import FontProperties  # loads the font list: when drawn

        if self.axis is None or not 0 < vmin < vmax:
            return True
        box = self.axis.axes.get_window_extent()
        length = box.width if self.which == "x" else box.height
        size = FontProperties(size=rcParams[f"{self.which}tick.labelsize"]).get_size_in_points()
        em = size * self.axis.axes.figure.dpi / 72  # pixels
        span = math.log10(vmax) - math.log10(vmin)
        shown = [t for t in ticks if vmin <= t <= vmax]
        at = [length * (math.log10(t) - math.log10(vmin)) / span for t in shown]
        # a digit is about 0.6 em wide, a line 1.2 em tall; half an em between two labels
        need = [0.6 * em * (len(_plain(a)) + len(_plain(b))) / 2 if self.which == "x"
                else 1.2 * em for a, b in itertools.pairwise(shown)]
        return all(q - p >= n + em / 2 for (p, q), n in zip(itertools.pairwise(at), need,
                                                             strict=True))


def plain_log(ax, which: str, lo: float, hi: float) -> None:
    """A log axis in plain numbers (0.1, 3,000): matplotlib's writes 6x10^1, crowds a range."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(_FittedLog(which, lo, hi))
    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_formatter(NullFormatter())


def _x_axis(ax, xticks, log2: bool, integer: bool) -> None:
    """log2: ticks labelled with the sizes (not 2^k); integer: at the values only."""
    if log2:
        ax.set_xscale("log", base=2)
        ticks = [x for x in xticks if x]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(min(ticks) / 1.4, max(ticks) * 1.4)  # end points (and a star) not clipped
    elif integer:
        ax.set_xticks(list(xticks), [str(t) for t in xticks])
        span = max(xticks) - min(xticks) or 1
        ax.set_xlim(min(xticks) - 0.08 * span, max(xticks) + 0.08 * span)


def _gold(ax, xs, ys, label: str | None, size: float = 18, zorder: float = 1, **kw) -> None:
    # under the points (zorder 1 < 3) and bigger than them: it rings a point, never hides it
    ax.plot(xs, ys, marker="*", markersize=size, color="gold", markeredgecolor="black",
            linestyle="none", zorder=zorder, label=label, **kw)


def _star(ax, star, transform=None) -> None:
    if star is None or (star.get("lone") and transform is None):
        return  # a lone point's star is drawn beside that point (_lone), where it was moved
    _gold(ax, [star["x"]], [star["y"]], "recommended" + (
        " (unconfirmed: flagged)" if star.get("flagged") else ""), 20, clip_on=False,
        transform=transform or ax.transData)


def _points(ax, pts: list[dict], *, line: bool = False, **kw):
    if pts:
        kw.setdefault("linestyle", "-" if line else "none")
        ax.plot([p["x"] for p in pts], [p["y"] for p in pts], **kw)
        _whiskers(ax, pts, kw)


def _whiskers(ax, pts: list[dict], kw: dict, transform=None) -> None:
    if spread := [p for p in pts if p["hi"] > p["lo"]]:  # none for a run of one window
        ax.errorbar([p["x"] for p in spread], [p["y"] for p in spread],
                    yerr=[[p["y"] - p["lo"] for p in spread], [p["hi"] - p["y"] for p in spread]],
                    fmt="none", capsize=3, elinewidth=1,
                    ecolor=kw.get("markeredgecolor") or kw.get("color"), alpha=kw.get("alpha"),
                    zorder=kw.get("zorder"), transform=transform or ax.transData)


def _dodge(pts: list[dict], near: float = 0.0, taken=None) -> list[float]:
    """Sideways offsets (points) for points at one x (or within `near`), so none hides another;
    right of the `taken` places already drawn there (x -> how many)."""
    taken = taken or {}
    clumps: list[list[int]] = []
    for i in sorted(range(len(pts)), key=lambda i: pts[i]["x"]):
        if clumps and pts[i]["x"] - pts[clumps[-1][-1]]["x"] <= near:
            clumps[-1].append(i)
        else:
            clumps.append([i])
    out = [0.0] * len(pts)
    for c in clumps:
        used = taken.get(pts[c[0]]["x"], 0)
        for k, i in enumerate(c):
            out[i] = 12.0 * (used + k if used else k - (len(c) - 1) / 2)
    return out


def _lone(ax, pts: list[dict], near: float = 0.0, flagged: bool = False, taken=None,
          edge=None, discrete_x: bool = True, **kw) -> list[tuple[float, float]]:
    """Points on no line, whisker and run number; at `edge` (y, text offset, alignment) those
    past that axis end. Moved aside only on a `discrete_x` axis: on peak memory a point moved
    reads as a value it never had, so only its label moves."""
    label = kw.pop("label")
    if label and edge is None and any(p.get("run") is not None for p in pts):
        label += "\n(label: its run, as ranking.txt names it)"
    placed = []  # (x, points aside), for _hold
    for i, (p, dx) in enumerate(zip(pts, _dodge(pts, near, taken), strict=True)):
        placed.append((p["x"], dx if discrete_x else 0.0))
        shift = transforms.offset_copy(ax.transData, fig=ax.figure, x=placed[-1][1],
                                       units="points")
        y, run = (p["y"], p.get("run")) if edge is None else (edge[0], None)
        if p.get("chosen"):  # the star rings its point where it is drawn
            _star(ax, {"x": p["x"], "y": y, "flagged": flagged}, transform=shift)
        ax.plot([p["x"]], [y], linestyle="none", transform=shift,
                label=label if i == 0 else None, **kw)
        if edge is None:
            _whiskers(ax, [p], kw, shift)
        # drawn in shifted coordinates, which autoscaling ignores: the point still counts
        ax.update_datalim([(p["x"], y)] + ([(p["x"], p["lo"]), (p["x"], p["hi"])]
                                           if edge is None else []))
        if run is not None:
            # above its whisker's cap (11 points over the marker crossed the whisker) and the
            # star's arms; under the lines (zorder 4): it never hides a point
            ax.annotate(str(run), (p["x"], max(y, p["hi"])),
                        xytext=(dx, 3 + 8 * bool(p.get("chosen")) if p["hi"] > y else 11),
                        ha="center", va="bottom", textcoords="offset points", fontsize=7,
                        color=kw.get("color"), bbox=LABEL_BOX, zorder=3)
        elif edge is not None:  # the figure and run number inside the axes, by the marker
            named = f"run {p['run']}\n" if p.get("run") is not None else ""
            ax.annotate(f"{named}{p['y']:,.0f}\noff scale", (p["x"], y), xytext=(dx, edge[1]),
                        textcoords="offset points", fontsize=7, color="tab:red", ha="center",
                        va=edge[2])
    return placed


def _flagged(ax, d: dict, near: float = 0.0, taken=None,
             discrete_x: bool = True) -> list[tuple[float, float]]:
    """Flagged runs hollow red, never joined; one past an end of the axis at that edge."""
    step = 1.12 if d.get("log_y") else 1.03
    label = d["flagged_label"]
    placed = []
    for side, marker, edge in ((False, "o", None), ("above", "^", (d["ymax"] / step, -8, "top")),
                               ("below", "v", (d.get("ymin", 0.0) * step, 8, "bottom"))):
        if pts := [p for p in d["flagged"] if (p.get("off_scale") or False) == side]:
            placed += _lone(ax, pts, near=near, flagged=True, taken=taken, edge=edge,
                            discrete_x=discrete_x, marker=marker, markersize=8,
                            markerfacecolor="none", markeredgecolor="tab:red", color="tab:red",
                            zorder=2, label=label)
            label = None
    return placed


def _draw_curve(d: dict, out: Path) -> Path:
    fig, ax = pyplot().subplots(figsize=FIGSIZE)
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"loader": {"linestyle": ":", "marker": "v"},
              "compute": {"linestyle": "--", "marker": "^"}}
    one = len(d["lines"]) == 1
    for i, ln in enumerate(d["lines"]):
        c = colors[i % len(colors)]
        _points(ax, ln["points"], line=True, marker="o", color=c, zorder=4,  # over its bounds
                label=d["phase"] + (f" ({ln['label']})" if ln["label"] else ""))
        for p, pts in ln["bounds"].items():
            _points(ax, pts, line=True, **styles[p], color=c, alpha=0.75, zorder=3,
                    # indented under its line's entry: the bounds belong to that line's runs
                    label=f"{p} only, same runs" if one else f"    {p} only, same runs")
    if d.get("band"):
        _band(ax, d["band"], colors[0], d["band"]["label"])
    taken = Counter(p["x"] for ln in d["lines"] for p in ln["points"])
    placed = []
    for why, marker in APART_MARKERS.items():  # points at one x side by side
        pts = [p for p in d["rest"] if p["apart"] is why]
        placed += _lone(ax, pts, taken=taken, marker=marker, markersize=5, color="dimgrey",
                        zorder=2, label=why.value.format(phase=d["phase"], xlabel=d["xlabel"]))
        taken += Counter(p["x"] for p in pts)
    _points(ax, d["short"], marker="o", markerfacecolor="none", markeredgecolor="grey",
            color="grey", zorder=2, label=SHORT_LABEL)
    placed += _flagged(ax, d, taken=taken)
    _star(ax, d["star"])
    _x_axis(ax, d["xticks"], d["log2"], d["integer_x"])
    if d["log_y"]:
        plain_log(ax, "y", d["ymin"], d["ymax"])
    ax.set_ylim(d["ymin"], d["ymax"])
    return _finish(fig, ax, out, d["title"], d["xlabel"], d["ylabel"], placed=placed)


def _band(ax, b: dict, color, label: str | None, xmin: float = 0.0, xmax: float = 1.0) -> None:
    """A compute bound (`xmin`-`xmax`: axes fractions) and the line a loader's low end clears."""
    ax.axhspan(b["lo"], b["hi"], xmin, xmax, color=color, alpha=0.12, zorder=1,
               label=label and f"{label} (band: its interval)")
    ax.axhline(b["y"], xmin, xmax, color=color, linewidth=1, alpha=0.6, zorder=1)
    ax.axhline(b["threshold"], xmin, xmax, color=color, linestyle="--", linewidth=1, zorder=1,
               label=label and "to clear: a loader's low end above\ncompute's high end + "
                               f"{b['margin']:.0%}")


def _draw_memory(d: dict, out: Path) -> Path:
    fig, ax = pyplot().subplots(figsize=FIGSIZE)
    n = len(d["groups"])
    for i, (name, g) in enumerate(d["groups"].items()):
        # series side by side around each batch size: at the same peak one hid another
        shift = 2 ** ((i - (n - 1) / 2) * 0.08)
        ax.scatter([x * shift for x in g["xs"]], g["ys"], zorder=3, label=f"full run ({name})")
    if d["short"]["xs"]:
        ax.scatter(d["short"]["xs"], d["short"]["ys"], facecolors="none", edgecolors="grey",
                   zorder=2, label=SHORT_LABEL)
    if d["oom"]["xs"]:
        ax.scatter(d["oom"]["xs"], d["oom"]["ys"], marker="x", color="red", s=60, zorder=3,
                   clip_on=False, label="out of memory")
    ax.axhline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    _x_axis(ax, d["xticks"], log2=True, integer=True)
    ax.set_ylim(0, 108)  # room above 100% for the OOM crosses
    return _finish(fig, ax, out, "Which batch sizes fit under the memory ceiling?", "batch size",
                   d["ylabel"], d["note"])


def _draw_pareto(d: dict, out: Path) -> Path:
    fig, ax = pyplot().subplots(figsize=FIGSIZE)
    _points(ax, d["feasible"], marker="o", color="tab:blue", zorder=3, label="feasible")
    _points(ax, d["infeasible"], marker="o", color="grey", zorder=3,
            label="over the ceiling / not ok")
    _points(ax, d["short"], marker="o", markerfacecolor="none", markeredgecolor="grey",
            color="grey", zorder=2, label=SHORT_LABEL)
    every = [p["x"] for k in ("feasible", "infeasible", "short", "flagged") for p in d[k]]
    # peaks a hair apart: their labels side by side, each point at the peak it measured
    _flagged(ax, d, near=(max(every) - min(every)) / 40, discrete_x=False)
    if front := d["front"]:
        ax.step([p["x"] for p in front], [p["y"] for p in front], where="post", color="black",
                alpha=0.6, zorder=2, label=d["front_label"].replace(": ", ":\n", 1))
    for p in front + d["best"]:  # the runs the picture answers with, named as on disk
        ax.annotate(f"run {p['run']}", (p["x"], p["y"]), xytext=(0, 9), ha="center",
                    textcoords="offset points", fontsize=7.5, bbox=LABEL_BOX)
    if d["ceiling_in_view"]:
        ax.axvline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    _star(ax, d["star"])
    ax.set_ylim(0, d["ymax"])
    ax.margins(x=0.08)
    if d["xlim"]:
        ax.set_xlim(*d["xlim"])
    return _finish(fig, ax, out, d["title"], d["xlabel"], d["ylabel"], d["note"], xsize=9)


def _draw_compute(d: dict, out: Path) -> Path:
    fig, (ax, mx) = pyplot().subplots(1, 2, figsize=(12.4, 4.6))
    for name, pts in d["series"].items():
        line, = ax.plot([q["x"] for q in pts], [q["y"] for q in pts], marker="o", label=name)
        _whiskers(ax, pts, {"color": line.get_color(), "zorder": 3})
        mem = [q for q in pts if q["mem"] is not None]
        mx.plot([q["x"] for q in mem], [q["mem"] for q in mem], marker="o",
                color=line.get_color(), label=name)
    every = [q for pts in d["series"].values() for q in pts]
    # a run that flagged its own measurement: ringed, as the other pictures do
    if flagged := [q for q in every if q["flagged"]]:
        ax.plot([q["x"] for q in flagged], [q["y"] for q in flagged], marker="o", markersize=12,
                markerfacecolor="none", markeredgecolor="tab:red", linestyle="none", zorder=4,
                label="flagged its own measurement")
    kept = [q for q in every if q["kept"]]
    _gold(ax, [q["x"] for q in kept], [q["y"] for q in kept], "kept for the data pipe")
    mems = [q["mem"] for q in every if q["mem"] is not None]
    # a ceiling far above every run (a CPU's RSS) would flatten them: named in the title instead
    far = bool(mems) and not d["ooms"] and d["ceiling"] > plot_data.CEILING_VIEW * max(mems)
    if d["ooms"]:
        mx.scatter(d["ooms"], [104] * len(d["ooms"]), marker="x", color="red", s=60,
                   clip_on=False, label="out of memory")
    if not far:
        mx.axhline(d["ceiling"], color="red", linestyle="--", label="memory.ceiling")
    for a, ylabel in ((ax, d["ylabel"]), (mx, textwrap.fill(d["memory_label"], 40))):
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
    return save(fig, out)


def _draw_data(panels: list[dict], margin: float, out: Path, compute_png: bool) -> Path:
    fig, ax = pyplot().subplots(figsize=(6.0 + 1.6 * len(panels), 4.8))
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    left, right = -0.6, len(panels) - 0.4  # the x-limits: a column per setting at 0, 1, ...
    every: list[float] = []
    starred: set[str] = set()  # one legend entry per kind of star
    for i, p in enumerate(panels):
        if p["bound"]:  # over its own column, i - 0.42 to i + 0.42, as axes fractions
            y, lo, hi = p["bound"]
            band = {"y": y, "lo": lo, "hi": hi, "threshold": clear_line(hi, margin),
                    "margin": margin}
            _band(ax, band, "tab:orange", "compute bound of that setting" if i == 0 else None,
                  *((i + d - left) / (right - left) for d in (-0.42, 0.42)))
            every += [lo, band["threshold"]]
        pts = [(name, q) for name, qs in p["series"].items() for q in qs]
        pts = list({(q["x"], q["y"]): (name, q) for name, q in pts}.values())  # 0 workers once
        for k, (name, q) in enumerate(sorted(pts, key=lambda t: (t[1]["x"], t[0]))):
            x = i + (k - (len(pts) - 1) / 2) * min(0.2, 0.7 / max(1, len(pts)))
            c = colors[k % len(colors)]
            if q["chosen"]:
                star = ("chosen: the cheapest that clears" if p["clears"] else
                        "chosen: none clears, the fastest")
                _gold(ax, [x], [q["y"]], None if star in starred else star, zorder=2)
                starred.add(star)
            _points(ax, [{**q, "x": x}], marker="v", color=c, zorder=3)
            what = count(q["x"], "worker") + ("" if name == "as composed" else f"\n{name}")
            ax.annotate(what, (x, q["hi"]), xytext=(0, 9), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, color=c)
            every += [q["lo"], q["hi"]]
    ax.set_xticks(range(len(panels)), [p["title"].replace(", ", "\n") for p in panels], fontsize=8)
    ax.set_xlim(left, right)
    lo, hi = min(v for v in every if v > 0), max(every)
    if hi > plot_data.LOG_SPAN * lo:
        plain_log(ax, "y", lo, hi)
        ax.set_ylim(lo / 1.5, hi * 2.0)
    else:
        ax.set_ylim(0, hi * 1.25)
    return _finish(fig, ax, out, "Which data setting keeps up with compute?\nper kept compute "
                   "setting: each data setting the walk tried, cheapest first, against that "
                   "setting's bound",
                   "kept compute setting" + (" (from compute_pipe.png)" if compute_png else ""),
                   panels[0]["ylabel"], ysize=None, grid="y")


def plot_pipes(rows, result: dict, out_dir: Path, margin: float) -> list[Path]:
    compute = plot_data.compute_data(rows, result)
    return _draw_each(out_dir, (
        (_draw_compute, "compute_pipe.png", compute),
        (lambda panels, out: _draw_data(panels, margin, out, compute is not None),
         "data_pipe.png", plot_data.data_panels(rows, result) or None)))


def _draw_each(out_dir: Path, pictures) -> list[Path]:  # (draw, file name, data): data not None
    return [draw(d, out_dir / name) for draw, name, d in pictures if d is not None]


def importance(study, out: Path, rows=(), phase: str = "e2e") -> Path | None:
    """Optuna's parameter importance of the knobs that can act on the runs' device."""
    import optuna  # only when a study is plotted: a grid sweep's report needs none of it
    from optuna.trial import TrialState

    from gpubench.search.study import measured_trials

    # each run once: a duplicate, a retry's first try, an interrupted claim is no extra trial
    done = [t for t in measured_trials(study) if t.state == TrialState.COMPLETE]
    devices = {r.record.env.get("device") for r in rows} - {None}
    params, why = plot_rules.importance_params([t.params for t in done], devices, rows)
    if why:
        log.info("parameter importance skipped: %s", why)
        return None
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory"
    try:
        measured = optuna.create_study(directions=study.directions)  # in memory: those trials
    finally:
        optuna.logging.set_verbosity(verbosity)
    measured.add_trials(done)
    try:
        imp = optuna.importance.get_param_importances(measured, params=params)
    except ImportError:  # fANOVA's forest needs scikit-learn; PED-ANOVA needs only numpy
        imp = optuna.importance.get_param_importances(
            measured, params=params, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as e:
        log.info("parameter importance skipped: %s", e)
        return None
    if not imp:
        return None
    names = list(imp)[::-1]
    fig, ax = pyplot().subplots(figsize=(6.8, 0.5 * len(names) + 1.8))
    ax.barh(names, [imp[n] for n in names])
    ax.set_xlabel(f"importance for {phase} images/sec (Optuna; sums to 1)")
    swept = sorted({k for t in done for k in t.params})
    inert = plot_rules.inert_knobs([t.params for t in done], devices, rows)
    # trials whose run flagged its own measurement: their noise is ranked as well as a knob
    noisy = {str(r.record.dir) for r in rows
             if r.record.dir is not None and plot_rules.flag_reasons(r)}
    flagged = sum(str(t.user_attrs["dir"]) in noisy for t in done if t.user_attrs.get("dir"))
    ranked = sum(1 for r in rows if r.full) if rows else None
    ax.set_title(plot_rules.importance_title(len(done), params, swept, inert, flagged, phase,
                                             ranked), fontsize=9, wrap=True)
    ax.grid(alpha=0.3, axis="x")
    return save(fig, out)


def plot_all(rows, out_dir: Path, rec, study=None, band=None) -> list[Path]:
    """`band`: a loader-only row -> its compute bound (workers plot)."""
    made = _draw_each(out_dir, (
        (_draw_curve, "throughput_vs_batch.png",
         plot_data.curve_data(rows, "batch_size", "batch size", rec, log2=True)),
        (_draw_curve, "throughput_vs_workers.png",
         plot_data.curve_data(rows, "num_workers", "loader workers", rec, band=band)),
        (_draw_memory, "memory_vs_batch.png", plot_data.memory_data(rows)),
        (_draw_pareto, "pareto.png", plot_data.pareto_data(rows, rec))))
    if study is not None:
        made.append(importance(study, out_dir / "importance.png", rows,
                               plot_rules.headline_phase(rows)))
    return [p for p in made if p is not None]
