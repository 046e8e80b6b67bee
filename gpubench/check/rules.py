"""The self-check's judgements: pure functions of measured figures (no torch), each returning a
`Judgement`, so every PASS/FAIL rule is tested on a CPU with recorded figures; the code that
measures (gpubench.check.pipes, .cases, .cuda) stays thin. docs/gpu.md ("The self-check")
states them.

`agree` (compute, loader, sync) judges two timings of the same work measured in alternated
windows, so a drift of a shared machine hits both: each round gives a ratio tool/reference, and
the ratios' median and order-statistic interval (core.stats, as a run's phases get) PASS when
the median is within TOLERANCE (5%) of 1 or the interval holds 1 (no larger difference than the
windows' own spread). Anything else FAILs, in either direction (too fast is as wrong as slow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# agree(): the largest difference that passes whatever the intervals say, the tolerance every
# judgement over throughputs uses
from gpubench.core.stats import TOLERANCE, Est

# utilization(): NVML's utilization is the share of its sample period (1/6 s to 1 s, by product)
# in which a kernel ran; a loop of back-to-back matmuls keeps one running, nothing queued none
BUSY_MIN = 80.0
IDLE_MAX = 10.0
# energy(): NVML's power reading is itself an average (over 1 s on Ampere and newer), so power
# integrated over a window with a steady load agrees with the counter to a few percent
ENERGY_TOLERANCE = 0.10
# memory(): an allocation shows in NVML's used memory as in torch's reserved, within this
MEMORY_TOLERANCE = 0.05
MEMORY_SLACK_BYTES = 64 * 2**20  # the driver's page-table and granularity overheads
# peak(): achieved/peak above 1 is impossible (the table's peak is too low); below half is what
# a sparse (2:4) figure in the table gives, or a throttled or shared GPU
PEAK_MAX = 1.0
PEAK_MIN = 0.5


@dataclass(frozen=True)
class Judgement:
    """One check's outcome: passed True/False, or None when it did not run (skipped)."""

    name: str
    passed: bool | None
    figures: dict = field(default_factory=dict)
    detail: str = ""

    @property
    def status(self) -> str:
        return "skipped" if self.passed is None else ("PASS" if self.passed else "FAIL")


def skipped(name: str, why: str) -> Judgement:
    return Judgement(name, None, {}, why)


def line(j: Judgement) -> str:
    """The printed line: name, PASS/FAIL and the figures; `skipped: why` for a check not run."""
    if j.passed is None:
        return f"{j.name:<12} skipped: {j.detail}"
    return f"{j.name:<12} {j.status:<5} {j.detail}"


def exit_code(judgements: list[Judgement]) -> int:
    """0 when every check that ran passed, else 1 (core.exits.ExitCode.FAILED)."""
    return 0 if all(j.passed is not False for j in judgements) else 1


def agree(name: str, tool: list[float], reference: list[float], unit: str = "img/s",
          names: tuple[str, str] = ("gpubench", "plain"), tolerance: float = TOLERANCE
          ) -> Judgement:
    """Two rates of the same work from alternated windows (tool[i] and reference[i] measured
    side by side in round i): see the module docstring for the rule."""
    pairs = [(t, r) for t, r in zip(tool, reference, strict=False) if t > 0 and r > 0]
    if not pairs:
        return Judgement(name, False, {}, f"nothing measured ({names[0]} {tool}, {names[1]} "
                         f"{reference})")
    ratios = [t / r for t, r in pairs]
    t, r = Est.median_of([p[0] for p in pairs]), Est.median_of([p[1] for p in pairs])
    q = Est.median_of(ratios)
    within = abs(q.value - 1.0) <= tolerance
    held = q.lo <= 1.0 <= q.hi and len(ratios) > 1
    passed = within or held
    figures = {"tool": t.value, "tool_lo": t.lo, "tool_hi": t.hi, "reference": r.value,
               "reference_lo": r.lo, "reference_hi": r.hi, "ratio": q.value, "ratio_lo": q.lo,
               "ratio_hi": q.hi, "rounds": len(ratios)}
    why = (f"within {tolerance:.0%}" if within else "its interval holds 1" if held
           else f"{q.value - 1:+.0%}, beyond {tolerance:.0%} and the interval")
    detail = (f"{names[0]} {t:.1f} {unit}, {names[1]} {r:.1f}: ratio {q:.3f} over "
              f"{len(ratios)} alternated rounds ({why})")
    return Judgement(name, passed, figures, detail)


def verdict_case(name: str, expected: str, answer: str, reason: str, figures: dict,
                 disturbed: list[str] | None = None) -> Judgement:
    """A constructed case whose narrowest pipe is known: the rule must name it. A run that
    gpubench's own validity checks call disturbed (`disturbed`: other processes, interrupted
    steps) and whose figures do not name it is not judged (skipped, with what they said), as
    gpubench gives such a run no verdict either; on a quiet machine the same is a FAIL."""
    figures = {**figures, "expected": expected, "answer": answer}
    if answer == expected:
        return Judgement(name, True, figures, f"expected {expected}, got {answer}: {reason}")
    if disturbed:
        return Judgement(name, None, figures, f"the run was disturbed ({disturbed[0]}), and its "
                         f"figures say {answer}, not {expected}: {reason}")
    return Judgement(name, False, figures, f"expected {expected}, got {answer}: {reason}")


