"""How many loader workers: the fewest that out-run compute of the same `compute_setup` (article
003: the minimum that unblocks the GPU; each extra one costs host RAM)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gpubench.analysis.select import faulted, knob_of, loader_only
from gpubench.config.knobs import COMPUTE
from gpubench.config.overrides import format_value
from gpubench.config.schema import PRELOAD_HELPS
from gpubench.core.record import Word
from gpubench.core.stats import TOLERANCE, Est, count, figure

COMPUTE_DIR = "compute"  # a loader-only multirun's compute measurements, in its sweep dir
# what a data side that stays the bottleneck can try next (docs/data.md), by device: a key and
# its value, or words alone; on a CPU a device augment runs on the model's cores, no GPU waits
NEXT_STEPS: dict[str, tuple[tuple[str | None, Any], ...]] = {
    "cuda": (("dataset.preload", True), ("dataset.augment_on", "device"),
             (None, "more CPU cores per GPU")),
    "cpu": (("dataset.preload", True), (None, "more CPU cores"))}
# the keys the next steps set, and the dataset that decides whether preload saves anything
# (what pipes.json keeps of the runs' settings)
NEXT_KEYS = (*dict.fromkeys(k for steps in NEXT_STEPS.values() for k, _ in steps if k),
             "dataset.name")


def _text(v: Any) -> str:
    return format_value(v.value if isinstance(v, Enum) else v)


def more_workers(n: int, device: str | None, cores: int | None) -> int:
    """The worker count to measure after `n`: double it (2 at least), up to the host's `cores`
    (more only take turns). On a CPU, from 0, one: it loads on a core the model trains on, so
    its gain is measured against 0, not assumed."""
    want = 1 if n == 0 and device == "cpu" else max(2, 2 * n)
    return min(want, cores or want)


def next_steps(device: str | None, more_from: int | None = None,
               tried: Iterable[Mapping[str, Any]] = (), cores: int | None = None) -> str:
    """NEXT_STEPS for a run's device (unrecorded: CUDA's), led by more workers where the most
    tried, `more_from`, loaded fastest, up to the host's `cores`. A step setting a value one of
    the runs had (`tried`: their flat configs) is no next step: those runs measured it."""
    want = None if more_from is None else more_workers(more_from, device, cores)
    more = [("loader.num_workers", want)] if want is not None and want > more_from else []
    had = [{k: _text(v) for k, v in r.items()} for r in tried]
    # made in RAM (synthetic): preload has nothing to decode
    made = bool(had) and all(h.get("dataset.name") not in (None, *PRELOAD_HELPS) for h in had)
    return ", ".join(f"{k}={_text(v)}" if k else v
                     for k, v in [*more, *NEXT_STEPS.get(device, NEXT_STEPS["cuda"])]
                     if not k or all(h.get(k) != _text(v) for h in had)
                     and not (k == "dataset.preload" and made))


def least_cores(records: Iterable[Any]) -> int | None:
    """The fewest CPU cores of these runs' hosts; None where none is recorded."""
    return min((c for r in records if isinstance(c := r.env.get("cpu_count"), int) and c > 0),
               default=None)


class Feeds(Word):
    """A loader's interval against compute's: workers answer, loader check, sweep=pipes."""

    clears = "clears"  # its low end above compute's high end, the margin to spare
    short = "short"  # its whole interval below compute's: the data side stays the narrower pipe
    open = "open"  # the intervals overlap (or clear by less than the margin): not decided


def feeds(loader: Est, compute: Est, tolerance: float) -> Feeds:
    if clears(loader, compute, tolerance):
        return Feeds.clears
    return Feeds.short if loader.hi < compute.lo else Feeds.open


def undecided(longer: str = "") -> str:
    """Overlapping intervals, and what decides them: `longer`, the runs' own measure-longer,
    else its rule in words (a larger bench.steps alone keeps the interval's coverage)."""
    how = longer or "more windows of more steps: a larger bench.repeats and bench.steps"
    return f"the intervals overlap, so it is not decided: measure longer ({how}) or try more workers"


def workers(n: int) -> str:
    return count(n, "worker")


