"""What the sweep report's pictures show, as plain data (gpubench.report.plots draws it).

Each function takes the report's rows (`gpubench.analysis.recommend.Row`, or any row with a
`record`, `knob()`, `throughput`, `feasible` and `full`) and decides the points, whiskers,
lines, labels and axis ranges; the tests check these on constructed rows. The rules:

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
  rest): past the top it is drawn at the edge with its figure written beside it;
- short screens and max-batch probes are apart too (hollow grey), never on a curve or front;
- a plot is made only when its knob varied (two or more values);
- on a CPU the memory figure is the summed RSS of the main process and its loader workers
  (pages they share count once per process: an upper bound), against host RAM, and says so;
- parameter importance needs `MIN_IMPORTANCE_TRIALS` complete trials, and leaves out knobs
  that cannot act on the device every run used (on a CPU: pin_memory, cudnn.benchmark, and
  precisions that differ only in CUDA's TF32 flags).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpubench.analysis.recommend import HOW_MEASURED
from gpubench.config.overrides import format_value
from gpubench.core.files import flatten
from gpubench.core.record import RunRecord
from gpubench.core.stats import holding

BOUND_PHASES = ("loader", "compute")
SHORT_LABEL = "short screen / probe (not ranked)"
FRONT_LABEL = "Pareto front: no other full run is both faster and smaller in peak memory"
# headroom above the highest point: the star and the top markers stay inside the axes
HEADROOM = 1.15
# values spanning more than this factor get a log y axis
LOG_SPAN = 20.0
# lines drawn per plot at most (the recommended run's group first, then the fastest): more
# colours than this are not told apart; the other groups' runs are plain points
MAX_LINES = 6
# Optuna's importance from fewer trials than this ranks noise: with 6 knobs and 4 trials most
# knobs were sampled at one value or two, and one disturbed trial moves every bar
MIN_IMPORTANCE_TRIALS = 8
# knobs with no effect on a CPU-only run: pinned memory is for copies to a GPU (the loader
# pins only with device cuda), cudnn.benchmark tunes cuDNN's convolutions
CUDA_ONLY_KNOBS = ("loader.pin_memory", "bench.cudnn_benchmark")
# on a CPU, precisions run the math their autocast dtype says; fp32, tf32 and torch_default
# differ only in CUDA's TF32 flags
CPU_MATH = {"amp_bf16": "bf16", "amp_fp16": "fp16"}


# --------------------------------------------------------------------------- reading rows


def _record(row) -> RunRecord:
    rec = getattr(row, "record", None)
    if isinstance(rec, RunRecord):
        return rec
    return RunRecord.from_dict(getattr(row, "data", None) or {}, rung=getattr(row, "rung", "run"))


# the knobs the plots draw, by the report's short name and by their config key
DOTTED = {"batch_size": "loader.batch_size", "num_workers": "loader.num_workers",
          "precision": "precision.name"}


def knob(row, name: str) -> Any:
    """A knob by its short name (`batch_size`), whether the row's `knob()` takes the report's
    short names or config keys (`loader.batch_size`)."""
    for key in (name, DOTTED[name]):
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
        v = getattr(rec, _FIELD[phase])
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


_FIELD = {"loader": "loader_images_per_sec", "compute": "compute_images_per_sec",
          "e2e": "images_per_sec"}


def phase_interval(row, phase: str) -> tuple[float, float] | None:
    """A phase's 95% interval over its windows (holding its figure); the figure itself when
    the phase measured one window; None when it did not measure."""
    v = phase_ips(row, phase)
    if v is None:
        return None
    rec = _record(row)
    ph = rec.phases.get(phase)
    ci = (ph.images_per_sec_ci if ph is not None else None) or getattr(rec, _FIELD[phase] + "_ci")
    return holding(ci, v)


def interval(row) -> tuple[float, float]:
    """The 95% interval of a row's throughput, as the ranking prints it (`Row.interval`)."""
    iv = getattr(row, "interval", None)
    return tuple(iv) if iv is not None else _record(row).throughput_interval


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


