"""The report's workers answer: how many loader workers a setup needs, from its loader-only runs
against its compute bound (the sweep's `compute/` folder, the rows, `--compute` runs)."""

from __future__ import annotations

import shlex
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpubench.analysis import workers
from gpubench.analysis.labels import FLAWS, flaw_words, rerun_text
from gpubench.analysis.recommend import Row
from gpubench.analysis.select import knob_key, loader_only, setup_text
from gpubench.config.keys import Role
from gpubench.config.knobs import COMPUTE, DATA_KEYS, role
from gpubench.config.overrides import format_value
from gpubench.config.settings import as_run
from gpubench.core.record import Reason, RunRecord, find_runs, load, longer
from gpubench.core.stats import count
from gpubench.report import plot_rules
from gpubench.report.plot_rules import flag_reasons

# what a compute measurement drops from a loader job's command line: the data pipe's knobs do
# not change it (as knobs.COMPUTE keeps for an MLflow run)
NOT_FOR_COMPUTE = (*DATA_KEYS, "bench.phases")


@dataclass
class Group:
    """The loader-only runs of one setup (every knob but the workers) and their answer."""
    rows: list[Row]
    used: list[Row]  # the runs the rule judged
    pick: workers.WorkersPick
    sources: list[RunRecord] = field(default_factory=list)  # the compute bound's measurements
    failed: list[RunRecord] = field(default_factory=list)  # compute runs that measured nothing

    @property
    def flagged(self) -> list[Row]:
        return [r for r in self.rows if flag_reasons(r)]

    @property
    def flagged_bound(self) -> bool:  # every compute run of the bound flagged itself
        return bool(self.sources) and all(m.measurement_stable is False for m in self.sources)

    @property
    def flagged_loader(self) -> bool:  # every loader run flagged itself: flagged ones judged
        return any(map(flag_reasons, self.used))

    @property
    def unconfirmed(self) -> bool:
        return self.flagged_bound or self.flagged_loader

    @property
    def kind(self) -> str | None:  # loader.worker_type of the runs with workers
        return next((r.knob("worker_type") for r in self.rows if r.knob("num_workers")), None)

    named: tuple[str, ...] = ()  # the keys that set groups shown together apart (loader_answer)

    @property
    def shown(self) -> Row:
        """The run the heading writes: one with workers where there is one (a 0-worker run joins
        every group of its setup: its worker-only knobs are inert)."""
        return next((r for r in self.rows if r.knob("num_workers")), self.rows[0])

    @property
    def setup(self) -> str:  # without its workers (`, thread workers` where they are threads)
        rec = self.shown.record
        threads = ", thread workers" if self.kind == "thread" else ""
        return (f"{setup_text(rec, named=self.named, workers=False)}{threads} "
                f"({rec.env.get('device') or '?'})")


@dataclass
class LoaderAnswer:
    rows: list[Row]  # every loader-only run: what the report's table and plots show
    groups: list[Group]
    lines: list[str]

    def band(self, row) -> dict | None:
        for g in self.groups:
            if any(r is row for r in g.rows) and (c := g.pick.compute) is not None:
                flag = " (flagged: unconfirmed)" if g.flagged_bound else ""
                return {"y": c.value, "lo": c.lo, "hi": c.hi, "threshold": g.pick.threshold,
                        "margin": g.pick.tolerance, "label": f"compute bound{flag}, same "
                                                             f"model/batch/precision:\n{c} img/s"}
        return None

    def summary(self) -> list[dict]:
        return [{"setup": g.setup, "worker_type": g.kind, "num_workers": (p := g.pick).num_workers,
                 "unblocks": p.unblocks, "margin_required": p.tolerance,
                 "loader": {str(w): [r.value, r.lo, r.hi] for w, r in sorted(p.rates.items())},
                 "compute": None if (c := p.compute) is None else [c.value, c.lo, c.hi],
                 "compute_from": [_named(r) for r in g.sources], "unconfirmed": g.unconfirmed,
                 "flagged": [x.label for x in g.flagged], "judged": [x.label for x in g.used],
                 "answer": p.answer()} for g in self.groups]


def _knobs(r: Row) -> dict:  # every knob of the run but its workers and how it measured
    return {k: v for k, v in r.flat.items()
            if k != "loader.num_workers" and role(k) is not Role.measure}