def utilization(busy: float | None, idle: float | None) -> Judgement:
    """NVML's GPU utilization (%) read in a window of back-to-back kernels and in one with
    nothing queued."""
    if busy is None or idle is None:
        return skipped("utilization", "NVML gave no utilization reading")
    ok = busy >= BUSY_MIN and idle <= IDLE_MAX
    why = "" if ok else (f" (busy must read >= {BUSY_MIN:.0f}%)" if busy < BUSY_MIN else
                         f" (idle must read <= {IDLE_MAX:.0f}%: another process on the GPU?)")
    return Judgement("utilization", ok, {"busy": busy, "idle": idle},
                     f"busy window {busy:.0f}%, idle window {idle:.0f}%{why}")


def energy(counter_j: float | None, integrated_j: float | None, seconds: float) -> Judgement:
    """The driver's energy counter over a window against its power readings integrated over
    the same window."""
    if counter_j is None or integrated_j is None or integrated_j <= 0:
        return skipped("energy", "no energy counter or power reading on this device")
    ratio = counter_j / integrated_j
    ok = abs(ratio - 1.0) <= ENERGY_TOLERANCE
    return Judgement("energy", ok, {"counter_j": counter_j, "integrated_j": integrated_j,
                                    "ratio": ratio, "seconds": seconds},
                     f"counter {counter_j:.1f} J, power integrated {integrated_j:.1f} J over "
                     f"{seconds:.1f} s: ratio {ratio:.3f} (pass within {ENERGY_TOLERANCE:.0%})")


def energy_readings(readings: list[tuple[float, float | None, float | None]]) -> Judgement:
    """`energy` from NVML's readings over a window, (seconds, power mW, counter mJ) each taken
    at one moment: power integrated by the trapezoid rule from the first reading to the last,
    against the counter's difference between the same two."""
    if len(readings) < 2 or any(p is None or e is None for _, p, e in readings):
        return energy(None, None, 0.0)
    integrated_mj = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0, _), (t1, p1, _)
                        in zip(readings, readings[1:], strict=False))
    return energy((readings[-1][2] - readings[0][2]) / 1e3, integrated_mj / 1e3,
                  readings[-1][0] - readings[0][0])


def memory(reserved: tuple[int, int], used: tuple[int, int]) -> Judgement:
    """torch's reserved memory and NVML's used memory, before and after one large allocation:
    NVML sees at least what torch reserved, and the allocation grows both alike."""
    d_res, d_used = reserved[1] - reserved[0], used[1] - used[0]
    gib = 2**30
    slack = max(MEMORY_TOLERANCE * d_res, MEMORY_SLACK_BYTES)
    grows = abs(d_used - d_res) <= slack
    covers = used[1] >= reserved[1]
    ok = grows and covers and d_res > 0
    why = [] if ok else [w for w, bad in (
        ("NVML's used is below torch's reserved", not covers),
        (f"the allocation grew them differently (beyond {MEMORY_TOLERANCE:.0%} or "
         f"{MEMORY_SLACK_BYTES // 2**20} MiB)", not grows)) if bad]
    return Judgement("memory", ok, {"reserved": reserved[1], "used": used[1],
                                    "reserved_delta": d_res, "used_delta": d_used},
                     f"an allocation of {d_res / gib:.2f} GiB reserved by torch moved NVML's "
                     f"used by {d_used / gib:.2f} GiB; used {used[1] / gib:.2f} GiB >= reserved "
                     f"{reserved[1] / gib:.2f} GiB" + (f" ({'; '.join(why)})" if why else ""))


def peak(device: str, rows: list[tuple[str, float, float | None]]) -> Judgement:
    """Large matmuls' achieved FLOP/s against the peak table, per math: (math, achieved,
    table peak or None). Judged on the maths the table has."""
    known = [(m, a, p) for m, a, p in rows if p]
    if not known:
        return skipped("peak", f"no row in the peak table for {device!r} (no MFU either)")
    ok = all(PEAK_MIN <= a / p <= PEAK_MAX for _, a, p in known)
    parts = []
    for m, a, p in known:
        share = a / p
        parts.append(f"{m} {a / 1e12:.1f} of {p / 1e12:.1f} TFLOP/s ({share:.0%})"
                     + (" above the peak: the table's figure is too low" if share > PEAK_MAX
                        else " under half the peak: a sparse figure in the table, or a "
                             "throttled or shared GPU" if share < PEAK_MIN else ""))
    figures = {f"{m}_share": a / p for m, a, p in known}
    return Judgement("peak", ok, figures, f"{device}: " + "; ".join(parts) +
                     f" (pass within {PEAK_MIN:.0%}-{PEAK_MAX:.0%})")
