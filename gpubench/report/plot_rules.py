"""The rules behind the sweep report's pictures, pure functions of its rows: flagged runs, what
a line may join, what a memory figure is, which knobs importance may rank."""

from __future__ import annotations

from collections import Counter
from enum import Enum
from typing import Any

from gpubench.analysis.labels import FLAWS, flaw_words, rerun_text
from gpubench.analysis.recommend import acted, acting
from gpubench.analysis.select import loader_only
from gpubench.config.knobs import CUDA_ONLY, SHORT, WORKER_ONLY, compared, knob_setting
from gpubench.config.overrides import format_value
from gpubench.config.paths import CONFIG_DIR
from gpubench.core.record import HEADLINE_ORDER, Flaw, Reason, RunRecord
from gpubench.core.stats import Est, count

BOUND_PHASES = ("loader", "compute")
SHORT_LABEL = "short screen / probe (not ranked)"
FRONT_LABEL = "Pareto front: no other full run is both faster and smaller in peak memory"
# lines per plot at most (the recommended run's first, then the fastest): more colours are not
# told apart; the other groups' runs are plain points
MAX_LINES = 6
# importance from fewer trials ranks noise: 6 knobs and 4 trials sample most knobs at one value
# or two, and one disturbed trial moves every bar
MIN_IMPORTANCE_TRIALS = 8
# on a CPU a precision runs its autocast dtype; fp32, tf32, torch_default differ in TF32 flags
CPU_MATH = {"amp_bf16": "bf16", "amp_fp16": "fp16"}


def knob(row, name: str) -> Any:
    """A knob by its short name, whether `row.knob()` takes those or keys; a section is no value."""
    return next((v for key in (name, *SHORT[name])
                 if (v := row.knob(key)) is not None and not isinstance(v, (dict, list))), None)


def ceiling_of(rows) -> float:
    return Counter(float(r.ceiling) for r in rows).most_common(1)[0][0]


def phase_est(rec: RunRecord, phase: str) -> Est | None:
    """A phase's images/sec and interval (its phase record's, else the run's headline's)."""
    ph = rec.phases.get(phase)
    if ph is not None and (e := Est.of(ph.images_per_sec, ph.images_per_sec_ci)):
        return e
    return Est.of(*rec.phase_figure(phase))


def headline_phase(rows) -> str:
    """The phase the rows' throughput is, by majority."""
    votes = Counter(next((p for p in HEADLINE_ORDER if phase_est(r.record, p)), None) for r in rows)
    return next((p for p, _ in votes.most_common() if p is not None), HEADLINE_ORDER[0])


def group_of(key: str, value: Any) -> str:
    """A `<group>.name` key set to one of the group's configs: the group; else the key."""
    group, _, leaf = key.partition(".")
    return group if leaf == "name" and (CONFIG_DIR / group / f"{value}.yaml").is_file() else key


def as_override(key: str, value: Any) -> str:
    """A command-line override, a group by its config's name (`precision=amp_bf16`)."""
    return f"{group_of(key, value)}={format_value(value)}"


def group_by(rows, key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def flag_reasons(row) -> list[Reason]:
    """Why a measured run's figures are no bound: its noise_reasons, or its re-measurements'."""
    rec = row.record
    if not rec.status.measured:
        return []
    reasons = list(rec.noise_reasons)
    if rec.measurement_stable is False and not reasons:
        reasons = [Reason(Flaw.other, "measurement unstable (reasons not recorded)")]
    if not reasons and not row.stable:  # its re-measurements' flaws, as the ranking's status
        by = "the confirm step" if row.stepped else "a run repeating it"
        reasons = [Reason(k, f"re-measured by {by}: {FLAWS[k].word}") for k in row.flaws] or [
            Reason(Flaw.unconfirmed, f"re-measured by {by}: the measurements disagreed")]
    return reasons


def all_flagged(rows) -> str:
    """`every full run flagged its own measurement (rerun on a quiet machine)`."""
    what = "loader-only run" if rows and all(loader_only(r.record) for r in rows) else "full run"
    return (f"every {what} flagged its own measurement "
            f"({rerun_text(x.kind for r in rows for x in flag_reasons(r))})")


def flagged_label(rows) -> str:
    kinds = flaw_words(x.kind for r in rows for x in flag_reasons(r))
    return f"flagged run ({', '.join(kinds)}): not joined, not a bound"


def knobs_of(row) -> dict[str, Any]:
    """Every config key that tells runs apart where it acts (a CPU's pin_memory names no line)."""
    return {k: v for k, v in acted(row.record).items() if compared(k)}


def held_fixed(rows, key: str) -> list[str]:
    """The keys but `key` whose value differs between `rows` where it acts: a worker-only knob
    inert at 0 workers differs in nothing (it named a series `prefetch_factor=null`)."""
    return [k for k in differing([knobs_of(r) for r in rows]) if k != key]


def differing(dicts: list[dict], absent: bool = False) -> list[str]:
    """The keys whose values differ among the dicts that hold them (`absent`: among all of
    them, a dict without the key holding None)."""
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({repr(d.get(k)) for d in dicts if absent or k in d}) > 1]


def knob_part(values: dict, worker_only: bool = False) -> tuple:
    """The worker-only knobs of `values` (config key -> value), or every other one, as a key."""
    return tuple(sorted((k, repr(v)) for k, v in values.items()
                        if (k in WORKER_ONLY) == worker_only))


