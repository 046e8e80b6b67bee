"""Named validity checks: was this measurement disturbed (results.json `noise_reasons`)? Why each
threshold is where it is: docs/guide.md ("Is the measurement stable?")."""

from __future__ import annotations

import math
import time
from contextlib import suppress
from dataclasses import dataclass

from gpubench.core.record import MIN_WINDOW_S, Flaw, Reason, RunRecord, longer
from gpubench.core.stats import CONFIDENCE, count, median, positive

# compute step-time std/mean above which the device did not run steadily: it repeats one
# batch, so its steps are alike unless something competes (a quiet CPU run: ~0.02)
CV_LIMIT = 0.2
# the host's scheduling jitter (10 ms tick) moves any step by a few ms: a spread or slow step
# smaller than this is no evidence (1-3 ms CPU steps show std/mean 0.2-0.3 on an idle
# machine); CUDA compute steps are timed by device events, where it never binds
JITTER_S = 0.005
MIN_STEPS = 5  # fewer are too few to judge their spread
# a "slow step" takes this many times the median; a few (SLOW_SHARE at most) are interruptions
SLOW_FACTOR = 3.0
SLOW_SHARE = 0.2
# others' CPU use (cores) that competes while the host is this busy (idle cores lose nothing)
OTHER_CORES = 0.25
HOST_BUSY = 0.85
GOT_SHARE = 0.9  # the share of its CPU demand below which a run counts as starved


@dataclass
class WindowLoad:
    """One window: host CPU (% of all cores), this run's (% of one core)."""

    phase: str
    index: int
    host_cpu: float | None
    run_cpu: float | None
    samples: int = 0
    seconds: float = 0.0
    # cores it can keep busy (torch threads + workers): a neighbour takes only from less
    demand: float | None = None


def other_cores(host_cpu: float | None, run_cpu: float | None, cpu_count: int) -> float | None:
    if host_cpu is None or run_cpu is None:
        return None
    return max(0.0, host_cpu / 100.0 * cpu_count - run_cpu / 100.0)


def window_seconds(windows: list[dict]) -> float | None:
    secs = [w["seconds"] for w in windows if positive(w.get("seconds"))]
    return median(secs) if secs else None


def _windows(numbers: list[int]) -> str:
    """`window 2`, `windows 1, 3` (numbered from 1)."""
    return f"window{'s' * (len(numbers) > 1)} {', '.join(map(str, numbers))}"


def finding(what: str, why: str, window_s: float | None) -> Reason:
    """`what: why`, a sign something disturbed a phase; `too_short` instead in windows (median
    `window_s`) too short to see competition or outlast a hiccup."""
    if window_s is not None and window_s < MIN_WINDOW_S:
        return Reason(Flaw.too_short, f"{what} in windows of {window_s * 1e3:.0f} ms, too short "
                                      "to tell a passing hiccup from a disturbed run")
    return Reason(Flaw.disturbed, f"{what}: {why}")


def step_checks(phase: str, steps: list[float], cv: float | None,
                window_s: float | None = None) -> list[Reason]:
    out = []
    if (phase == "compute" and len(steps) >= MIN_STEPS and cv is not None and math.isfinite(cv)
            and cv > CV_LIMIT and cv * (sum(steps) / len(steps)) > JITTER_S):
        out.append(finding(f"compute step times vary (std/mean {cv:.2f} > {CV_LIMIT})",
                           "the device did not run steadily", window_s))
    if phase in ("compute", "e2e") and len(steps) >= MIN_STEPS:
        med = median(steps)
        slow = [t for t in steps if med > 0 and t > max(SLOW_FACTOR * med, med + 4 * JITTER_S)]
        if slow and len(slow) <= SLOW_SHARE * len(steps):
            out.append(finding(f"{phase}: {len(slow)} of {len(steps)} steps took over "
                               f"{SLOW_FACTOR:.0f}x the median (max {max(slow) * 1e3:.0f} ms vs "
                               f"{med * 1e3:.0f} ms)", "interrupted steps", window_s))
    return out


def load_checks(loads: list[WindowLoad], cpu_count: int) -> list[Reason]:
    """Windows where others competed for a busy host and this run got less CPU than it used."""
    hit: dict[str, list[tuple[int, float]]] = {}
    for w in loads:
        o = other_cores(w.host_cpu, w.run_cpu, cpu_count)
        if o is None or w.samples < 1 or w.seconds < MIN_WINDOW_S:
            continue
        starved = w.demand is None or w.run_cpu / 100.0 < GOT_SHARE * w.demand
        if o >= OTHER_CORES and w.host_cpu / 100.0 >= HOST_BUSY and starved:
            hit.setdefault(w.phase, []).append((w.index + 1, o))
    parts = [f"{phase} {_windows([i for i, _ in ws])} (up to {max(o for _, o in ws):.1f} cores)"
             for phase, ws in hit.items()]
    return [Reason(Flaw.disturbed, "other processes used CPU while the host was busy: "
                   + "; ".join(parts))] if parts else []


