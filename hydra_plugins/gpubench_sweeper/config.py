"""Settings of the gpubench sweeper (`hydra/sweeper=gpubench`), each declared once with
gpubench.config.keys.setting (checked before Hydra builds anything; docs/configuration.md). A key
`*overrides` lists overrides the sweeper adds to some jobs, checked before any trial.
Imported by Hydra's plugin scan on every run: no Optuna here."""

# no `from __future__ import annotations`: Hydra's plugin scan runs this module outside
# sys.modules, where dataclasses cannot resolve string annotations
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore

from gpubench.config.keys import name_rule, setting
from gpubench.config.knobs import DATA_KEYS
from gpubench.core.stats import TOLERANCE


class Mode(str, Enum):
    optuna = "optuna"  # maximize e2e images/sec under memory.ceiling
    max_batch = "max_batch"  # the largest batch that fits
    pipes = "pipes"  # each pipe on its own (compute-only, loader-only), then joined end to end


class Sampler(str, Enum):
    tpe = "tpe"
    random = "random"


@dataclass
class ScreenConf:
    steps: int | None = setting(
        10, "a cheap first measurement of every trial, in measured steps; null: no screen (nor "
            "when bench.steps is not larger)", bounds=(1, None))
    keep: float = setting(0.5, "fraction of screened trials measured again at full length (the "
                               "others end PRUNED)", bounds=(1e-6, 1.0))
    n_startup_trials: int = setting(2, "the first trials are measured in full, so the cut has "
                                       "something to compare with", bounds=(0, None))
    overrides: list[str] = setting(
        factory=lambda: ["bench.phases=[e2e]"],
        help="more overrides for the screen (the e2e phase alone is what the objective needs)")


@dataclass
class ConfirmConf:
    top: int = setting(3, "after n_trials, the fastest top feasible full-length trials are "
                          "measured again, interleaved, and judged on all their measurements; "
                          "0: no confirm step", bounds=(0, None))
    rounds: int = setting(2, "how many times each is measured again", bounds=(1, None))


@dataclass
class MaxBatchConf:
    start: int | None = setting(None, "the first batch size tried; null: loader.batch_size "
                                         "of the composed config", bounds=(1, None))
    limit: int = setting(4096, "never probe above this", bounds=(1, None))
    overrides: list[str] = setting(
        factory=lambda: ["bench.warmup_steps=1", "bench.steps=3", "bench.min_window_s=0"],
        help="a probe measures memory, not speed: a few steps reach the peak, in windows as "
             "short as they take")


@dataclass
class PipesConf:
    data_keys: list[str] = setting(
        factory=lambda: list(DATA_KEYS),
        help="mode=pipes: the swept keys searched by loader-only trials; the other swept keys "
             "are searched by compute-only trials")
    compute_trials: int = setting(16, "compute-only trials at most; a compute space this small "
                                      "or smaller is measured whole", bounds=(1, None))
    keep: int = setting(2, "compute settings kept for the data pipe: the fastest, the smallest "
                           f"batch within {TOLERANCE:.0%} of it, then the next fastest", bounds=(1, None))
    data_trials: int = setting(12, "loader-only trials at most per kept compute setting, "
                                   "cheapest setting first", bounds=(1, None))
    join_trials: int = setting(
        4, "pairings measured end to end at most (one per kept setting, then the next data "
           "setting where the pipes contend)", bounds=(1, None))
    compute_overrides: list[str] = setting(
        factory=lambda: ["bench.phases=[compute]", "loader.num_workers=0"],
        help="overrides of a compute-only trial (the compute phase trains on one batch kept "
             "on the device: no loader worker is needed)")
    data_overrides: list[str] = setting(factory=lambda: ["bench.phases=[loader]"],
                                        help="overrides of a loader-only trial")
    join_overrides: list[str] = setting(
        factory=lambda: ["bench.phases=[e2e]"],
        help="overrides of a pairing's end-to-end runs (each pipe was measured on its own "
             "already); [] measures all three phases again")


@dataclass
class GpubenchSweeperConf:
    _target_: str = setting("hydra_plugins.gpubench_sweeper.sweeper.GpubenchSweeper",
                            "the sweeper class Hydra builds")
    mode: Mode = setting(Mode.optuna, "optuna: maximize e2e images/sec under memory.ceiling; "
                                      "max_batch: the largest batch that fits; pipes: compute "
                                      "and data pipes searched on their own, then joined "
                                      "([sweeps.md](sweeps.md#sweeppipes))")
    n_trials: int = setting(20, "measured trials to reach, over all invocations", bounds=(1, None))
    n_jobs: int = setting(1, "trials launched together; keep 1 unless the launcher puts each "
                             "job on its own device: parallel trials on one device corrupt each "
                             "other's throughput", bounds=(1, None))
    # Optuna's 512-character limit less the longest suffix the sweeper adds (pipes' -data-<8 hex>
    # and study.ROUNDS), so no study of the search is refused after the search ran
    study_name: str | None = setting(
        None, "null: gpubench-<hash of the search space>, so re-running the same command "
              "resumes its study", rule=name_rule(512 - len("-data-12345678-confirm")))
    storage: str | None = setting(
        "sqlite:///outputs/optuna.db",
        "Optuna's RDB storage; null: in memory (not resumable, one worker); a persistent one "
        "prints the optuna-dashboard command; workers on one storage share one study "
        "([scaling.md](scaling.md))",
        allowed="null or a SQLAlchemy URL: sqlite:///path.db, postgresql[+driver]://..., "
                "mysql[+driver]://..., mssql[+driver]://..., oracle[+driver]://...")
    sampler: Sampler = setting(Sampler.tpe, "Optuna's sampler")
    seed: int | None = setting(None, "the sampler's seed (a resume adds the number of trials "
                                     "so far); null: random", bounds=(0, 2**32 - 1))
    n_startup_trials: int = setting(5, "random trials before TPE models the space "
                                       "([benchmarks.md](benchmarks.md#search-efficiency))",
                                    bounds=(0, None))
    max_failures: int = setting(5, "the sweep stops (with an error) after more failed trials "
                                   "than this in one invocation", bounds=(0, None))
    heartbeat_interval: int = setting(
        10, "RDB storages: seconds between a running trial's heartbeats", bounds=(1, None))
    grace_period: int | None = setting(
        60, "a trial whose worker stopped beating this long is failed and queued again; above "
            "heartbeat_interval; null: 2 x heartbeat_interval (Optuna's default)", bounds=(1, None))
    screen: ScreenConf = field(default_factory=ScreenConf)
    confirm: ConfirmConf = field(default_factory=ConfirmConf)
    max_batch: MaxBatchConf = field(default_factory=MaxBatchConf)
    pipes: PipesConf = field(default_factory=PipesConf)
    params: dict[str, Any] = setting(
        factory=dict, help="the search space in override syntax ({loader.batch_size: "
                           "'choice(32,64,128)'}); command-line overrides of the same key win")
    report: bool = setting(True, "write the report (ranking, plots, recommended config) into the "
                                 "sweep dir at the end")


ConfigStore.instance().store(group="hydra/sweeper", name="gpubench", node=GpubenchSweeperConf,
                             provider="gpubench")