@dataclass
class WorkersPick:
    num_workers: int | None  # None: nothing measured to choose from
    unblocks: bool  # True: this loader out-runs compute
    tolerance: float = TOLERANCE
    rates: dict[int, Est] = field(default_factory=dict)
    compute: Est | None = None
    next: str = ""  # next_steps
    longer: str = ""  # the runs' own measure-longer, for `undecided`

    @property
    def loader_images_per_sec(self) -> float | None:
        return None if self.num_workers is None else self.rates[self.num_workers].value

    @property
    def _top(self) -> int:  # loaded fastest
        return max(self.rates, key=lambda x: self.rates[x].value)

    def _fewer(self) -> int | None:
        return max((x for x in self.rates if x < self.num_workers), default=None)

    @property
    def reason(self) -> str:
        """The report's loader check: figures without intervals."""
        w, c, tol = self.num_workers, self.compute, self.tolerance
        if w is None:
            return "no loader throughput measured"
        ips = self.rates[w].value
        loads = f"{workers(w)} load{'s' * (w == 1)} {ips:.1f} img/s"
        if self.unblocks:
            f = self._fewer()
            below = ("no fewer were measured" if f is None
                     else f"with {f}: {self.rates[f].value:.1f}")
            return f"{loads}, above compute {c.value:.1f} by more than {tol:.0%}; {below}"
        best = max(r.value for r in self.rates.values())
        plateau = f"{loads}, within {tol:.0%} of the best ({best:.1f})"
        if c is None:
            return f"compute throughput not measured; {plateau}"
        head = (f"no worker count measured out-runs compute {c.value:.1f} img/s; {plateau}, "
                f"{ips / c.value:.0%} of compute")
        if feeds(self.rates[self._top], c, tol) is Feeds.short:
            return f"{head}: the data side stays the bottleneck (next: {self.next})"
        return f"{head}: {undecided(self.longer)}"

    @property
    def threshold(self) -> float | None:
        return None if self.compute is None else clear_line(self.compute.hi, self.tolerance)

    def answer(self) -> str:
        """The report's workers answer, with the intervals and the margin."""
        w, c, tol = self.num_workers, self.compute, self.tolerance
        if w is None:
            return "workers: no loader throughput measured"
        if self.unblocks:
            f = self._fewer()
            below = "no fewer were measured" if f is None else (
                f"{workers(f)}: {self.rates[f]} does not (its low end {figure(self.rates[f].lo)} "
                f"is not above {figure(self.threshold)}, compute's high end + {tol:.0%})")
            return (f"workers: {w} ({clearing(self.rates[w], c)}, more than the {tol:.0%} "
                    f"margin); {below}")
        # a level is seen only below the most workers tried: at it, more may load faster
        plateau = (f"the loader levels off from {workers(w)}: {self.rates[w]} img/s, within "
                   f"{tol:.0%} of the best" if w < max(self.rates) else
                   f"the most tried, {workers(w)}, loads fastest ({self.rates[w]} img/s): more "
                   "may load faster still")
        if c is None:
            return f"workers: no compute bound to compare with; {plateau}"
        top = self._top
        counts = ", ".join(str(x) for x in sorted(self.rates))
        head = (f"workers: none of {counts} clears compute {c} img/s by {tol:.0%} (a low end "
                f"above {figure(self.threshold)}); the fastest, {workers(top)}, loads "
                f"{self.rates[top]} = {self.rates[top].over(c):.0%} of compute")
        if feeds(self.rates[top], c, tol) is Feeds.short:
            return f"{head}: the data side stays the bottleneck (next: {self.next}); {plateau}"
        return f"{head}: {undecided(self.longer)}; {plateau}"


def clears_by(margin: Est) -> str:
    """`by 50% [42%-62%]`, or past 100% in times (`10.6 [8.9-96.0] times over`, not the hard
    to read `by 6192% [149%-209139%]`)."""
    if margin.hi <= 1:
        return f"by {margin:.0%}"
    return f"{Est(margin.value + 1, margin.lo + 1, margin.hi + 1)} times over"


def clearing(loader: Est, compute: Est) -> str:
    """`loader 812 [790-840] img/s clears compute 540 [520-555] by 50% [42%-62%]`."""
    share = loader.over(compute)
    return (f"loader {loader} img/s clears compute {compute} "
            f"{clears_by(Est(share.value - 1, share.lo - 1, share.hi - 1))}")


