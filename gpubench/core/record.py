"""The one record of a run (results.json): `load(run_dir)` reads it, `save()` writes it
atomically. What a run means for a search (`throughput`, `constraint`, `feasible`, `objective`)
is defined here only. No torch import: the sweeper, the report and tracking load without it."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from gpubench.core.files import read_json, write_json
from gpubench.core.pipe import loader_window_steps
from gpubench.core.stats import CONFIDENCE, count, finite, holding, positive

RESULTS_FILE = "results.json"
# beside it, for tracking to upload: the sampler's log (telemetry.gpulog), the profiler's traces
GPU_METRICS_FILE = "gpu_metrics.csv"
TRACE_DIR = "traces"
SCHEMA_VERSION = 2  # 1: the untyped dict
# an OOM's (or a run that measured nothing): worse than any over-ceiling run (peak - ceiling
# < 1), so samplers rank it the most infeasible
OOM_CONSTRAINT = 1.0
PHASE_NAMES = ("loader", "compute", "e2e")
HEADLINE_ORDER = ("e2e", "compute", "loader")  # the first measured stands for the run
# each phase's throughput as a top-level field (its interval: the same + "_ci")
PHASE_FIGURE = {"loader": "loader_images_per_sec", "compute": "compute_images_per_sec",
                "e2e": "images_per_sec"}
# the sweeper's study for its jobs (`study`, an MLflow tag: one search's jobs found together)
STUDY_ENV = "GPUBENCH_STUDY"
# the sweeper's rung around a batch of jobs, kept as `extra["rung"]` (an MLflow tag), so a
# report read from MLflow tells a probe or a screen from a full measurement
RUNG_ENV = "GPUBENCH_RUNG"
# sweep=pipes' compute pipe measures every compute bound: a loader-only job must not again
BOUNDS_MEASURED_ENV = "GPUBENCH_BOUNDS_MEASURED"
# a window shorter than this is too brief to judge: host CPU shares count 10 ms ticks, and a
# passing hiccup is a large part of it (analysis.noise; the advice's bench.min_window_s)
MIN_WINDOW_S = 0.5
# a raised bench.max_seconds spares this much over the pace measured: a rerun's pace moves
# (15% run to run on a shared host), and an exact cap cut the rerun short again
CAP_HEADROOM = 1.5


class Word(str, Enum):
    """A closed set of words, each written as its value (f-strings, logs, results.json, tags)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def read(cls, value: Any, default: Any = None) -> Any:  # `default`: a word unknown here
        try:
            return cls(value)
        except ValueError:
            return default


class Rung(Word):
    """How a sweep measured a job (RUNG_ENV, `extra["rung"]`, tags, sweep.json, Optuna)."""

    run = "run"  # not a gpubench sweeper's job: a single run or a grid sweep's job
    screen = "screen"  # a short first look at a trial (hydra.sweeper.screen.steps)
    full = "full"  # the trial measured at full length
    confirm = "confirm"  # a top trial measured again, interleaved (hydra.sweeper.confirm)
    probe = "probe"  # a max-batch search's probe

    @property
    def short(self) -> bool:  # measured too briefly to rank speed by
        return self in (Rung.screen, Rung.probe)

    @classmethod
    def of(cls, value: Any) -> Rung:  # missing or unknown (another version's): a plain run
        return cls.read(value, cls.run)


class Status(Word):
    running = "running"  # being measured, or left by a dead process (`stale`)
    ok = "ok"
    oom = "oom"
    over_ceiling = "over_ceiling"  # measured fine, peak memory above memory.ceiling
    failed = "failed"
    killed = "killed"  # Ctrl-C, SIGTERM, or found dead (kill -9, the OOM killer)
    # a sweep's job that refused its config as bad input (its one line is the error): the
    # report names it under the ranking, never as a row of it
    refused = "refused"

    @property
    def final(self) -> bool:
        return self is not Status.running

    @property
    def measured(self) -> bool:  # real speed figures (an over-ceiling run measured fine)
        return self in (Status.ok, Status.over_ceiling)

    @property
    def crashed(self) -> bool:  # no usable measurement: a sweep's failure, not a data point
        return self in (Status.failed, Status.killed, Status.running, Status.refused)