def _group(rows, key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


# --------------------------------------------------------------------------- the rules


def flag_reasons(row) -> list[str]:
    """Why a measured run's figures are not to be read as a bound: the reasons it found in its
    own measurement (noise_reasons), or its confirm step's re-measurements disturbed or in
    disagreement (`Row.stable`). Empty for a run that found nothing."""
    rec = _record(row)
    if not rec.status.measured:
        return []
    reasons = list(rec.noise_reasons)
    if rec.measurement_stable is False and not reasons:
        reasons = ["measurement unstable (reasons not recorded)"]
    if not reasons and getattr(row, "stable", True) is False:
        reasons = ["re-measured by the confirm step: disturbed, failed or disagreed"]
    return reasons


def flag_kind(reason: str) -> str:
    """A noise reason (gpubench.analysis.noise) in a word or two for a legend."""
    if "in flight" in reason:
        return "queue-timed"
    if "cut short" in reason:
        return "cut short"
    if "warm-up did not settle" in reason:
        return "warm-up unsettled"
    if "interval, not" in reason:
        return "too few windows"
    if "confirm step" in reason:
        return "unconfirmed"
    return "disturbed"


def flagged_label(rows) -> str:
    """The legend entry of the flagged runs among `rows`, naming the kinds found."""
    kinds = sorted({flag_kind(x) for r in rows for x in flag_reasons(r)})
    return f"flagged run ({', '.join(kinds)}): not joined, not a bound"


def _knobs(row) -> dict[str, Any]:
    """What the run ran, as dotted config keys: every key except how long and how it was
    measured and tracked (HOW_MEASURED), so measured knobs like bench.cudnn_benchmark count."""
    cfg = flatten(_record(row).config or {})
    return {k: v for k, v in cfg.items() if not k.startswith(HOW_MEASURED)}


def held_fixed(rows, key: str) -> list[str]:
    """The config keys other than `key` whose value differs between `rows`: the knobs a line
    along `key` must hold fixed."""
    flats = [_knobs(r) for r in rows]
    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if k != key and len({repr(f.get(k)) for f in flats}) > 1]


def short_key(key: str) -> str:
    """`loader.num_workers` -> `num_workers`, `precision.name` -> `precision`."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def group_label(row, keys: list[str]) -> str:
    f = _knobs(row)
    return ", ".join(f"{short_key(k)}={format_value(f.get(k))}" for k in keys)


def line_groups(rows, name: str, chosen=None) -> tuple[list[tuple[str, list]], list]:
    """Runs that may be joined along knob `name`: grouped by every other knob that varied.
    Returns the lines as (label, runs, one per value, sorted) and the rest (runs of groups with
    one value, groups past MAX_LINES, slower repeats at one value). The recommended run's
    group comes first, then by the group's fastest run."""
    keys = held_fixed(rows, DOTTED[name])
    groups = _group(rows, lambda r: tuple(repr(_knobs(r).get(k)) for k in keys))
    lines, rest = [], []
    for rs in groups.values():
        best: dict = {}
        for r in rs:
            x = knob(r, name)
            if x not in best or r.throughput > best[x].throughput:
                best[x] = r
        rest += [r for r in rs if best[knob(r, name)] is not r]
        lines.append([best[x] for x in sorted(best)])

    def rank(line):
        return (not any(r is chosen for r in line), -max(r.throughput for r in line))

    lines.sort(key=rank)
    out = []
    for i, line in enumerate(lines):
        # the first group is always a line (also a lone point: it carries the bounds)
        if i == 0 or (len(line) > 1 and len(out) < MAX_LINES):
            out.append((group_label(line[0], keys), line))
        else:
            rest += line
    return out, rest


