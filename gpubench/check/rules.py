"""The self-check's PASS/FAIL rules: pure functions of figures (no torch), tested on a CPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubench.core.record import Word
from gpubench.core.stats import CONFIDENCE, TOLERANCE, Est, median_interval

# utilization(): back-to-back matmuls keep a kernel running all the sample period; idle, none
BUSY_MIN, IDLE_MAX = 80.0, 10.0
# energy(): power (a 1 s average) integrated under a steady load agrees with the counter
ENERGY_TOLERANCE = 0.10
# memory(): an allocation shows in NVML's used memory as in torch's reserved, within this
MEMORY_TOLERANCE = 0.05
MEMORY_SLACK_BYTES = 64 * 2**20  # the driver's page-table and granularity overheads
# peak(): above 1 the table's figure is too low; under half, sparse (2:4) or a throttled GPU
PEAK_MAX, PEAK_MIN = 1.0, 0.5


class Outcome(Word):  # written as its value on the check's line
    passed = "PASS"
    failed = "FAIL"
    inconclusive = "INCONCLUSIVE"  # measured, left open by its figures
    skipped = "skipped"  # not judged (no NVML, no DataLoader for this dataset)


@dataclass(frozen=True)
class Judgement:
    """One check's outcome; passed None: skipped, or (`inconclusive`) left open by its figures."""
    name: str
    passed: bool | None
    figures: dict = field(default_factory=dict)
    detail: str = ""
    inconclusive: bool = False

    @property
    def status(self) -> Outcome:
        if self.passed is None:
            return Outcome.inconclusive if self.inconclusive else Outcome.skipped
        return Outcome.passed if self.passed else Outcome.failed


def skipped(name: str, why: str) -> Judgement:
    return Judgement(name, None, {}, why)


# the widest status (INCONCLUSIVE) sets the column: every detail starts in one place
DETAIL_AT = 12 + 1 + max(len(o.value) for o in Outcome) + 1


def line(j: Judgement) -> str:
    """`name  STATUS  detail`, every detail in one column (a folded one continues under it)."""
    status = f"{j.status.value}:" if j.status is Outcome.skipped else j.status.value
    return f"{f'{j.name:<12} {status}':<{DETAIL_AT - 1}} {j.detail}"


def exit_code(judgements: list[Judgement]) -> int:
    return 0 if all(j.passed is not False for j in judgements) else 1


def agree(name: str, tool: list[float], reference: list[float], unit: str = "img/s",
          names: tuple[str, str] = ("gpubench", "plain")) -> Judgement:
    """Rates of the same work in alternated windows: PASS when the ratios' median is within
    TOLERANCE of 1; INCONCLUSIVE when their interval holds 1 (0.766 [0.204-1.820] proves nothing
    either way); else FAIL, too fast as too slow."""
    pairs = [(t, r) for t, r in zip(tool, reference, strict=False) if t > 0 and r > 0]
    if not pairs:
        return Judgement(name, False, {}, f"nothing measured ({names[0]} {tool}, {names[1]} "
                         f"{reference})")
    ratios = [t / r for t, r in pairs]
    t, r = Est.median_of([p[0] for p in pairs]), Est.median_of([p[1] for p in pairs])
    q = Est.median_of(ratios)
    cover = (median_interval(ratios) or (0, 0, 0.0))[2]
    within = abs(q.value - 1.0) <= TOLERANCE
    # an interval of fewer rounds covers less than CONFIDENCE (2: 50%): outside it is no proof
    held = len(ratios) > 1 and (q.lo <= 1.0 <= q.hi or cover < CONFIDENCE)
    figures = {"tool": t.value, "tool_lo": t.lo, "tool_hi": t.hi, "reference": r.value,
               "reference_lo": r.lo, "reference_hi": r.hi, "ratio": q.value, "ratio_lo": q.lo,
               "ratio_hi": q.hi, "rounds": len(ratios)}
    why = (f"within {TOLERANCE:.0%}" if within else f"{q.value - 1:+.0%}, but its interval "
           "holds 1: rerun on a quiet machine" if q.lo <= 1.0 <= q.hi and held else
           f"{q.value - 1:+.0%}, but a {cover:.0%} interval decides nothing: more rounds "
           "(bench.repeats >= 6)" if held
           else f"{q.value - 1:+.0%}, beyond {TOLERANCE:.0%} and the interval")
    label = f", {cover:.0%} interval" if len(ratios) > 1 else ""
    return Judgement(name, True if within else None if held else False, figures,
                     f"{names[0]} {t:.1f} {unit}, {names[1]} {r:.1f}: ratio {q:.3f} (the median "
                     f"of each round's ratio{label}) over {len(ratios)} alternated rounds ({why})",
                     inconclusive=held and not within)