class Bottleneck(Word):
    """The verdict (gpubench.analysis.verdict): which pipe is narrowest, or why none is named."""

    data = "data"
    compute = "compute"
    overlap = "overlap"  # loading and compute run one after the other
    inconclusive = "inconclusive"  # the intervals or a disturbed run leave it open
    unknown = "unknown"  # not enough phases measured

    @classmethod
    def of(cls, value: Any) -> Bottleneck | None:  # another version's word: unknown
        return None if value is None else cls.read(value, cls.unknown)


class Flaw(Word):
    """What a noise reason (gpubench.analysis.noise) says is wrong with a measurement."""

    disturbed = "disturbed"  # other work competed: busy host, step times vary, interrupted steps
    too_short = "too_short"  # steps varied in windows too brief to tell a passing hiccup from that
    gpu = "gpu"  # throttled clocks, other processes on the GPU
    cut_short = "cut_short"  # windows closed by bench.max_seconds
    warmup = "warmup"  # warm-up did not settle
    few_windows = "few_windows"  # too few windows for a 95% interval
    queue = "queue"  # loader windows shorter than the batches in flight: they timed the queue
    unconfirmed = "unconfirmed"  # the confirm step's re-measurements disturbed or disagreed
    unchecked = "unchecked"  # the checks never ran
    other = "other"  # a reason written as text alone (an older record)


@dataclass(frozen=True)
class Reason:
    """A noise reason: its kind (what readers decide by) and its sentence (what they show)."""

    kind: Flaw
    text: str

    @classmethod
    def of(cls, v: Any) -> Reason:  # as stored ({kind, text}); a plain string (older): `other`
        if isinstance(v, Reason):
            return v
        if isinstance(v, dict):
            return cls(Flaw.read(v.get("kind"), Flaw.other), str(v.get("text", "")))
        return cls(Flaw.other, str(v))


class _Keys:
    """Fields as JSON keys; unknown keys (a newer version's) go to `extra` and back."""

    LOCAL = ("extra",)  # fields that are no keys of the file
    DERIVED: tuple[str, ...] = ()  # keys written, never read

    @classmethod
    def _keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in cls.LOCAL]

    @classmethod
    def from_dict(cls, d: dict, **given: Any) -> Any:
        keys = cls._keys()
        return cls(**({k: d[k] for k in keys if k in d} | given),
                   extra={k: v for k, v in d.items() if k not in keys and k not in cls.DERIVED})

    def to_dict(self, **derived: Any) -> dict:
        return {k: getattr(self, k) for k in self._keys()} | derived | self.extra


@dataclass
class PhaseRecord(_Keys):
    """One measured phase (loader, compute or e2e): all its windows pooled."""

    phase: str = "?"
    batch_size: int = 0
    steps: int = 0
    images: int = 0
    seconds: float | None = None
    images_per_sec: float | None = None
    images_per_sec_ci: list[float] | None = None
    images_per_sec_ci_coverage: float | None = None
    repeats: int = 1
    windows: list[dict] = field(default_factory=list)
    data_wait_s: float | None = None
    data_wait_fraction: float | None = None
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    step_time_mean_s: float | None = None
    step_time_cv: float | None = None
    warmup_steps: int = 0
    warmup_seconds: float | None = None
    warmup_settled: bool | None = None
    first_step_s: float | None = None
    truncated: bool = False
    ranks_images_per_sec: list[float] | None = None
    telemetry: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


