"""The rules behind the sweep report's pictures, each a pure function of rows: which runs
flagged themselves, which runs a line may join, what a memory figure is, which knobs an
importance plot may rank; and how a row's figures are read (gpubench.report.plot_data builds
each picture's data from these, gpubench.report.plots draws it).

Rows are the report's rows (`gpubench.analysis.recommend.Row`, or any row with a `record`,
`knob()`, `throughput`, `feasible` and `full`); their run record is read through `row.record`
when present, else rebuilt from the row's results.json dict.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpubench.config.knobs import CUDA_ONLY, SHORT, WORKER_ONLY, compared
from gpubench.config.overrides import format_value
from gpubench.core.files import flatten
from gpubench.core.record import HEADLINE_ORDER, Flaw, Reason, RunRecord, Status
from gpubench.core.stats import holding, positive

BOUND_PHASES = ("loader", "compute")
SHORT_LABEL = "short screen / probe (not ranked)"
FRONT_LABEL = "Pareto front: no other full run is both faster and smaller in peak memory"
# lines drawn per plot at most (the recommended run's group first, then the fastest): more
# colours than this are not told apart; the other groups' runs are plain points
MAX_LINES = 6
# Optuna's importance from fewer trials than this ranks noise: with 6 knobs and 4 trials most
# knobs were sampled at one value or two, and one disturbed trial moves every bar
MIN_IMPORTANCE_TRIALS = 8
# on a CPU, precisions run the math their autocast dtype says; fp32, tf32 and torch_default
# differ only in CUDA's TF32 flags
CPU_MATH = {"amp_bf16": "bf16", "amp_fp16": "fp16"}


# --------------------------------------------------------------------------- reading rows


def record_of(row) -> RunRecord:
    rec = getattr(row, "record", None)
    if isinstance(rec, RunRecord):
        return rec
    return RunRecord.from_dict(getattr(row, "data", None) or {}, rung=getattr(row, "rung", "run"))


def knob(row, name: str) -> Any:
    """A knob by its short name (`batch_size`, gpubench.config.knobs.SHORT), whether the
    row's `knob()` takes short names or config keys (`loader.batch_size`)."""
    for key in (name, *SHORT[name]):
        try:
            v = row.knob(key)
        except KeyError:  # a row that knows only the other spelling
            continue
        # a config section is no knob value: by config key "precision" is the whole
        # {name: ...} node, its value is precision.name
        if v is not None and not isinstance(v, (dict, list)):
            return v
    return None


def status_of(row) -> Status:
    return record_of(row).status


def peak_of(row) -> float | None:
    peak = getattr(row, "peak", None)
    return peak if peak is not None else record_of(row).peak_memory_fraction


def ceiling_of(rows) -> float:
    def one(r):
        c = getattr(r, "ceiling", None)
        return float(c if c is not None else record_of(r).memory_ceiling)

    return Counter(one(r) for r in rows).most_common(1)[0][0]


def phase_ips(row, phase: str) -> float | None:
    """A row's images/sec in one phase (None when that phase did not measure)."""
    rec = record_of(row)
    ph = rec.phases.get(phase)
    v = ph.images_per_sec if ph is not None else None
    if v is None:
        v = rec.phase_figure(phase)[0]
    return float(v) if positive(v) else None


def phase_interval(row, phase: str) -> tuple[float, float] | None:
    """A phase's 95% interval over its windows (holding its figure); the figure itself when
    the phase measured one window; None when it did not measure."""
    v = phase_ips(row, phase)
    if v is None:
        return None
    rec = record_of(row)
    ph = rec.phases.get(phase)
    ci = (ph.images_per_sec_ci if ph is not None else None) or rec.phase_figure(phase)[1]
    return holding(ci, v)


def interval(row) -> tuple[float, float]:
    """The 95% interval of a row's throughput, as the ranking prints it (`Row.interval`)."""
    iv = getattr(row, "interval", None)
    return tuple(iv) if iv is not None else record_of(row).throughput_interval


def headline_phase(rows) -> str:
    """The phase the rows' throughput is (e2e, else compute, else loader, as RunRecord's
    `throughput`), by majority over rows that measured one; e2e when none says."""
    votes = Counter()
    for r in rows:
        for phase in HEADLINE_ORDER:
            if phase_ips(r, phase) is not None:
                votes[phase] += 1
                break
    return votes.most_common(1)[0][0] if votes else HEADLINE_ORDER[0]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def precision_of(r) -> str:
    return str(knob(r, "precision") or "?")


