"""The words a reader sees for the phases, verdicts and flaws (console, run picture, MLflow,
the sweep report)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import NamedTuple

from gpubench.core.record import Bottleneck, Flaw


class PhaseWords(NamedTuple):
    title: str  # the console's table: the phase and what it bounds
    short: str  # the run picture's bars and legend


PHASE_WORDS = {
    "loader": PhaseWords(title="loader (data bound)", short="loader only"),
    "compute": PhaseWords(title="compute (device bound)", short="compute only"),
    "e2e": PhaseWords(title="e2e (training)", short="end-to-end"),
}


class VerdictWords(NamedTuple):
    """Words beside a verdict's one word, its Bottleneck value (MLflow run name, `verdict` tag)."""

    tag: str  # the headline of a run's description in MLflow: `**data-bound** 2410 [...]`
    sentence: str  # the run picture's title


VERDICT_WORDS = {
    Bottleneck.data: VerdictWords("data-bound", "the data side (loader) is the narrowest pipe"),
    Bottleneck.compute: VerdictWords("compute-bound", "compute is the narrowest pipe"),
    Bottleneck.overlap: VerdictWords("overlap", "loading and compute do not overlap"),
    Bottleneck.inconclusive: VerdictWords("inconclusive", "inconclusive: no confident verdict"),
    Bottleneck.unknown: VerdictWords("unknown", "no verdict: not enough phases measured"),
}


def verdict_words(bottleneck: Bottleneck | str | None) -> VerdictWords:
    """The words of a verdict; none recorded, or a word another version wrote: unknown's."""
    return VERDICT_WORDS[Bottleneck.of(bottleneck) or Bottleneck.unknown]


class Remedy(Enum):
    """What a flawed measurement asks of its rerun: a quiet machine where other work moved its
    figures, a longer one where its plan was too brief to judge (`rerun ...`, in this order)."""

    quiet = "on a quiet machine"
    longer = "measuring longer"


class FlawWords(NamedTuple):
    word: str  # a legend's, the ranking's status, the console's verdict: `cut short`
    remedy: Remedy
    # reads high, not only slower or wider (a loader window holding batches made before it
    # began, or one cut short): such a run never answers a question
    inflates: bool = False


# every reader words a flaw and its remedy from here (console, ranking, recommendation, plots)
FLAWS = {
    Flaw.disturbed: FlawWords("disturbed", Remedy.quiet),
    Flaw.too_short: FlawWords("too short", Remedy.longer),
    Flaw.gpu: FlawWords("disturbed", Remedy.quiet),  # a shared or throttled GPU
    Flaw.cut_short: FlawWords("cut short", Remedy.longer, inflates=True),
    Flaw.warmup: FlawWords("warm-up unsettled", Remedy.longer),
    Flaw.few_windows: FlawWords("too few windows", Remedy.longer),
    Flaw.queue: FlawWords("queue-timed", Remedy.longer, inflates=True),
    Flaw.unconfirmed: FlawWords("unconfirmed", Remedy.quiet),
    Flaw.unchecked: FlawWords("disturbed", Remedy.quiet),  # ended before its checks
    Flaw.other: FlawWords("disturbed", Remedy.quiet),  # a sentence alone: an older record's
}


def flaw_words(kinds: Iterable[Flaw]) -> list[str]:
    """Each once, in Flaw's order: ['too short', 'cut short']."""
    kinds = set(kinds)
    return list(dict.fromkeys(FLAWS[k].word for k in Flaw if k in kinds))


def rerun_text(kinds: Iterable[Flaw], longer: str | None = None, what: str = "") -> str:
    """What these flaws ask: `rerun on a quiet machine`, `rerun <what> measuring longer (...)`."""
    asked = {FLAWS[k].remedy for k in kinds}
    return " ".join(["rerun", *([what] if what else []), ", ".join(
        r.value + (f" ({longer})" if r is Remedy.longer and longer else "")
        for r in [r for r in Remedy if r in asked] or [Remedy.quiet])])


# what the compute- and data-bound sentences add when e2e's interval straddles the tracking line
_COSTS = ("; overlap costs {loss.lo:.0%}-{loss.hi:.0%} (e2e {e2e:.1f} img/s is {tracking:.0%} "
          "of it; whether it loses more than {loses:.0%} is left open by the intervals)")
# e2e above what the pipes allow: what the figures show, and why it flags the measurement
ABOVE_OWN_BOUND = ("e2e {e2e:.1f} img/s is above its own upper bound, {narrower} at {bound:.1f} "
                   "({tracking:.0%})")
IMPOSSIBLE = "impossible in a steady run, so something disturbed the measurement"
_DATA = "data-bound: the loader delivers {loader:.1f} img/s, {supply:.0%} of what"