@dataclass
class RunRecord(_Keys):
    """A run as results.json stores it (plus `objective`)."""

    LOCAL = ("extra", "dir", "rung")
    DERIVED = ("objective",)

    run_uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    status: Status = Status.running
    error: str | None = None
    schema_version: int = SCHEMA_VERSION
    images_per_sec: float | None = None
    images_per_sec_ci: list[float] | None = None
    loader_images_per_sec: float | None = None
    loader_images_per_sec_ci: list[float] | None = None
    compute_images_per_sec: float | None = None
    compute_images_per_sec_ci: list[float] | None = None
    bottleneck: Bottleneck | None = None
    reason: str | None = None
    verdict_margin: float | None = None
    advice: list[str] = field(default_factory=list)
    measurement_stable: bool | None = None
    noise_reasons: list[Reason] = field(default_factory=list)
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_fraction: float | None = None
    memory_ceiling: float = 1.0
    memory_source: str | None = None
    torch_peak_allocated_bytes: int | None = None
    torch_peak_reserved_bytes: int | None = None
    nvml_memory_used_bytes: int | None = None
    device_memory_bytes: int | None = None
    gpu_util_mean: float | None = None
    gpu_util_max: float | None = None
    gpu_mem_util_mean: float | None = None
    power_mean_w: float | None = None
    energy_per_image_j: float | None = None
    host_cpu_util_mean: float | None = None
    process_cpu_util_mean: float | None = None
    main_cpu_util_mean: float | None = None
    workers_cpu_util_mean: float | None = None
    peak_rss_bytes: int | None = None
    main_peak_rss_bytes: int | None = None
    workers_peak_rss_bytes: int | None = None
    read_mb_per_s: float | None = None
    disk_read_mb_per_s: float | None = None
    mfu: float | None = None
    flops_per_step: float | None = None
    achieved_tflops: float | None = None
    skipped_samples: int = 0
    phases: dict[str, PhaseRecord] = field(default_factory=dict)
    series: dict[str, dict] = field(default_factory=dict)
    data_info: dict = field(default_factory=dict)
    world_size: int = 1
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    pid: int | None = None  # with host: a record left `running` by a dead process is found
    host: str | None = None
    started_at: str | None = None
    seconds: float | None = None
    extra: dict = field(default_factory=dict, repr=False)
    # not serialized: where it was read from / is written to, and how a sweep measured it
    dir: Path | None = field(default=None, repr=False, compare=False)
    rung: Rung = field(default=Rung.run, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rung = Rung.of(self.rung)
        self.bottleneck = Bottleneck.of(self.bottleneck)
        self.noise_reasons = [Reason.of(r) for r in self.noise_reasons]

    @classmethod
    def start(cls, run_dir: Path, config: dict, env: dict, memory_ceiling: float,
              world_size: int = 1, **fields: Any) -> RunRecord:
        return cls(
            memory_ceiling=float(memory_ceiling), world_size=world_size, config=config, env=env,
            pid=os.getpid(), host=socket.gethostname(),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), dir=Path(run_dir), **fields)

    @classmethod
    def from_dict(cls, d: dict, run_dir: Path | None = None, rung: Rung | str | None = None
                  ) -> RunRecord:
        """`rung`: how the reader's sweep measured it; by default the job's own (results.json)."""
        kw = {k: dict(d.get(k) or {}) for k in ("series", "data_info", "config", "env")}
        kw |= {k: list(d.get(k) or []) for k in ("advice", "noise_reasons")}
        kw["phases"] = {n: PhaseRecord.from_dict(p) for n, p in (d.get("phases") or {}).items()}
        if d.get("memory_ceiling") is None:
            kw["memory_ceiling"] = float(kw["config"].get("memory", {}).get("ceiling") or 1.0)
        return super().from_dict(
            d, **kw, status=Status.read(d.get("status"), Status.failed),
            schema_version=int(d.get("schema_version") or 1), run_uid=d.get("run_uid") or "",
            dir=Path(run_dir) if run_dir is not None else None, rung=rung or d.get("rung"))

    def to_dict(self) -> dict:
        return super().to_dict(
            status=self.status.value, phases={k: p.to_dict() for k, p in self.phases.items()},
            noise_reasons=[dataclasses.asdict(r) for r in self.noise_reasons],
            objective=self.objective if self.status.final else None)

    @property
    def cut_short(self) -> bool:  # some phase's windows closed by bench.max_seconds
        return any(p.truncated for p in self.phases.values())

    @property
    def path(self) -> Path:
        if self.dir is None:
            raise ValueError("this record has no run dir")
        return self.dir / RESULTS_FILE

    def save(self) -> Path:
        write_json(self.path, self.to_dict())
        return self.path

    @property
    def headline(self) -> PhaseRecord | None:
        return next((self.phases[n] for n in HEADLINE_ORDER if n in self.phases), None)

    @property
    def throughput(self) -> float:
        """The first positive in HEADLINE_ORDER; 0.0 when none or not measured."""
        figures = (v for v, _ in map(self.phase_figure, HEADLINE_ORDER) if positive(v))
        return float(next(figures, 0.0)) if self.status.measured else 0.0

    def phase_figure(self, name: str) -> tuple[float | None, list[float] | None]:
        return getattr(self, PHASE_FIGURE[name]), getattr(self, PHASE_FIGURE[name] + "_ci")

    def phase_coverage(self, name: str) -> float | None:
        """Phase `name`'s interval coverage (3 windows: 75%; more: CONFIDENCE); an older record
        without it: CONFIDENCE, as then every interval was; None without an interval."""
        p = self.phases.get(name)
        if p is None:
            return CONFIDENCE if self.phase_figure(name)[1] else None
        if not p.images_per_sec_ci:
            return None
        c = p.images_per_sec_ci_coverage
        return CONFIDENCE if c is None else min(c, CONFIDENCE)

    @property
    def coverages(self) -> list[float]:  # of the phases with an interval
        return [c for n in PHASE_NAMES if (c := self.phase_coverage(n)) is not None]

    def _throughput_phase(self) -> tuple[str | None, list[float] | None]:
        """The first phase whose figure is `throughput`, with an interval: (name, interval)."""
        t = self.throughput
        return next(((n, ci) for n in HEADLINE_ORDER if (f := self.phase_figure(n))[0] == t
                     and (ci := f[1])), (None, None))

    @property
    def interval_coverage(self) -> float:  # throughput_interval's; CONFIDENCE without one
        name = self._throughput_phase()[0]
        c = self.phase_coverage(name) if name is not None else None
        return CONFIDENCE if c is None else c

    @property
    def interval_label(self) -> str:
        return interval_label_of(self.coverages)

    @property
    def throughput_interval(self) -> tuple[float, float]:
        return holding(self._throughput_phase()[1], self.throughput)

    @property
    def constraint(self) -> float:
        """Peak memory fraction - ceiling. An OOM, or a failure without a memory figure, is
        infeasible; an ok run whose peak could not be read (monitor off on a CPU): 0.0."""
        if self.status is Status.oom:
            return OOM_CONSTRAINT
        if not finite(self.peak_memory_fraction):
            return 0.0 if self.status is Status.ok else OOM_CONSTRAINT
        return float(self.peak_memory_fraction) - float(self.memory_ceiling)

    @property
    def feasible(self) -> bool:
        return self.status is Status.ok and self.throughput > 0 and self.constraint <= 0

    @property
    def objective(self) -> float:  # what a sweeper maximizes; always finite
        return self.throughput if self.feasible else 0.0

    @property
    def full(self) -> bool:  # a full-length measurement, not a screen or a max-batch probe
        return not Rung.of(self.rung).short

    def fits_under(self, reserve: float) -> bool:
        """A probe's peak under ceiling x (1 - reserve): room for what a longer run adds."""
        if not self.status.measured:
            return False
        if not finite(self.peak_memory_fraction):
            return self.status is Status.ok
        return self.peak_memory_fraction <= self.memory_ceiling * (1.0 - reserve)

    def knob(self, dotted: str) -> Any:  # None when absent
        node: Any = self.config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    @property
    def stale(self) -> bool:
        """Left `running` by a process gone from this host (kill -9, OOM killer, full disk)."""
        return (self.status is Status.running and bool(self.pid)
                and process_alive(self.host, int(self.pid)) is False)

    @property
    def complete(self) -> bool:
        """Every phase its config asks for saved with all its windows."""
        bench = (self.config or {}).get("bench") or {}
        try:
            windows = window_plan(bench.get("steps") or 1, bench.get("repeats") or 1)[0]
        except (TypeError, ValueError, AttributeError):  # not a record's config
            return False
        return bool(bench.get("phases")) and all(
            n in self.phases and len(self.phases[n].windows) >= windows for n in bench["phases"])

    @property
    def memory_of(self) -> str:
        """What peak_memory_fraction is of: host RAM where it read RSS (a CPU run)."""
        return "host RAM" if self.memory_source == "host_rss" else "the device"

    def finish(self, status: Status, error: str | None) -> None:
        """ok above the memory ceiling is over_ceiling (measured, infeasible)."""
        frac = self.peak_memory_fraction
        if status is Status.ok and finite(frac) and frac > self.memory_ceiling:
            status = Status.over_ceiling
            error = (f"peak memory {frac:.1%} of {self.memory_of} > memory.ceiling "
                     f"{self.memory_ceiling:.0%}")
        self.status, self.error = status, error

    def mark_dead(self) -> None:
        """A `stale` record: kept when `complete`, else killed (the caller saves)."""
        if self.complete:
            return self.recover(f"process {self.pid} on {self.host} ended before its final status")
        self.status = Status.killed
        self.error = self.error or (f"process {self.pid} on {self.host} ended without a final "
                                    "status (killed: kill -9 or out of host memory)")

    def recover(self, why: str) -> None:
        """Kept as ok: no verdict (it needs the run's settings), its checks marked not run."""
        for name, attr in PHASE_FIGURE.items():  # an older runner left these to the summary
            if (p := self.phases.get(name)) is not None and getattr(self, attr) is None:
                setattr(self, attr, p.images_per_sec)
                setattr(self, attr + "_ci", p.images_per_sec_ci)
        self.finish(Status.ok, None)
        if self.measurement_stable is None:  # never ranked above a run whose checks ran
            self.measurement_stable = False
            self.noise_reasons.append(Reason(
                Flaw.unchecked, "not checked: the run ended before its validity checks"))
        self.extra["recovered"] = f"{why}; every phase was measured and saved: kept as measured"


