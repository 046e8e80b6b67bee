"""The words a reader sees for the phases and the verdicts, one table each: the console's table,
the run picture, and MLflow's run names and descriptions all read them from here."""

from __future__ import annotations

from dataclasses import dataclass

from gpubench.core.record import Bottleneck


@dataclass(frozen=True)
class PhaseWords:
    title: str  # the console's table: the phase and what it bounds
    short: str  # the run picture's bars and legend


PHASE_WORDS = {
    "loader": PhaseWords(title="loader (data bound)", short="loader only"),
    "compute": PhaseWords(title="compute (device bound)", short="compute only"),
    "e2e": PhaseWords(title="e2e (training)", short="end-to-end"),
}


@dataclass(frozen=True)
class VerdictWords:
    word: str  # MLflow's run name and `verdict` tag: `data 2410img/s resnet50-...`
    tag: str  # the headline of a run's description in MLflow: `**data-bound** 2410 [...]`
    sentence: str  # the run picture's title


VERDICT_WORDS = {
    Bottleneck.data: VerdictWords(word="data", tag="data-bound",
                                  sentence="the data side (loader) is the narrowest pipe"),
    Bottleneck.compute: VerdictWords(word="compute", tag="compute-bound",
                                     sentence="compute is the narrowest pipe"),
    Bottleneck.overlap: VerdictWords(word="overlap", tag="overlap",
                                     sentence="loading and compute do not overlap"),
    Bottleneck.inconclusive: VerdictWords(word="inconclusive", tag="inconclusive",
                                          sentence="inconclusive: no confident verdict"),
    Bottleneck.unknown: VerdictWords(word="unknown", tag="unknown",
                                     sentence="no verdict: not enough phases measured"),
}


def phase_title(name: str) -> str:
    return PHASE_WORDS[name].title if name in PHASE_WORDS else name


def verdict_words(bottleneck: Bottleneck | str | None) -> VerdictWords:
    """The words of a verdict (none recorded: unknown's); a word another version wrote is
    unknown too (Bottleneck.of)."""
    return VERDICT_WORDS[Bottleneck.of(bottleneck) or Bottleneck.unknown]


def verdict_word(bottleneck: Bottleneck | str | None) -> str:
    return verdict_words(bottleneck).word


def verdict_tag(bottleneck: Bottleneck | str | None) -> str:
    return verdict_words(bottleneck).tag


def verdict_sentence(bottleneck: Bottleneck | str | None) -> str:
    return verdict_words(bottleneck).sentence
