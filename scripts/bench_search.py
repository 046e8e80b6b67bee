"""Search efficiency: how many trials the sweeper's sampler needs to reach 95% of the best
feasible throughput of a measured grid, replaying the grid as the objective.

    python scripts/bench_search.py                                   # docs/data/search_grid_cpu.csv
    python scripts/bench_search.py --seeds 100 --target 0.95 --ceiling 0.06
    python scripts/bench_search.py --make-grid outputs/multirun/.../  # results.json files -> CSV

Each replayed trial looks its configuration up in the table: the measured e2e images/sec is the
value and peak memory fraction - memory ceiling the constraint, as the sweeper tells Optuna after
a job. A configuration proposed again is not measured again (as in the sweeper) and does not
count as a trial. Screening is off: the table holds one full measurement per configuration.
The search space is the grid's axes written as the override strings a user would type.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpubench.core.record import RunRecord, Status  # noqa: E402
from gpubench.search.space import parse_search_space  # noqa: E402
from gpubench.search.study import MEMORY, copy_result, make_sampler, split_duplicates  # noqa: E402

GRID = ROOT / "docs" / "data" / "search_grid_cpu.csv"
AXES = {  # CSV column -> the override key a user sweeps
    "batch_size": "loader.batch_size",
    "num_workers": "loader.num_workers",
    "precision": "precision",
    "channels_last": "channels_last",
}
COLUMNS = [*AXES, "status", "images_per_sec", "peak_memory_fraction", "memory_ceiling"]


def _parse(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False, "True": True, "False": False}.get(v, v)


def load_grid(path: Path, ceiling: float | None) -> dict[tuple, RunRecord]:
    """One record per grid point: throughput, constraint and feasibility are gpubench.core.record's,
    exactly as the sweeper reads a job."""
    table = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            key = tuple(_parse(r[c]) for c in AXES)
            peak = float(r["peak_memory_fraction"]) if r["peak_memory_fraction"] else None
            table[key] = RunRecord(
                status=Status(r["status"]), images_per_sec=float(r["images_per_sec"] or 0.0),
                peak_memory_fraction=peak,
                memory_ceiling=ceiling if ceiling is not None else float(r["memory_ceiling"]))
    return table


def make_grid(sweep_dir: Path, out: Path) -> None:
    """A grid multirun's results.json files as the replay table."""
    rows = []
    for p in sorted(sweep_dir.rglob("results.json")):
        d = json.loads(p.read_text())
        c = d["config"]
        ips = d.get("images_per_sec") or 0.0
        rows.append([c["loader"]["batch_size"], c["loader"]["num_workers"],
                     c["precision"]["name"], str(c["channels_last"]).lower(), d["status"],
                     f"{ips:.2f}", d.get("peak_memory_fraction") or "", d["memory_ceiling"]])
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3])))
    print(f"{len(rows)} configurations -> {out}")


def space_of(table: dict[tuple, RunRecord]):
    axes = list(zip(*table, strict=True))
    overrides = []
    for key, values in zip(AXES.values(), axes, strict=True):
        vals = sorted(set(values), key=str)
        text = ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in vals)
        overrides.append(f"{key}=choice({text})")
    return parse_search_space(overrides)


def trials_to_target(table, space, sampler, target: float) -> int:
    """Measured trials until the best feasible value reaches `target` (the grid size if the
    sampler runs out of new configurations first)."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    keys = [AXES[c] for c in AXES]
    best, measured, dups_in_a_row = 0.0, 0, 0
    while measured < len(table) and dups_in_a_row < 1000:
        t = study.ask(space.distributions)
        _, dups = split_duplicates(study, [t])
        if dups:
            copy_result(study, t, study.trials[dups[0][1]])
            dups_in_a_row += 1
            continue
        dups_in_a_row = 0
        p = table[tuple(t.params[k] for k in keys)]
        t.set_constraint(MEMORY, p.constraint)
        study.tell(t, p.throughput)  # as the sweeper tells a job: its speed, constraint aside
        measured += 1
        if p.feasible:
            best = max(best, p.throughput)
        if best >= target:
            return measured
    return len(table)


SAMPLERS = {
    "random": lambda seed: make_sampler("random", seed, 0),
    "tpe (n_startup_trials=5, the default)": lambda seed: make_sampler("tpe", seed, 5),
    "tpe (n_startup_trials=10)": lambda seed: make_sampler("tpe", seed, 10),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=GRID)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--target", type=float, default=0.95, help="fraction of the grid's best")
    ap.add_argument("--ceiling", type=float, help="replay under another memory ceiling")
    ap.add_argument("--make-grid", type=Path, metavar="SWEEP_DIR")
    a = ap.parse_args(argv)
    if a.make_grid:
        make_grid(a.make_grid, a.grid)
        return 0
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = load_grid(a.grid, a.ceiling)
    space = space_of(table)
    feasible = [p.throughput for p in table.values() if p.feasible]
    top = max(feasible)
    good = sum(v >= a.target * top for v in feasible)
    print(f"grid: {a.grid.relative_to(ROOT) if a.grid.is_relative_to(ROOT) else a.grid}: "
          f"{len(table)} configurations, {len(feasible)} feasible, best {top:.1f} img/s; "
          f"{good} within {1 - a.target:.0%} of it; {a.seeds} seeds")
    print("| sampler | mean trials | median | 90th pct | max | mean, % of the grid |")
    print("|---|---|---|---|---|---|")
    for name, make in SAMPLERS.items():
        n = sorted(trials_to_target(table, space, make(s), a.target * top)
                   for s in range(a.seeds))
        p90 = n[min(len(n) - 1, int(round(0.9 * (len(n) - 1))))]
        mean = statistics.mean(n)
        print(f"| {name} | {mean:.1f} | {statistics.median(n):g} | {p90} | {n[-1]} | "
              f"{100 * mean / len(table):.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