def window_plan(steps: int, repeats: int) -> tuple[int, int]:
    """(windows, steps per window): at most a window a step, split evenly, rounded up."""
    windows = max(1, min(int(repeats), int(steps)))
    return windows, max(1, -(-int(steps) // windows))


def phase_plan(phase: str, steps: int, repeats: int, loader: Any) -> tuple[int, int]:
    """(windows, steps per window) of a phase: the loader's longer where its workers keep more
    batches in flight (`loader`: its config, a dict or the settings' node)."""
    windows, per_window = window_plan(steps, repeats)
    if phase == "loader":
        per_window = loader_window_steps(per_window, int(loader.get("num_workers") or 0),
                                         loader.get("prefetch_factor"))
    return windows, per_window


def windows_of(windows: int, per_window: int, min_s: Any = 0) -> str:
    """`6 windows of 4 steps`, `... of at least 4 steps and 2 s`: every text's window plan."""
    return f"{count(windows, 'window')} of {window_text(per_window, min_s)}"


def window_text(steps: int, min_s: Any = 0) -> str:
    if isinstance(min_s, (int, float)) and min_s > 0:
        return f"at least {count(steps, 'step')} and {min_s:g} s"
    return count(steps, "step")


def longer_plan(steps: int, repeats: int) -> tuple[int, int]:
    """(steps, repeats) of every "measure longer": at least 10 windows (narrowing the median's
    interval), each twice the steps it had (steadier), and four times the steps in all."""
    per_window = window_plan(steps, repeats)[1]
    more = max(repeats, 10)
    return max(4 * steps, more * 2 * per_window), more


@dataclass(frozen=True)
class Longer:
    """A "measure longer"'s overrides as the command line takes them (None: not set)."""

    steps: int | None
    repeats: int | None
    max_seconds: float | None = None
    min_window_s: float | None = None
    warmup_max_steps: int | None = None  # where the warm-up ended unsettled at its cap

    def __str__(self) -> str:
        if self.steps is None or self.repeats is None:  # not a record's config
            return "bench.steps=... bench.repeats=..."
        more = [f"bench.{k}={v:g}" for k in ("max_seconds", "min_window_s", "warmup_max_steps")
                if (v := getattr(self, k)) is not None]
        return " ".join([f"bench.steps={self.steps} bench.repeats={self.repeats}", *more])


# how a run was measured (window plan, caps): runs apart in these are other measurements
PLAN_KEYS = tuple(f"bench.{f.name}" for f in dataclasses.fields(Longer))


def bench_of(rec: RunRecord | None) -> tuple[dict, int | None, int | None]:
    """(`bench`, steps, repeats); None, None unless both positive ints (an early record)."""
    b = ((rec.config if rec is not None else None) or {}).get("bench") or {}
    steps, repeats = b.get("steps"), b.get("repeats")
    if isinstance(steps, int) and isinstance(repeats, int) and steps >= 1 and repeats >= 1:
        return b, steps, repeats
    return b, None, None


def longer(rec: RunRecord | None, plan: tuple[int, int] | None = None) -> Longer:
    """Every "measure longer" of run `rec` (advice, verdict, report, recommended.yaml): `plan`
    (steps, repeats), by default longer_plan's; where bench.max_seconds would cut those steps
    short, the cap they need at the pace each phase ran (more steps alone are cut again)."""
    b, steps, repeats = bench_of(rec)
    if steps is None:
        return Longer(None, None)
    cap = b.get("max_seconds")
    new_steps, new_repeats = plan or longer_plan(steps, repeats)
    flaws = {r.kind for r in rec.noise_reasons}
    # windows too brief to tell a hiccup from competition: more steps alone leave a fast
    # model's windows as brief, a least duration does not (bench.min_window_s)
    brief = Flaw.too_short in flaws and not (b.get("min_window_s") or 0) >= MIN_WINDOW_S
    min_window = MIN_WINDOW_S if brief else None
    # a warm-up that ended unsettled at its cap: more measured steps start it no more settled
    warm = b.get("warmup_max_steps")
    warm = (2 * max(warm, b.get("warmup_steps") or 1, 5)
            if isinstance(warm, int) and Flaw.warmup in flaws else None)
    if not positive(cap):
        return Longer(new_steps, new_repeats, None, min_window, warm)
    ld = (rec.config or {}).get("loader") or {}

    def planned(phase: str, steps: int, repeats: int) -> int:
        return math.prod(phase_plan(phase, steps, repeats, ld))

    def paced(n: str, p: PhaseRecord) -> float:  # the new plan at the pace the phase ran
        ran = max(p.steps, 1e-3 * planned(n, steps, repeats))  # a cut phase may have none
        seconds = p.seconds if p.seconds and not p.truncated else cap  # a cut one ran its cap
        return seconds * planned(n, new_steps, new_repeats) / ran

    # every phase, not only a cut one: a run inside its cap can need more for the longer plan
    # (the default run's first "measure longer" was cut short at 60 s when followed)
    need = max((paced(n, p) for n, p in rec.phases.items() if p.truncated or p.steps and p.seconds),
               default=0.0) * CAP_HEADROOM  # a cut_short run has a truncated phase here
    # each window lasts at least bench.min_window_s and at most bench.max_seconds / bench.repeats
    # (settings refuses a least window above it): more windows need a cap that holds them
    least = min_window if min_window is not None else b.get("min_window_s")
    if isinstance(least, (int, float)) and least > 0:
        need = max(need, least * new_repeats)
    need = math.ceil(need) if need >= 10 else math.ceil(10 * need) / 10
    return Longer(new_steps, new_repeats, need if need > cap else None, min_window, warm)


def interval_label_of(coverages: Iterable[float]) -> str:
    """'95% interval', or where they differ (a table of several runs) '75-95% interval'; none:
    a column of single figures claims no coverage."""
    pct = sorted({round(100 * c) for c in coverages})
    if not pct:
        return "interval"
    return f"{pct[0]}% interval" if len(pct) == 1 else f"{pct[0]}-{pct[-1]}% interval"


def process_alive(host: str | None, pid: int) -> bool | None:
    """Whether process `pid` of `host` exists; None when not tellable from here."""
    if not host or host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except PermissionError:  # exists, owned by someone else
        return True
    except (ProcessLookupError, OverflowError, ValueError):  # gone, or not a pid at all
        return False
    return True


def load(run_dir: str | Path, rung: Rung | str | None = None) -> RunRecord | None:
    """The record in `run_dir` (or at its results.json); None when unreadable."""
    p = Path(run_dir)
    p = p.parent if p.name == RESULTS_FILE else p
    d = read_json(p / RESULTS_FILE)
    return RunRecord.from_dict(d, p, rung) if isinstance(d, dict) else None


def missing(run_dir: str | Path, error: str, rung: Rung | str | None = None) -> RunRecord:
    """A failed stand-in, with the reason, for a job that left no readable results.json."""
    return RunRecord(run_uid="", status=Status.failed, error=error, dir=Path(run_dir), rung=rung)


def find_runs(root: str | Path) -> list[Path]:
    """Run folders under `root`, in a stable order; MLflow's artifact stores (uploaded copies,
    not runs) and hidden folders are never entered."""
    found = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in ("mlartifacts", "mlruns") and not d.startswith("."))
        if RESULTS_FILE in files:
            found.append(Path(dirpath))
    return found