class Case(Enum):
    """Why the verdict rule decided, filled from its figures (`compute`: named `compute_name`)."""

    data_tracks = _DATA + " compute takes ({compute:.1f}); e2e {e2e:.1f} tracks it ({tracking:.0%})"
    data_no_e2e = _DATA + " compute takes ({compute:.1f}) (e2e not measured)"
    data_open_overlap = _DATA + " {compute_name} takes ({compute:.1f})" + _COSTS
    compute_tracks = ("compute-bound: e2e {e2e:.1f} img/s is {of_compute:.0%} of {compute_name} "
                      "{compute:.1f}; the loader ({loader:.1f}) keeps up")
    compute_no_e2e = ("compute-bound: loader {loader:.1f} vs compute {compute:.1f} img/s "
                      "(e2e not measured)")
    compute_open_overlap = ("compute-bound: the loader ({loader:.1f} img/s) keeps up with "
                            "{compute_name} {compute:.1f} ({supply:.0%} of it)" + _COSTS)
    overlap = ("overlap: e2e {e2e:.1f} img/s is {tracking:.0%} of the narrower bound, {narrower} "
               "at {bound:.1f}: loading and compute run one after the other instead of overlapping")
    supply_open = ("the loader ({loader:.1f} img/s) is {supply:.0%} of compute ({compute:.1f}): "
                   "its interval straddles the {well_below:.0%} line between data- and "
                   "compute-bound")
    both_open = ("e2e {e2e:.1f} img/s is {tracking:.0%} of the narrower bound ({narrower}, "
                 "{bound:.1f}): its interval straddles the {tracks:.0%} line between tracking a "
                 "bound and losing time to poor overlap, and the loader's share of compute "
                 "({supply:.0%}) straddles the {well_below:.0%} line")
    above_bound = ABOVE_OWN_BOUND + ": " + IMPOSSIBLE
    waits_on_data = "the loop waits on data {wait:.0%} of the time"
    waits_little = "the loop waits on data only {wait:.0%} of the time"
    unstable = "measurement unstable: {flaws}"
    unstable_leaning = "measurement unstable: {flaws} (the figures lean to {lean})"
    too_few_phases = "not enough phases measured to compare (run loader, compute and e2e)"


class Step(Enum):
    """A next step the advice can name (analysis.verdict.advise; articles 000, 001, 003)."""

    contention = ("on a CPU the loader's {workers} take{s} cores from the model itself "
                  "({cpu_count} cores here): this gap is contention; on a GPU the two overlap")
    workers_from_zero = ("loader.num_workers=2 or more: with 0 workers the main process loads each "
                         "batch while the device waits (article 003: >= 2 workers gave ~1.5x)")
    # on a CPU the workers load on the cores the model trains on: a gain to measure, not assume
    workers_from_zero_on_cpu = (
        "loader.num_workers=1, measured against 0 (`-m loader.num_workers=0,1`): with 0 workers "
        "the model waits while each batch loads, but on a CPU a worker takes one of the "
        "{cpu_count} cores the model trains on")
    more_workers = ("loader.num_workers={more_workers} (now {num_workers}, host has {cpu_count} "
                    "cores); sweep it with `-m bench.phases=[loader] loader.num_workers=...` and "
                    "keep the fewest that out-run compute")
    pin_memory = "loader.pin_memory=true: pinned host memory makes the copy asynchronous"
    preload = ("dataset.preload=true: decode once into RAM, then only augment per step "
               "(article 000, Method 1)")
    augment_on_device = "dataset.augment_on=device: crop/flip/normalize on the GPU, not in workers"
    more_cpu = ("the host's cores are all loading: a host with more CPU per GPU (article 003: "
                "marry the right CPU/RAM to the GPU)")
    more_cpu_on_cpu = ("the host's cores are all loading and training: a host with more cores "
                       "({cpu_count} here)")
    amp = "precision=amp_bf16 (amp_fp16 before Ampere): mixed precision gave ~1.7x in article 003"
    amp_on_cpu = ("precision=amp_bf16: CPU autocast runs matmuls/convs in bfloat16 (faster only "
                  "on CPUs with bf16 units, e.g. AVX512-BF16 or AMX: measure it)")
    channels_last = "channels_last=true: tensor-core convolutions prefer NHWC"
    compile = "compile=default: torch.compile fuses the elementwise ops between convs"
    larger_batch = ("loader.batch_size={double_batch}: memory peaks at {memory_fraction:.0%} of "
                    "{memory_of} (ceiling {ceiling:.0%}); a larger batch may raise throughput "
                    "while compute-bound, keep the smallest that gets near the peak")
    on_cpu = "this ran on the CPU: on a GPU the compute bound is far higher"
    all_phases = "bench.phases=[loader,compute,e2e] to get a verdict"
    smaller_batch = ("loader.batch_size={half_batch}: batch {batch_size} ran out of memory; "
                     "`python -m gpubench sweep=max_batch` finds the largest that fits under "
                     "memory.ceiling")
    amp_for_memory = ("precision=amp_bf16: mixed precision keeps activations in 16 bits, about "
                      "half their memory")
