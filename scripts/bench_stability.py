"""Verdict stability: identical default runs, quiet and under an intermittent load on one core.

    python scripts/bench_stability.py                 # 6 quiet + 6 loaded runs, alternated
    python scripts/bench_stability.py --runs 10 -- model=resnet18

Each run is `python -m gpubench tracking=none [overrides]` in a subprocess. Loaded runs start,
together with the run, a process that keeps one core busy for 1.5 s, then idles 1 s, over and
over (a neighbour on a shared machine). Quiet and loaded runs alternate, so slow drift of the
machine hits both alike.

Reported: every run's verdict, stability and wall time; the quiet verdict (the most common
conclusive verdict of the quiet runs); and the two goals:
- no contradictory confident verdict: every run gives the quiet verdict or `inconclusive`;
- at least 90% of the quiet runs are conclusive.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

LOAD = """
import time
while True:
    end = time.perf_counter() + 1.5
    while time.perf_counter() < end:
        pass
    time.sleep(1.0)
"""


def one_run(out: Path, overrides: list[str], loaded: bool) -> dict:
    load = subprocess.Popen([sys.executable, "-c", LOAD]) if loaded else None
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpubench", "tracking=none", f"hydra.run.dir={out}",
             *overrides], capture_output=True, text=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    wall = time.perf_counter() - t0
    d = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    return {"loaded": loaded, "wall_s": wall, "rc": p.returncode, "status": d.get("status"),
            "bottleneck": d.get("bottleneck"), "stable": d.get("measurement_stable"),
            "reasons": [r["text"] if isinstance(r, dict) else r for r in d.get("noise_reasons") or []], "e2e": d.get("images_per_sec"),
            "compute": d.get("compute_images_per_sec")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6, help="runs of each kind (default 6)")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("overrides", nargs="*", help="gpubench overrides (after --)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            for loaded in ((False, True) if i % 2 == 0 else (True, False)):
                r = one_run(Path(tmp) / f"{i}-{int(loaded)}", a.overrides, loaded)
                rows.append(r)
                print(f"{'loaded' if loaded else 'quiet ':6} {r['bottleneck']:12} "
                      f"stable={r['stable']!s:5} e2e={r['e2e'] or 0:8.1f} "
                      f"compute={r['compute'] or 0:8.1f} wall={r['wall_s']:5.1f}s "
                      f"{'; '.join(x[:60] for x in r['reasons'])[:150]}", flush=True)
    quiet = [r for r in rows if not r["loaded"]]
    loaded = [r for r in rows if r["loaded"]]
    conclusive = [r["bottleneck"] for r in quiet if r["bottleneck"] != "inconclusive"]
    verdict = Counter(conclusive).most_common(1)[0][0] if conclusive else None

    def agree(rs):
        return sum(r["bottleneck"] in (verdict, "inconclusive") for r in rs)

    def walls(rs):
        w = sorted(r["wall_s"] for r in rs)
        return f"median {statistics.median(w):.1f} s (min {w[0]:.1f}, max {w[-1]:.1f})"

    print(f"\nquiet verdict: {verdict}")
    print(f"quiet:  {agree(quiet)}/{len(quiet)} give it or inconclusive; "
          f"{len(conclusive)}/{len(quiet)} conclusive; wall {walls(quiet)}")
    print(f"loaded: {agree(loaded)}/{len(loaded)} give it or inconclusive; "
          f"{sum(r['bottleneck'] != 'inconclusive' for r in loaded)}/{len(loaded)} conclusive; "
          f"wall {walls(loaded)}")
    ok = agree(rows) == len(rows) and len(conclusive) >= 0.9 * len(quiet)
    print("goals met" if ok else "goals NOT met")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