def worker_groups(items: list, workers, values) -> list[list]:
    """`items` by their knobs but the workers, those with workers by their worker-only knobs too;
    a 0-worker item (those inert) joins every group of its setup, first."""
    out = []
    for rs in group_by(items, lambda r: knob_part(values(r))).values():
        zero = [r for r in rs if workers(r) == 0]
        some = group_by([r for r in rs if workers(r) != 0], lambda r: knob_part(values(r), True))
        out += [zero + g for g in some.values()] or [zero]
    return out


class Apart(Enum):
    """Why a run is on no line of a curve: its legend entry."""

    repeat = ("{phase}, the settings of a line's point again:\n"
              "a slower run (a line takes the fastest)")
    alone = "{phase}, other settings (no line: no run\ndiffers from it in {xlabel} alone)"
    beyond = f"{{phase}}, other settings (no line: at most\n{MAX_LINES} lines are drawn)"


def line_groups(rows, name: str, chosen=None) -> tuple[list[tuple[str, list]], list]:
    """Runs joined along knob `name` by every other knob that varied: lines as (label, runs), the
    recommended run's first, then the fastest; the rest as (run, Apart)."""
    along = SHORT[name][0]

    def workers(r):
        return knob(r, name) if along == "loader.num_workers" else None

    keys = held_fixed(rows, along)
    lines, rest = [], {}  # rest by id: a 0-worker run is in every line of its setup
    for rs in worker_groups(rows, workers, lambda r: {k: knobs_of(r).get(k) for k in keys}):
        best: dict = {}
        for r in sorted(rs, key=lambda r: -r.throughput):  # the fastest run of each value
            best.setdefault(knob(r, name), r)
        rest.update({id(r): (r, Apart.repeat) for r in rs if best[knob(r, name)] is not r})
        lines.append([best[x] for x in sorted(best)])
    lines.sort(key=lambda ln: (not any(r is chosen for r in ln), -max(r.throughput for r in ln)))
    out = []
    for i, line in enumerate(lines):
        # the first group is always a line (a lone point too: it carries the bounds)
        if i == 0 or (len(line) > 1 and len(out) < MAX_LINES):
            # named by a run with workers (a 0-worker one's worker knobs are inert)
            f = knobs_of(next((r for r in line if workers(r) != 0), line[0]))
            out.append((", ".join(knob_setting(k, f.get(k)) for k in keys), line))
        else:
            rest.update({id(r): (r, Apart.alone if len(line) == 1 else Apart.beyond) for r in line})
    # a 0-worker run on a drawn line is no lone point beside it too
    drawn = {id(r) for _, line in out for r in line}
    return out, [rw for k, rw in rest.items() if k not in drawn]


def memory_axis(rows) -> dict:
    """What the peak memory figure is: device memory on a GPU, summed RSS on a CPU."""
    srcs = {r.record.memory_source or ("host_rss" if r.record.env.get("device") == "cpu"
                                       else "device") for r in rows}
    if srcs == {"host_rss"}:
        return {"label": "peak RSS, main process + loader workers summed, % of host RAM",
                "note": "CPU run: summed RSS counts shared pages once per process (an upper "
                        "bound), not device memory"}
    if "host_rss" in srcs:
        return {"label": "peak memory, % of the device (CPU runs: summed RSS, % of host RAM)",
                "note": "CPU runs: summed RSS of the main process and its workers (an upper "
                        "bound)"}
    return {"label": "peak memory, % of the device", "note": None}


def inert_knobs(params: list[dict], devices: set[str], rows=()) -> list[str]:
    """Swept parameters that act in none of `rows`, or on a CPU (every run's) the CUDA-only knobs
    and a precision whose values all run the same math."""
    swept = {k for p in params for k in p}
    runs = [r for r in rows if r.record.config]
    never = {k for k in swept if runs and not any(acting(r, k.lstrip("+")) for r in runs)}
    if not devices or devices - {"cpu"}:
        return sorted(never)
    return sorted(never | {k for k in swept if k.lstrip("+") in CUDA_ONLY or (
        k.lstrip("+") in ("precision", "precision.name")
        and len({CPU_MATH.get(str(p[k]), "fp32") for p in params if k in p}) < 2)})


def importance_params(params: list[dict], devices: set[str],
                      rows=()) -> tuple[list[str], str | None]:
    """The trials' parameters that varied and can act on the device, or ([], why not)."""
    if len(params) < MIN_IMPORTANCE_TRIALS:
        return [], f"{len(params)} complete trials, {MIN_IMPORTANCE_TRIALS} needed"
    inert = inert_knobs(params, devices, rows)
    varied = [k for k in differing(params, absent=True) if k not in inert]
    if len(varied) < 2:  # one knob alone always gets all the importance: a bar that says nothing
        return [], (f"{count(len(varied), 'parameter')} varied and can act on this device, "
                    "2 needed")
    return varied, None


def importance_title(n_trials: int, used: list[str], swept: list[str],
                     inert: list[str] = (), flagged: int = 0, phase: str = "e2e",
                     ranked: int | None = None) -> str:
    left = sorted(set(swept) - set(used) - set(inert))
    out = [f"Which knobs moved {phase} throughput most?\nfrom the study's {n_trials} complete "
           "trials"
           + (f" (the ranking holds {ranked} runs)" if ranked not in (None, n_trials) else "")
           + (f", {flagged} of them flagged their own measurement: their noise is ranked "
              "too, so read it as a hint" if flagged else "")]
    out += [f"left out, {why}: {', '.join(sorted(ks))}"
            for why, ks in (("no effect on a CPU", inert), ("did not vary", left)) if ks]
    return "; ".join(out)
