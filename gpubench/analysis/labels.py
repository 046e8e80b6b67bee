"""The words a reader sees for the phases and the verdicts, one table each: the console's table,
the run picture, and MLflow's run names and descriptions all read them from here."""

from __future__ import annotations

from dataclasses import dataclass


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
    "data": VerdictWords(word="data", tag="data-bound",
                         sentence="the data side (loader) is the narrowest pipe"),
    "compute": VerdictWords(word="compute", tag="compute-bound",
                            sentence="compute is the narrowest pipe"),
    "overlap": VerdictWords(word="overlap", tag="overlap",
                            sentence="loading and compute do not overlap"),
    "inconclusive": VerdictWords(word="inconclusive", tag="inconclusive",
                                 sentence="inconclusive: no confident verdict"),
    "unknown": VerdictWords(word="unknown", tag="unknown",
                            sentence="no verdict: not enough phases measured"),
}


def phase_title(name: str) -> str:
    return PHASE_WORDS[name].title if name in PHASE_WORDS else name


def verdict_word(bottleneck: str) -> str:
    return VERDICT_WORDS[bottleneck].word if bottleneck in VERDICT_WORDS else bottleneck


def verdict_tag(bottleneck: str) -> str:
    return VERDICT_WORDS[bottleneck].tag if bottleneck in VERDICT_WORDS else bottleneck


def verdict_sentence(bottleneck: str) -> str:
    if bottleneck in VERDICT_WORDS:
        return VERDICT_WORDS[bottleneck].sentence
    return f"verdict: {bottleneck}"