def verdict_case(name: str, expected: str, answer: str, reason: str, figures: dict,
                 disturbed: list[str] | None = None) -> Judgement:
    """The answer must name the known pipe; a miss on a `disturbed` run is skipped (no verdict)."""
    figures = {**figures, "expected": expected, "answer": answer}
    if disturbed and answer != expected:
        return Judgement(name, None, figures, f"the run was disturbed ({disturbed[0]}), and its "
                         f"figures say {answer}, not {expected}: {reason}", inconclusive=True)
    return Judgement(name, answer == expected, figures,
                     f"expected {expected}, got {answer}: {reason}")


def utilization(busy: float | None, idle: float | None) -> Judgement:
    """NVML's GPU utilization (%) with back-to-back kernels and with nothing queued."""
    if busy is None or idle is None:
        return skipped("utilization", "NVML gave no utilization reading")
    ok = busy >= BUSY_MIN and idle <= IDLE_MAX
    why = "" if ok else (f" (busy must read >= {BUSY_MIN:.0f}%)" if busy < BUSY_MIN else
                         f" (idle must read <= {IDLE_MAX:.0f}%: another process on the GPU?)")
    return Judgement("utilization", ok, {"busy": busy, "idle": idle},
                     f"busy window {busy:.0f}%, idle window {idle:.0f}%{why}")


def energy(counter_j: float | None, integrated_j: float | None, seconds: float) -> Judgement:
    """The energy counter over a window against power integrated over it."""
    if counter_j is None or integrated_j is None or integrated_j <= 0:
        return skipped("energy", "no energy counter or power reading on this device")
    ratio = counter_j / integrated_j
    ok = abs(ratio - 1.0) <= ENERGY_TOLERANCE
    return Judgement("energy", ok, {"counter_j": counter_j, "integrated_j": integrated_j,
                                    "ratio": ratio, "seconds": seconds},
                     f"counter {counter_j:.1f} J, power integrated {integrated_j:.1f} J over "
                     f"{seconds:.1f} s: ratio {ratio:.3f} (pass within {ENERGY_TOLERANCE:.0%})")


def energy_readings(readings: list[tuple[float, float | None, float | None]]) -> Judgement:
    """`energy` from (seconds, power mW, counter mJ) readings, by the trapezoid rule."""
    if len(readings) < 2 or any(p is None or e is None for _, p, e in readings):
        return energy(None, None, 0.0)
    integrated_mj = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0, _), (t1, p1, _)
                        in zip(readings, readings[1:], strict=False))
    return energy((readings[-1][2] - readings[0][2]) / 1e3, integrated_mj / 1e3,
                  readings[-1][0] - readings[0][0])


def memory(reserved: tuple[int, int], used: tuple[int, int]) -> Judgement:
    """(before, after) one allocation: used covers reserved, and both grow alike."""
    d_res, d_used = reserved[1] - reserved[0], used[1] - used[0]
    gib = 2**30
    grows = abs(d_used - d_res) <= max(MEMORY_TOLERANCE * d_res, MEMORY_SLACK_BYTES)
    covers = used[1] >= reserved[1]
    ok = grows and covers and d_res > 0
    why = [w for w, bad in (
        ("NVML's used is below torch's reserved", not covers),
        (f"the allocation grew them differently (beyond {MEMORY_TOLERANCE:.0%} or "
         f"{MEMORY_SLACK_BYTES // 2**20} MiB)", not grows)) if bad]
    return Judgement("memory", ok, {"reserved": reserved[1], "used": used[1],
                                    "reserved_delta": d_res, "used_delta": d_used},
                     f"an allocation of {d_res / gib:.2f} GiB reserved by torch moved NVML's "
                     f"used by {d_used / gib:.2f} GiB; used {used[1] / gib:.2f} GiB >= reserved "
                     f"{reserved[1] / gib:.2f} GiB" + (f" ({'; '.join(why)})" if why else ""))


def peak(device: str, rows: list[tuple[str, float, float | None]]) -> Judgement:
    """Achieved FLOP/s against the table's peak, rows of (math, achieved, peak or None)."""
    known = [(m, a, p) for m, a, p in rows if p]
    if not known:
        return skipped("peak", f"no row in the peak table for {device!r} (no MFU either)")
    ok = all(PEAK_MIN <= a / p <= PEAK_MAX for _, a, p in known)
    parts = [f"{m} {a / 1e12:.1f} of {p / 1e12:.1f} TFLOP/s ({a / p:.0%})"
             + (" above the peak: the table's figure is too low" if a / p > PEAK_MAX
                else " under half the peak: a sparse figure in the table, or a throttled or "
                     "shared GPU" if a / p < PEAK_MIN else "")
             for m, a, p in known]
    figures = {f"{m}_share": a / p for m, a, p in known}
    return Judgement("peak", ok, figures, f"{device}: " + "; ".join(parts) +
                     f" (pass within {PEAK_MIN:.0%}-{PEAK_MAX:.0%})")