def memory_axis(rows) -> dict:
    """What the peak memory figure is: device memory on a GPU, summed RSS on a CPU."""
    srcs = {_record(r).memory_source or ("host_rss" if _record(r).env.get("device") == "cpu"
                                         else "device") for r in rows}
    if srcs == {"host_rss"}:
        return {"label": "peak RSS, main process + loader workers summed, % of host RAM",
                "note": "CPU run: summed RSS counts shared pages once per process (an upper "
                        "bound), not device memory",
                "host": True}
    if "host_rss" in srcs:
        return {"label": "peak memory, % of the device (CPU runs: summed RSS, % of host RAM)",
                "note": "CPU runs: summed RSS of the main process and its workers (an upper "
                        "bound)", "host": True}
    return {"label": "peak memory, % of the device", "note": None, "host": False}


def inert_knobs(params: list[dict], devices: set[str]) -> list[str]:
    """Swept parameters that cannot change a run on the device every run used: on a CPU,
    pin_memory and cudnn.benchmark, and a precision whose values all run the same math there
    (fp32, tf32, torch_default). Empty when any run used a GPU."""
    if not devices or devices - {"cpu"}:
        return []
    names = {k for p in params for k in p}
    out = [k for k in names if k.lstrip("+") in CUDA_ONLY_KNOBS]
    for k in names:
        if k.lstrip("+") in ("precision", "precision.name"):
            maths = {CPU_MATH.get(str(p[k]), "fp32") for p in params if k in p}
            if len(maths) < 2:
                out.append(k)
    return sorted(out)


def importance_params(params: list[dict], devices: set[str],
                      min_trials: int = MIN_IMPORTANCE_TRIALS) -> tuple[list[str], str | None]:
    """The parameters an importance plot may rank, from the complete trials' params: those
    that varied and can act on the device. ([], why) when there is nothing fair to rank."""
    if len(params) < min_trials:
        return [], f"{len(params)} complete trials, {min_trials} needed"
    inert = set(inert_knobs(params, devices))
    names = sorted({k for p in params for k in p} - inert)
    varied = [k for k in names if len({repr(p.get(k)) for p in params}) > 1]
    if not varied:
        return [], "no parameter that varied can act on this device"
    return varied, None


def importance_title(n_trials: int, used: list[str], swept: list[str]) -> str:
    """The importance picture's title: how many trials it rests on, what it left out."""
    left = sorted(set(swept) - set(used))
    return (f"from {n_trials} complete trials"
            + (f"; left out (cannot act on this device, or did not vary): {', '.join(left)}"
               if left else ""))


# --------------------------------------------------------------------------- the data


def _pt(row, x) -> dict:
    lo, hi = interval(row)
    return {"x": x, "y": row.throughput, "lo": lo, "hi": hi}


def curve_data(rows, name: str, xlabel: str, rec=None, log2: bool = False) -> dict | None:
    """Throughput against knob `name`: lines of runs that differ in it alone, each point with
    its interval, the loader/compute bounds of the first line's runs; flagged runs, other
    groups' lone runs and short ones as separate points. Full-length feasible measurements
    only on lines (as the recommendation). None when the knob did not vary over them."""
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
    d = {
        "lines": lines,
        "rest": [_pt(r, knob(r, name)) for r in rest],
        "short": [_pt(r, knob(r, name)) for r in short],
        "flagged": [_pt(r, knob(r, name)) for r in flagged],
        "flagged_label": flagged_label(flagged),
        "star": star,
        "phase": phase,
        "xlabel": xlabel,
        "title": f"{phase} throughput by {xlabel}: a line joins runs that differ in {xlabel} "
                 "alone",
        "xticks": sorted({knob(r, name) for r in full} | {knob(r, name) for r in short}),
        "log2": log2,
    }
    d["integer_x"] = all(_is_int(x) for x in d["xticks"])
    _y_axis(d, [p for ln in lines for p in ln["points"] + [b for v in ln["bounds"].values()
                                                            for b in v]]
            + d["rest"] + d["short"], rows)
    return d