def group_by(rows, key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


# --------------------------------------------------------------------------- the rules


def flag_reasons(row) -> list[Reason]:
    """Why a measured run's figures are not to be read as a bound: the reasons it found in its
    own measurement (noise_reasons), or its confirm step's re-measurements disturbed or in
    disagreement (`Row.stable`). Empty for a run that found nothing."""
    rec = record_of(row)
    if not rec.status.measured:
        return []
    reasons = list(rec.noise_reasons)
    if rec.measurement_stable is False and not reasons:
        reasons = [Reason(Flaw.other, "measurement unstable (reasons not recorded)")]
    if not reasons and getattr(row, "stable", True) is False:
        reasons = [Reason(Flaw.unconfirmed,
                          "re-measured by the confirm step: disturbed, failed or disagreed")]
    return reasons


# a noise reason's kind in a word or two for a legend; any other kind: "disturbed"
FLAW_WORDS = {Flaw.queue: "queue-timed", Flaw.cut_short: "cut short", Flaw.too_short: "too short",
              Flaw.warmup: "warm-up unsettled", Flaw.few_windows: "too few windows",
              Flaw.unconfirmed: "unconfirmed"}


def flag_kind(reason: Reason) -> str:
    return FLAW_WORDS.get(reason.kind, "disturbed")


def flagged_label(rows) -> str:
    """The legend entry of the flagged runs among `rows`, naming the kinds found."""
    kinds = sorted({flag_kind(x) for r in rows for x in flag_reasons(r)})
    return f"flagged run ({', '.join(kinds)}): not joined, not a bound"


def _knobs(row) -> dict[str, Any]:
    """What the run ran, as dotted config keys: every key that tells runs apart
    (gpubench.config.knobs.compared: the report's table has a column for each that varies)."""
    cfg = flatten(record_of(row).config or {})
    return {k: v for k, v in cfg.items() if compared(k)}


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
    one value, groups past MAX_LINES, slower repeats at one value). Along the workers, a
    0-worker run joins every line of its setup: its worker-only knobs (prefetch, thread or
    process workers...) are inert (gpubench.config.knobs.WORKER_ONLY), not another setting.
    The recommended run's group comes first, then by the group's fastest run."""
    along = SHORT[name][0]
    zero = [r for r in rows if along == "loader.num_workers" and knob(r, name) == 0]
    some = [r for r in rows if not any(r is z for z in zero)]
    # what the lines hold fixed: what varied among the runs with workers, and what else sets
    # a 0-worker run apart (its model, its batch), never its inert worker-only knobs
    keys = sorted(set(held_fixed(some, along)) | {
        k for k in held_fixed(rows, along) if k not in WORKER_ONLY}) if zero else \
        held_fixed(rows, along)
    groups = group_by(some or zero, lambda r: tuple(repr(_knobs(r).get(k)) for k in keys))
    for z in zero if some else ():
        joins = [g for g in groups.values()
                 if all(repr(_knobs(z).get(k)) == repr(_knobs(g[0]).get(k))
                        for k in keys if k not in WORKER_ONLY)]
        for g in joins or [groups.setdefault(("zero", id(z)), [])]:
            g.append(z)
    lines, rest, seen = [], [], set()
    for rs in groups.values():
        best: dict = {}
        for r in rs:
            x = knob(r, name)
            if x not in best or r.throughput > best[x].throughput:
                best[x] = r
        rest += [r for r in rs if best[knob(r, name)] is not r and id(r) not in seen]
        seen |= {id(r) for r in rs}
        lines.append([best[x] for x in sorted(best)])

    def rank(line):
        return (not any(r is chosen for r in line), -max(r.throughput for r in line))

    lines.sort(key=rank)
    out, drawn = [], set()
    for i, line in enumerate(lines):
        # the first group is always a line (also a lone point: it carries the bounds)
        if i == 0 or (len(line) > 1 and len(out) < MAX_LINES):
            # labelled by a run with workers: a 0-worker run's worker-only knobs are inert
            named = next((r for r in line if not any(r is z for z in zero)), line[0])
            out.append((group_label(named, keys), line))
            drawn |= {id(r) for r in line}
        else:
            rest += line
    # a 0-worker run on a drawn line is no lone point beside it too
    rest = list({id(r): r for r in rest if id(r) not in drawn}.values())
    return out, rest


def memory_axis(rows) -> dict:
    """What the peak memory figure is: device memory on a GPU, summed RSS on a CPU."""
    srcs = {record_of(r).memory_source or ("host_rss" if record_of(r).env.get("device") == "cpu"
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
    out = [k for k in names if k.lstrip("+") in CUDA_ONLY]
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
    if len(varied) < 2:  # one knob alone always gets all the importance: a bar that says nothing
        return [], (f"{len(varied)} parameter(s) varied and can act on this device, 2 needed")
    return varied, None


IMPORTANCE_QUESTION = "Which knobs moved {phase} throughput most?"


def importance_title(n_trials: int, used: list[str], swept: list[str],
                     inert: list[str] = (), flagged: int = 0, phase: str = "e2e",
                     ranked: int | None = None) -> str:
    """The importance picture's title: its question, how many of the study's trials it rests on
    (and the report's ranked runs, where they differ: a resumed study keeps earlier trials),
    how many of them flagged their own measurement (noise ranks as well as a knob), and what
    it left out."""
    left = sorted(set(swept) - set(used) - set(inert))
    out = [IMPORTANCE_QUESTION.format(phase=phase) + "\n"
           + f"from the study's {n_trials} complete trials"
           + (f" (the ranking holds {ranked} runs)" if ranked not in (None, n_trials) else "")
           + (f", {flagged} of them flagged their own measurement: their noise is ranked "
              "too, so read it as a hint" if flagged else "")]
    if inert:
        out.append(f"left out, no effect on a CPU: {', '.join(sorted(inert))}")
    if left:
        out.append(f"left out, did not vary: {', '.join(left)}")
    return "; ".join(out)

