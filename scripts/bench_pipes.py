"""sweep=pipes against a blind search (docs/benchmarks.md#pipes-against-a-blind-search).

    python scripts/bench_pipes.py real --reps 2            # grid, TPE, pipes for real, alternated
    python scripts/bench_pipes.py simulate --table DIR      # replay a real grid's per-phase figures
    python scripts/bench_pipes.py simulate --model gpu      # a GPU-sized space, modelled (below)

real: on one search space small enough to grid, runs a full grid (Hydra's basic sweeper), then
sweep=throughput (TPE) and sweep=pipes, in alternated order per repetition (A B C, C B A, ...),
each a `python -m gpubench` subprocess timed from outside. For each: wall time, jobs by kind
(sweep.json), the configuration its report recommends, and that configuration's e2e as the
same repetition's grid measured it, over the grid's best (one measurement of both, so drift
between the runs does not enter).

simulate: replays each strategy's choices over a table of per-phase figures (loader, compute,
e2e with their intervals) per configuration: the grid measures all, TPE is Optuna's sampler
with the sweeper's settings on the e2e column, pipes is gpubench.search.pipes (its rules)
(keep_compute, choose_data, contends) on the compute and loader columns, then the e2e column
for its pairings. Cost is in phase measurements: a full run measures 3 (loader, compute, e2e),
a compute-only, loader-only or e2e-only run 1 (a join's confirm round of a pairing is an
e2e-only run; the join confirms only the pairings its first runs leave open). `--table DIR` reads a
real grid's results.json files; `--model gpu` builds a 1,200-configuration table from a model
of a T4-class GPU fed by a 8-core host (reference article 003's figures: compute ~260 img/s
with AMP at batch 128, one loader worker ~177 img/s, four ~440), a model and not a
measurement: its point is the trial counts, which do not depend on the exact figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpubench.analysis.recommend import Row  # noqa: E402
from gpubench.core.record import RunRecord, Status, find_runs, load  # noqa: E402
from gpubench.core.stats import TOLERANCE, Est  # noqa: E402
from gpubench.search.pipes import (  # noqa: E402
    choose_data,
    confirm_top,
    contends,
    cost,
    data_walk,
    effective,
    join_bound,
    keep_compute,
)
from gpubench.search.space import parse_search_space  # noqa: E402

# the real space: resnet18 at 32 px on this CPU; 3 x 2 compute settings, 3 data settings
FIXED = ["model=resnet18", "dataset.image_size=32", "dataset.num_classes=10", "bench.device=cpu",
         "precision=fp32", "bench.cudnn_benchmark=false", "loader.pin_memory=false",
         "loader.prefetch_factor=2", "bench.steps=24", "bench.repeats=6", "bench.warmup_steps=3",
         "tracking=none"]
AXES = {"loader.batch_size": [16, 32, 64], "channels_last": [False, True],
        "loader.num_workers": [0, 1, 2]}
DATA = ("loader.num_workers", "loader.pin_memory", "loader.prefetch_factor", "dataset.preload")


def _choice(k: str, vs: list) -> str:
    return f"{k}=choice({','.join(str(v).lower() for v in vs)})"


def _run(cmd: list[str], cwd: Path) -> float:
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", *cmd], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return time.monotonic() - t


def _config_of(rec: RunRecord) -> tuple:
    c = rec.config
    return (c["loader"]["batch_size"], bool(c["channels_last"]), c["loader"]["num_workers"])


def _grid_table(sweep: Path) -> dict[tuple, RunRecord]:
    return {_config_of(r): r for r in (load(d) for d in find_runs(sweep)) if r is not None}


def real(reps: int, out: Path, only: list[str] | None = None, first: int = 0,
         tag: str = "") -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    space = [_choice(k, v) for k, v in AXES.items()]
    grid = ["gpubench", "-m", *FIXED, *(f"{k}={','.join(str(x).lower() for x in v)}"
                                        for k, v in AXES.items())]
    tpe = ["gpubench", "sweep=throughput", *FIXED, *space, "hydra.sweeper.n_trials=8"]
    pipes = ["gpubench", "sweep=pipes", *FIXED, *space]
    rows = []
    for rep in range(first, first + reps):
        order = [("grid", grid), ("tpe", tpe), ("pipes", pipes)]
        order = order if rep % 2 == 0 else order[::-1]
        walls, dirs = {}, {}
        for name, cmd in order:
            d = out / f"{name}-{rep}{tag if only and name in only else ''}"
            if only and name not in only:  # an earlier repetition's run of it is compared
                dirs[name] = d
                continue
            extra = [f"hydra.sweep.dir={d}"]
            if name != "grid":
                extra += [f"hydra.sweeper.storage=sqlite:///{d}.db", f"hydra.sweeper.seed={rep}"]
            walls[name] = _run([*cmd, *extra], out)
            if name == "grid":
                _run(["gpubench.report", str(d)], out)
            dirs[name] = d
            print(f"rep {rep} {name}: {walls[name]:.0f} s", flush=True)
        table = _grid_table(dirs["grid"])
        best = max(r.images_per_sec or 0.0 for r in table.values())
        for name, d in dirs.items():
            if only and name not in only:
                continue
            summary = json.loads((d / "report" / "summary.json").read_text())
            rec = load(Path(summary["recommended"]["dir"]))
            at_grid = table[_config_of(rec)].images_per_sec
            jobs = json.loads((d / "sweep.json").read_text())["jobs"] if name != "grid" else []
            kinds = {}
            for j in jobs:
                k = j.get("stage") or j.get("rung") or "full"
                kinds[k] = kinds.get(k, 0) + 1
            rows.append({"rep": rep, "strategy": name, "wall_s": round(walls[name], 1),
                         "grid": str(dirs["grid"]),
                         "jobs": kinds or {"full": len(table)},
                         "recommended": dict(zip(AXES, _config_of(rec), strict=True)),
                         "grid_e2e_of_recommended": at_grid, "grid_best": best,
                         "of_best": at_grid / best})
    with open(out / "real.jsonl", "a") as f:  # every repetition kept, across invocations
        for x in rows:
            f.write(json.dumps(x) + "\n")
    return rows


# ---------------------------------------------------------------------- simulation


def _rate(v: float, rel: float = 0.03) -> list[float]:
    return [v * (1 - rel), v * (1 + rel)]


def gpu_model(seed: int = 0) -> tuple[dict, list[str]]:
    """A modelled GPU-sized table: 5 batch x 2 precision x 2 channels_last x 2 cudnn compute
    settings, 5 workers x 2 pin x 3 prefetch data settings (1,200 configurations)."""
    rng = random.Random(seed)
    axes = {"loader.batch_size": [32, 64, 128, 256, 512], "precision": ["fp32", "amp_bf16"],
            "channels_last": [False, True], "bench.cudnn_benchmark": [False, True],
            "loader.num_workers": [0, 1, 2, 4, 8], "loader.pin_memory": [False, True],
            "loader.prefetch_factor": [2, 4, 8]}
    table = {}
    for pt in itertools.product(*axes.values()):
        p = dict(zip(axes, pt, strict=True))
        b = p["loader.batch_size"]
        # compute: saturating in batch, AMP x1.7, channels_last x1.15 with AMP, cudnn x1.05
        comp = 160 * (b / (b + 24)) * (1.7 if p["precision"] == "amp_bf16" else 1.0)
        comp *= (1.15 if p["channels_last"] and p["precision"] == "amp_bf16" else 1.0)
        comp *= 1.05 if p["bench.cudnn_benchmark"] else 1.0
        mem = 0.12 * b / 64 * (0.6 if p["precision"] == "amp_bf16" else 1.0)
        w = p["loader.num_workers"]
        # loader: ~110 img/s in the main process, ~177 with one worker, levelling at 8 cores
        load_ = (110 if w == 0 else 177 * min(w, 8) ** 0.75) * (1.04 if p["loader.pin_memory"]
                                                                else 1.0)
        load_ *= 1.0 + 0.01 * (p["loader.prefetch_factor"] > 2)
        # with workers the pipes overlap (a little lost at the hand-over); with 0 workers the
        # main process loads, then steps: the serial bound
        e2e = min(comp, load_) * 0.95 if w else 0.97 / (1 / comp + 1 / load_)
        noise = lambda v: v * (1 + rng.gauss(0, 0.015))  # noqa: E731
        status = "ok" if mem <= 0.8 else "oom"
        table[pt] = {"params": p, "status": status, "loader": noise(load_),
                     "compute": noise(comp), "e2e": noise(e2e) if status == "ok" else 0.0,
                     "peak": mem}
    return table, list(axes)


def table_of_grid(sweep: Path) -> tuple[dict, list[str]]:
    table = {}
    for r in (load(d) for d in find_runs(sweep)):
        if r is None:
            continue
        pt = _config_of(r)
        table[pt] = {"params": dict(zip(AXES, pt, strict=True)), "status": r.status.value,
                     "loader": r.loader_images_per_sec, "compute": r.compute_images_per_sec,
                     "e2e": r.images_per_sec or 0.0, "peak": r.peak_memory_fraction,
                     "ci": {k: getattr(r, f) for k, f in (
                         ("loader", "loader_images_per_sec_ci"),
                         ("compute", "compute_images_per_sec_ci"), ("e2e", "images_per_sec_ci"))}}
    return table, list(AXES)


def _row(entry: dict, phase: str) -> Row:
    v = entry[phase] or 0.0
    ci = (entry.get("ci") or {}).get(phase) or _rate(v)
    st = Status.ok if entry["status"] == "ok" else Status.oom
    field = {"loader": "loader_images_per_sec", "compute": "compute_images_per_sec",
             "e2e": "images_per_sec"}[phase]
    rec = RunRecord(status=st, memory_ceiling=0.8, peak_memory_fraction=entry["peak"],
                    **{field: v, f"{field}_ci": ci})
    return Row("sim", rec)


def sim_pipes(table: dict, axes: list[str], seed: int = 0, rounds: int = 2, keep: int = 2,
              join_trials: int = 4, compute_trials: int = 16,
              data_trials: int = 12) -> tuple[dict, int]:
    """The rules of gpubench.search.pipes over the table: (the recommended entry, phase
    measurements)."""
    ckeys = [a for a in axes if a not in DATA]
    dkeys = [a for a in axes if a in DATA]
    space = parse_search_space([_choice(k, sorted({e["params"][k] for e in table.values()},
                                                  key=str)) for k in dkeys]).params
    by_compute: dict[tuple, list[dict]] = {}
    for e in table.values():
        by_compute.setdefault(tuple(e["params"][k] for k in ckeys), []).append(e)
    spent = 0
    crows = []
    settings = list(by_compute)
    if len(settings) > compute_trials:  # as the search: Optuna samples the compute pipe
        settings = _sampled(by_compute, ckeys, seed, compute_trials)
    for ck in settings:  # one compute-only run per compute setting
        spent += 1
        crows.append((dict(zip(ckeys, ck, strict=True)), _row(by_compute[ck][0], "compute")))
    kept = keep_compute(crows, "loader.batch_size", TOLERANCE, keep)
    best, best_e2e = None, -1.0
    pairings = 0
    joined: list[Row] = []
    for k in kept:
        entries = by_compute[tuple(k.params[c] for c in ckeys)]
        drows = sorted(((({d: e["params"][d] for d in dkeys}), e) for e in entries),
                       key=lambda t: cost(t[0], space))
        points = effective([dp for dp, _ in drows])
        entry = {json.dumps(dp, sort_keys=True, default=str): e for dp, e in drows}
        measured = []
        while len(measured) < data_trials:  # the search's walk (gpubench.search.pipes)
            todo = data_walk(points, space, measured, k.rate, TOLERANCE)
            if not todo:
                break
            for dp in todo[: data_trials - len(measured)]:
                spent += 1
                measured.append((dp, _row(entry[json.dumps(dp, sort_keys=True, default=str)],
                                          "loader")))
                if not data_walk(points, space, measured, k.rate, TOLERANCE):
                    break
        fed = choose_data(measured, space, k.rate, TOLERANCE)
        while fed is not None and pairings < join_trials:
            pairings += 1
            spent += 1  # an e2e-only run (hydra.sweeper.pipes.join_overrides)
            e = next(e for dp, e in drows if dp == fed.params)
            e2e = _row(e, "e2e")
            joined.append(e2e)
            if e2e.throughput > best_e2e:
                best, best_e2e = e, e2e.throughput
            # unknown workers are none, as the search reads them (pipes._workers)
            _, narrower = join_bound(k.rate, fed.rate, int(fed.params.get("loader.num_workers") or 0))
            r = Est.of(e2e.throughput, list(e2e.interval))
            if r is None or not contends(r, narrower, TOLERANCE):
                break
            after = cost(fed.params, space)
            rest = [(dp, e) for dp, e in drows if cost(dp, space) > after]
            if not rest:
                break
            spent += 1
            measured.append((rest[0][0], _row(rest[0][1], "loader")))
            fed = choose_data(measured, space, k.rate, TOLERANCE, after=after)
    # the confirm rounds, only for the pairings the first runs leave open (as the search)
    spent += rounds * confirm_top(joined, TOLERANCE)
    return best, spent


def _tpe(points: dict[tuple, float], axes: list[str], seed: int, n: int) -> dict[tuple, float]:
    """The points (tuples of `axes` values -> their figure) the sweeper's TPE sampler measures
    in n distinct trials (a point proposed again is not measured again), with their figures."""
    import optuna

    from gpubench.search.study import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    choices = {a: sorted({pt[i] for pt in points}, key=str) for i, a in enumerate(axes)}
    dists = {a: optuna.distributions.CategoricalDistribution(v) for a, v in choices.items()}
    study = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", seed, 5))
    seen: dict[tuple, float] = {}
    for _ in range(2000):
        if len(seen) >= min(n, len(points)):
            break
        t = study.ask(dists)
        pt = tuple(t.params[a] for a in axes)
        seen.setdefault(pt, points[pt])
        study.tell(t, seen[pt])
    return seen


def _figure(e: dict, phase: str) -> float:
    return e[phase] if e["status"] == "ok" else 0.0


def _sampled(by_compute: dict, ckeys: list[str], seed: int, n: int) -> list[tuple]:
    """The compute settings TPE proposes in n trials, on the compute column."""
    return list(_tpe({ck: _figure(es[0], "compute") for ck, es in by_compute.items()}, ckeys,
                     seed, n))


def sim_tpe(table: dict, axes: list[str], seed: int, n_trials: int = 30, top: int = 3,
            rounds: int = 2) -> tuple[dict, int]:
    seen = _tpe({pt: _figure(e, "e2e") for pt, e in table.items()}, axes, seed, n_trials)
    spent = 3 * len(seen) + 3 * rounds * min(top, len(seen))
    return table[max(seen, key=seen.get)], spent


def simulate(table: dict, axes: list[str], seeds: int) -> dict:
    grid_best = max(e["e2e"] for e in table.values())
    pipes = [sim_pipes(table, axes, s) for s in range(seeds)]
    tpe = [sim_tpe(table, axes, s) for s in range(seeds)]
    return {
        "configurations": len(table), "grid": {"cost": 3 * len(table), "of_best": 1.0},
        "pipes": {"cost": statistics.median(c for _, c in pipes),
                  "of_best_median": statistics.median(e["e2e"] / grid_best for e, _ in pipes),
                  "within_5pct": sum(e["e2e"] >= 0.95 * grid_best for e, _ in pipes) / seeds},
        "tpe": {"cost": statistics.median(c for _, c in tpe),
                "of_best_median": statistics.median(e["e2e"] / grid_best for e, _ in tpe),
                "within_5pct": sum(e["e2e"] >= 0.95 * grid_best for e, _ in tpe) / seeds},
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("real")
    r.add_argument("--reps", type=int, default=2)
    r.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_pipes")
    r.add_argument("--only", nargs="+", choices=["grid", "tpe", "pipes"],
                   help="run these alone, compared with the grid of the same repetition number "
                        "measured earlier in --out")
    r.add_argument("--first", type=int, default=0, help="the first repetition's number")
    r.add_argument("--tag", default="", help="with --only: a suffix of the new runs' folders")
    s = sub.add_parser("simulate")
    s.add_argument("--table", type=Path)
    s.add_argument("--model", choices=["gpu"])
    s.add_argument("--seeds", type=int, default=20)
    a = ap.parse_args(argv)
    if a.what == "real":
        rows = real(a.reps, a.out.resolve(), a.only, a.first, a.tag)
        for x in rows:
            print(json.dumps(x))
        for name in ("grid", "tpe", "pipes"):
            w = [x["wall_s"] for x in rows if x["strategy"] == name]
            if not w:
                continue
            b = [x["of_best"] for x in rows if x["strategy"] == name]
            print(f"{name}: wall median {statistics.median(w):.0f} s (range {min(w):.0f}-"
                  f"{max(w):.0f}), recommended at {min(b):.0%}-{max(b):.0%} of the grid's best")
        return 0
    if (a.table is None) == (a.model is None):
        ap.error("simulate: --table DIR or --model gpu")
    table, axes = table_of_grid(a.table) if a.table else gpu_model()
    print(json.dumps(simulate(table, axes, a.seeds), indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