_LOADER_FIELDS = ("num_workers", "loader_images_per_sec", "loader_images_per_sec_ci")


def _loader_rows(rows) -> dict[int, Est]:
    """{num_workers: loader rate, repeats pooled} from (num_workers, ips[, interval]) tuples or
    mappings named as in results.json; unmeasured ones dropped."""
    per: dict[int, list[Est]] = {}
    for r in rows:
        w, ips, ci = map(r.get, _LOADER_FIELDS) if isinstance(r, dict) else (*r, None)[:3]
        if w is not None and (rate := Est.of(ips, ci)) is not None:
            per.setdefault(int(w), []).append(rate)
    return {w: Est.pooled(v) for w, v in per.items()}


def clear_line(compute_hi: float, tolerance: float) -> float:
    """What a loader's low end must reach to clear compute: its high end, `tolerance` to spare."""
    return compute_hi * (1 + tolerance)


def clears(loader: Est, compute: Est, tolerance: float) -> bool:
    """Interval against interval: a figure alone above does not count."""
    return loader.lo >= clear_line(compute.hi, tolerance)


def fewest_workers(rows, compute_images_per_sec: float | Est | None,
                   tolerance: float = TOLERANCE, device: str | None = None,
                   tried: Iterable[Mapping[str, Any]] = (), cores: int | None = None,
                   longer: str = "") -> WorkersPick:
    """The fewest loader workers that clear compute; when none does, the plateau's start: the
    fewest within `tolerance` of the highest loader throughput (`tried`: the runs' flat
    configs, which the next steps leave out)."""
    loader, compute = _loader_rows(rows), Est.of(compute_images_per_sec)
    clear = [w for w in sorted(loader) if compute is not None
             and clears(loader[w], compute, tolerance)]
    best = max((r.value for r in loader.values()), default=0.0)
    plateau = min((x for x in loader if loader[x].value >= best * (1 - tolerance)), default=None)
    most = max(loader, default=None)
    top = max(loader, key=lambda x: loader[x].value, default=None)
    return WorkersPick(clear[0] if clear else plateau, bool(clear), tolerance, loader, compute,
                       next_steps(device, most if top == most else None, tried, cores), longer)


def compute_setup(get: Callable[[str], Any], device: Any) -> tuple[tuple[str, Any], ...]:
    """What a compute measurement must share with a loader run to bound it (`get`: a knob)."""
    return tuple((n, knob_of(get, n)) for n in COMPUTE) + (("device", device),)


def setup_of_run(rec: Any) -> tuple[tuple[str, Any], ...]:
    return compute_setup(rec.knob, rec.env.get("device"))


def compute_rate(rec: Any) -> Est | None:
    return (Est.of(rec.compute_images_per_sec, rec.compute_images_per_sec_ci)
            if rec.status.measured else None)


def compute_bound(records: Iterable[Any], setup: tuple) -> tuple[Est | None, list]:
    """The compute bound of loader runs of `setup`, and the runs it is read from: the envelope
    of every compute measurement of it (no loader-only run, none faulted: a stalled step's
    compute is no bound), the unflagged ones where any (a disturbed run reads low)."""
    sources = [m for m in records if setup_of_run(m) == setup
               and not loader_only(m) and not faulted(m) and compute_rate(m) is not None]
    sources = [m for m in sources if m.measurement_stable is not False] or sources
    return (Est.envelope([compute_rate(m) for m in sources]) if sources else None), sources


def compute_dir_name(setup: tuple[tuple[str, Any], ...]) -> str:
    """A readable folder name, unique by a digest: `tiny-32px-bs32-fp32-cpu-1a2b3c4d`."""
    s = dict(setup)
    model = str(s.get("model") or "model").rsplit(".", 1)[-1]
    head = f"{model}-{s.get('image_size')}px-bs{s.get('batch_size')}-{s.get('precision')}-" \
           f"{s.get('device')}"
    return re.sub(r"[^\w.\-]", "_", head) + f"-{hashlib.sha1(repr(setup).encode()).hexdigest()[:8]}"