def window_checks(phase: str, windows: list[dict], warmup_settled: bool | None,
                  warmup_steps: int) -> list[Reason]:
    out = []
    if cut := [i + 1 for i, w in enumerate(windows) if w.get("truncated")]:
        out.append(Reason(Flaw.cut_short, f"{phase}: {_windows(cut)} cut short by "
                          "bench.max_seconds before bench.steps"))
    if warmup_settled is False:
        out.append(Reason(Flaw.warmup, f"{phase}: warm-up did not settle within {warmup_steps} "
                          "steps (bench.warmup_max_steps / bench.warmup_max_seconds)"))
    return out


def interval_checks(phase: str, windows: list[dict], coverage: float | None) -> list[Reason]:
    """A median's order-statistics interval: 6 windows reach 95%, fewer cannot (5: 94%, 4: 88%,
    3: 75%, 2: 50%, 1: none); a verdict on it would overclaim."""
    n = len(windows)
    if n >= 2 and coverage is not None and coverage >= CONFIDENCE:
        return []
    pct = f"{coverage:.0%}" if coverage is not None else ""
    # "an" as the figure is said: eight, eleven, eighteen, eighty-...
    article = "an" if pct.startswith("8") or pct in ("11%", "18%") else "a"
    what = "no interval" if n < 2 or coverage is None else f"{article} {pct} interval"
    return [Reason(Flaw.few_windows, f"{phase}: {count(n, 'window')} give{'s' if n == 1 else ''} "
                   f"{what}, not {CONFIDENCE:.0%} (bench.repeats >= 6 and bench.steps >= 6)")]


def queue_checks(phase: str, windows: list[dict], in_flight: int) -> list[Reason]:
    """A loader window of fewer batches than the workers hold in flight times the queue (2
    batches of 128: 1,025,764 img/s with 4 workers on 2 cores); windows are sized above it, so
    only one cut short or an older run is flagged."""
    short = [i + 1 for i, w in enumerate(windows)
             if phase == "loader" and (w.get("steps") or 0) < in_flight]
    return [Reason(Flaw.queue, f"loader: {_windows(short)} of fewer batches than the workers hold "
                   f"in flight ({in_flight} = loader.num_workers x loader.prefetch_factor): timed "
                   "batches made before the window began")] if short else []


def gpu_checks(phase: str, telemetry: dict) -> list[Reason]:
    out = []
    if (thr := telemetry.get("throttled_fraction")) is not None and thr > 0.1:
        out.append(Reason(Flaw.gpu, f"{phase}: GPU clocks throttled {thr:.0%} of the window "
                          f"({telemetry.get('throttle_reasons') or 'clocks'})"))
    if other := telemetry.get("gpu_other_processes_max"):
        others = count(other, "other process", "other processes")
        out.append(Reason(Flaw.gpu, f"{phase}: {others} ran on the GPU"))
    return out


def top_other_processes(exclude: set[int]) -> list[str]:
    """Outside this run, the two using the most CPU over 0.3 s now: 'name (pid) 85%'."""
    import psutil

    procs = [p for p in psutil.process_iter(["pid", "name"]) if p.info["pid"] not in exclude]
    for p in procs:
        with suppress(psutil.Error):
            p.cpu_percent(None)  # the first call only starts the count
    time.sleep(0.3)
    rows = []
    for p in procs:
        with suppress(psutil.Error):
            rows.append((p.cpu_percent(None), p.info["name"], p.info["pid"]))
    rows.sort(reverse=True)
    return [f"{name} (pid {pid}) {cpu:.0f}%" for cpu, name, pid in rows[:2] if cpu >= 10]


def more_windows(rec: RunRecord | None) -> str:
    """The run's "measure longer" and why it helps."""
    plan = longer(rec)
    why = ": more and longer windows narrow the intervals"
    if plan.min_window_s is not None:
        why += (f"; windows of at least {plan.min_window_s:g} s show whether other work "
                "competed, and a passing hiccup is a small part of each")
    if plan.max_seconds is not None:
        why += ", and a bench.max_seconds that lets them finish" + (
            " (the cap cut this run short)" if rec is not None and rec.cut_short else "")
    if plan.warmup_max_steps is not None:
        why += "; a longer warm-up: steps were still changing when measuring began"
    return f"{plan}{why}"


def remedies(reasons: list[Reason], competitors: list[str], rec: RunRecord | None) -> list[str]:
    """What to do about an inconclusive run, most useful first."""
    kinds = {r.kind for r in reasons}
    out = []
    if Flaw.disturbed in kinds and competitors:
        out.append(f"rerun on an idle machine ({', '.join(competitors)} competed): the run "
                   "shares its cores with other work")
    elif Flaw.disturbed in kinds:  # the sign, not a competitor: say no more than was seen
        out.append("rerun when the host is quieter: its steps varied though no process here "
                   "was seen competing (a virtual machine's neighbours or the CPU's clocks can "
                   "do that); if it repeats, compare with `python -m gpubench.check`")
    if Flaw.gpu in kinds:
        out.append("a GPU of its own: other processes or throttled clocks change its speed")
    out.append(more_windows(rec))
    return out