def _y_axis(d: dict, points: list[dict], rows) -> None:
    """The y range from every point but the flagged ones (they must not set the scale: a
    queue-timed loader run read 10x the rest); a flagged point past the top is drawn at the
    edge (`off_scale`) with its figure beside it. With nothing but flagged points, they set it."""
    trusted = points + ([{"y": d["star"]["y"], "lo": d["star"]["y"], "hi": d["star"]["y"]}]
                        if d["star"] else [])
    basis = trusted or d["flagged"]
    ys = [p["y"] for p in basis]
    span = [v for p in basis for v in (p["lo"], p["y"], p["hi"]) if v > 0]
    # a loader 20x faster than the training loop would flatten the curve that matters onto
    # the axis: a log axis keeps both readable
    log_y = min(ys) > 0 and max(ys) > LOG_SPAN * min(ys)
    ymin, ymax = (min(span) / 1.5, 1.6 * max(span)) if log_y else (0.0, HEADROOM * max(span))
    for p in d["flagged"]:
        p["off_scale"] = p["y"] > ymax
    labels = sorted({_record(r).interval_label for r in rows if _record(r).status.measured})
    whisker = labels[0] if len(labels) == 1 else "interval (coverage differs by run)"
    d.update(log_y=log_y, ymin=ymin, ymax=ymax,
             ylabel=f"{d['phase']} images/sec (whiskers: {whisker})"
                    + (", log scale" if log_y else ""))


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
    axis = memory_axis(pts)
    return {
        "groups": groups,
        "short": {"xs": [knob(r, "batch_size") for r in short], "ys": [100 * _peak(r) for r in short]},
        # an OOM's peak is the whole device
        "oom": {"xs": [knob(r, "batch_size") for r in oom], "ys": [100.0] * len(oom)},
        "ceiling": 100 * _ceiling(rows),
        "xticks": sorted({knob(r, "batch_size") for r in pts}),
        "ylabel": axis["label"],
        "note": axis["note"],
    }


def pareto_data(rows, rec=None) -> dict | None:
    """Throughput against peak memory for full measurements; the front is what no other
    unflagged full run beats on both. None with fewer than two full measured points."""
    pts = [r for r in rows if r.throughput > 0 and _peak(r) is not None]
    full = [r for r in pts if r.full]
    if len(full) < 2:
        return None
    flagged = [r for r in full if flag_reasons(r)]
    good = [r for r in full if not flag_reasons(r)]
    front, top = [], -1.0
    for r in sorted(good, key=lambda r: (_peak(r), -r.throughput)):
        if r.throughput > top:
            front.append(r)
            top = r.throughput
    short = [r for r in pts if not r.full]

    def xy(rs):
        return [_pt(r, 100 * _peak(r)) for r in rs]

    star = None
    if rec is not None and _peak(rec.chosen) is not None:
        star = {"x": 100 * _peak(rec.chosen), "y": rec.chosen.throughput}
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
        "ceiling": 100 * _ceiling(rows),
        "phase": headline_phase(rows),
        "xlabel": axis["label"],
        "note": axis["note"],
    }
    trusted = d["feasible"] + d["infeasible"] + d["short"] + (
        [{"y": star["y"], "lo": star["y"], "hi": star["y"]}] if star else [])
    basis = trusted or d["flagged"]
    d["ymax"] = HEADROOM * max(max(p["hi"], p["y"]) for p in basis)
    for p in d["flagged"]:
        p["off_scale"] = p["y"] > d["ymax"]
    labels = sorted({_record(r).interval_label for r in full})
    whisker = labels[0] if len(labels) == 1 else "interval (coverage differs by run)"
    d["ylabel"] = f"{d['phase']} images/sec (whiskers: {whisker})"
    return d