def _named(m: RunRecord) -> str:  # a compute measurement's folder, else (MLflow) its run id
    return str(m.dir) if m.dir is not None else f"MLflow run {m.extra.get('mlflow_run_id', '?')}"


def read_compute(paths: list[str] | None) -> list[RunRecord]:  # the runs named with --compute
    out = []
    for p in paths or []:
        rec = load(Path(p).expanduser())
        if rec is None:
            raise SystemExit(f"gpubench.report: --compute {p}: no results.json there (it must be "
                             "a run folder or its results.json)")
        if workers.compute_rate(rec) is None:
            phases = format_value(rec.knob("bench.phases"))
            raise SystemExit(f"gpubench.report: --compute {p}: it measured no compute phase "
                             f"(status {rec.status}, bench.phases={phases}); name a run with "
                             "bench.phases=[compute] or a full run")
        out.append(rec)
    return out


def sweep_compute(sweep_dir: Path, rows: list[Row]) -> list[RunRecord]:
    """The compute runs in `<sweep dir>/compute/` not rows already."""
    have = {str(r.record.dir) for r in rows}
    root = sweep_dir / workers.COMPUTE_DIR
    recs = [load(d) for d in find_runs(root)] if root.is_dir() else []
    return [r for r in recs if r is not None and str(r.dir) not in have]


def _compute_command(row: Row) -> str:
    """The loader job's command line (its overrides.yaml, else compute knobs) for compute alone."""
    overrides = None
    with suppress(OSError, yaml.YAMLError):
        if row.record.dir is not None:  # a run read from MLflow has no folder
            overrides = yaml.safe_load((Path(row.record.dir) / ".hydra/overrides.yaml")
                                       .read_text())
    if isinstance(overrides, list):
        keep = [o for o in map(str, overrides)
                if not o.startswith(("hydra.", "hydra/"))
                and o.partition("=")[0].lstrip("+~") not in NOT_FOR_COMPUTE]
    else:  # a run read from MLflow: its compute knobs as overrides
        keys = [knob_key(row.flat.get, n) for n in COMPUTE]
        keep = [plot_rules.as_override(k, row.flat[k]) for k in keys if row.flat.get(k) is not None]
    return " ".join(["python -m gpubench", *map(shlex.quote, keep),
                     shlex.quote("bench.phases=[compute]")])


def loader_answer(rows: list[Row], found: list[RunRecord], named: list[RunRecord],
                  source: str, tolerance: float = workers.TOLERANCE) -> LoaderAnswer | None:
    """Against the compute bounds of `rows`, `found`, `named` (one bounding nothing: SystemExit)."""
    loaders = [r for r in rows if loader_only(r.record)]
    if not loaders:
        return None
    sets = plot_rules.worker_groups(loaders, lambda r: r.knob("num_workers"), _knobs)
    keys = [workers.setup_of_run(rs[0].record) for rs in sets]
    for rec in named:
        if (mine := workers.setup_of_run(rec)) not in keys:  # name the first knob that differs
            differs = next(f"its {n} {format_value(a)} is not the loader runs' {format_value(b)}"
                           for (n, a), (_, b) in zip(mine, keys[0], strict=True) if a != b)
            raise SystemExit(f"gpubench.report: --compute {rec.dir}: it bounds no loader-only "
                             f"run here: {differs}")
    # a run named with --compute may also be a row or in the sweep's compute folder: once
    unique = {str(m.dir) if m.dir is not None else id(m): m
              for m in [*(r.record for r in rows), *found, *named]}
    tried = [(workers.setup_of_run(m), m) for m in unique.values()
             if m.knob("bench.phases") == ["compute"] and not m.status.measured]
    groups = []
    for rs, key in zip(sets, keys, strict=True):
        bound, sources = workers.compute_bound(unique.values(), key)
        # the unflagged loader runs; on a busy machine, those whose flaw only slows or widens
        done = [r for r in rs if r.record.status.measured]
        used = [r for r in done if not flag_reasons(r)] or [
            r for r in done if not any(FLAWS[x.kind].inflates for x in flag_reasons(r))]
        # a loader-only row's figure, pooled over its repeats as the ranking shows it
        good = [(r.knob("num_workers"), r.throughput, list(r.interval)) for r in used]
        pick = workers.fewest_workers(good, bound, tolerance, dict(key)["device"],
                                      [r.flat for r in rs],
                                      workers.least_cores(r.record for r in rs),
                                      str(longer(rs[0].record)))
        groups.append(Group(rs, used, pick, sources, [m for k, m in tried if k == key]))
    # the keys differing between groups (inert: no value), in each heading: no two read alike
    apart = tuple(plot_rules.differing([{k: v for k, v in as_run(g.shown.flat).items()
                                         if k in _knobs(g.shown)} for g in groups]))
    for g in groups:
        g.named = apart
    return LoaderAnswer(loaders, groups, _lines(groups, source))


def _kinds(reasons: list[Reason]) -> str:
    return ", ".join(flaw_words(x.kind for x in reasons)) or "unstable"


def _lines(groups: list[Group], source: str) -> list[str]:
    out = [f"workers answer (loader-only runs; the fewest workers whose loader interval clears "
           f"the compute bound's interval by {groups[0].pick.tolerance:.0%}):"]
    for g in groups:
        out.append(f"  {g.setup}, {count(len(g.rows), 'loader run')}:")
        if g.pick.num_workers is None and g.flagged:
            out.append("  workers: no answer: every loader run that measured read high (queue-"
                       "timed or cut short: a longer bench.steps)")
        elif g.unconfirmed:
            why = [w for w, on in (("every loader run", g.flagged_loader),
                                   ("the compute bound", g.flagged_bound)) if on]
            their = "their" if len(why) > 1 else "its"
            kinds = [x.kind for r in g.used for x in flag_reasons(r)] + [
                x.kind for m in (g.sources if g.flagged_bound else []) for x in m.noise_reasons]
            out.append(f"  unconfirmed, {' and '.join(why)} flagged {their} own measurement: "
                       f"{rerun_text(kinds)} to confirm; {g.pick.answer()}")
        else:
            out.append(f"  {g.pick.answer()}")
        judged = {id(r) for r in g.used}
        for head, rs in (("judged, though flagged", [r for r in g.flagged if id(r) in judged]),
                         ("left out, flagged", [r for r in g.flagged if id(r) not in judged])):
            if rs:
                out.append(f"    {head}: " + "; ".join(
                    f"run {r.label} ({workers.workers(r.knob('num_workers'))}: "
                    f"{_kinds(flag_reasons(r))})" for r in rs))
        for m in g.sources:
            seen = "measured once for this setup by the sweep" if m.dir is not None and \
                m.dir.parent.name == workers.COMPUTE_DIR else "a run of this setup"
            note = "" if m.measurement_stable is not False else (
                f"; flagged its own measurement: {_kinds(m.noise_reasons)}")
            out.append(f"    compute bound from {_named(m)} ({seen}: "
                       f"{workers.compute_rate(m)} img/s{note})")
        if g.pick.compute is None:
            out += [*(f"    the sweep's compute measurement did not measure: {m.dir} (status "
                      f"{m.status}: {m.error or 'no error recorded'})" for m in g.failed),
                    "    to answer: measure compute once at this setup, then name that run:",
                    f"      {_compute_command(g.rows[0])}",
                    # the report's own arguments, quoted (write.Source.args)
                    f"      python -m gpubench.report {source} --compute <that run's folder>"]
    # a setup measured with both kinds of workers: the fewest of either that clear compute
    setups = plot_rules.group_by(groups, lambda g: plot_rules.knob_part(_knobs(g.rows[0])))
    for gs in setups.values():
        clear = [g for g in gs if g.kind and g.pick.unblocks]
        if len({g.kind for g in gs if g.kind}) > 1 and clear:
            best = min(clear, key=lambda g: (g.pick.num_workers, g.kind != "thread"))
            n = best.pick.num_workers
            if not n:  # no worker of either kind: the kind does not matter
                out.append("  which kind: neither, 0 workers: the main process alone loads "
                           "faster than compute")
                continue
            out.append(f"  which kind: {best.kind}, {count(n, 'worker')}: the "
                       "fewest workers of either kind whose loader clears compute (at the same "
                       "count, threads: no process per worker)")
    return out
