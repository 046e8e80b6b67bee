"""Settings of the gpubench sweeper, selected with `hydra/sweeper=gpubench`.

Imported by Hydra's plugin scan on every run, so it stays free of heavy imports (no Optuna here).
"""

# no `from __future__ import annotations`: Hydra's plugin scan runs this module outside
# sys.modules, where dataclasses cannot resolve string annotations
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore


class Mode(str, Enum):
    optuna = "optuna"  # maximize e2e images/sec under memory.ceiling
    max_batch = "max_batch"  # the largest batch that fits


class Sampler(str, Enum):
    tpe = "tpe"
    random = "random"


@dataclass
class ScreenConf:
    # cheap first measurement of every trial: this many measured steps; null turns screening off
    # (it is also off when bench.steps is not larger than this)
    steps: int | None = 10
    # fraction of screened trials measured again at full length (the others end PRUNED)
    keep: float = 0.5
    # the first trials are always measured in full, so the cut has something to compare with
    n_startup_trials: int = 2
    # more overrides for the screen; the e2e phase alone is what the objective needs
    overrides: list[str] = field(default_factory=lambda: ["bench.phases=[e2e]"])


@dataclass
class ConfirmConf:
    # after n_trials, the fastest `top` feasible full-length trials are measured again `rounds`
    # times each, interleaved (A, B, C, A, B, C) so drift hits them alike; `best` and the report
    # then judge them on all their measurements. 0 turns the step off
    top: int = 3
    rounds: int = 2


@dataclass
class MaxBatchConf:
    # first batch size tried; null: loader.batch_size of the composed config
    start: int | None = None
    # never probe above this
    limit: int = 4096
    # a probe measures memory, not speed: a few steps reach the peak
    overrides: list[str] = field(
        default_factory=lambda: ["bench.warmup_steps=1", "bench.steps=3"]
    )


@dataclass
class GpubenchSweeperConf:
    _target_: str = "hydra_plugins.gpubench_sweeper.sweeper.GpubenchSweeper"
    # optuna: maximize e2e images/sec under memory.ceiling; max_batch: largest batch that fits
    mode: Mode = Mode.optuna
    n_trials: int = 20
    # trials launched together; keep 1 unless the launcher puts each job on its own device
    n_jobs: int = 1
    # null: derived from the search space, so re-running the same command resumes its study
    study_name: str | None = None
    # an SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...); null: in memory (not
    # resumable, one worker). Several workers (machines) running the same command on one RDB
    # storage cooperate on one study (docs/scaling.md)
    storage: str | None = "sqlite:///outputs/optuna.db"
    sampler: Sampler = Sampler.tpe
    seed: int | None = None
    # random trials before TPE starts modelling
    n_startup_trials: int = 5
    # the sweep stops (with an error) after more failed trials than this in one invocation
    max_failures: int = 5
    # RDB storages: each worker records its running trial's heartbeat this often (seconds); a
    # trial whose worker stopped beating for grace_period seconds is failed and queued again
    heartbeat_interval: int = 10
    # null: 2 x heartbeat_interval (Optuna's default); keep it well above heartbeat_interval
    grace_period: int | None = 60
    screen: ScreenConf = field(default_factory=ScreenConf)
    confirm: ConfirmConf = field(default_factory=ConfirmConf)
    max_batch: MaxBatchConf = field(default_factory=MaxBatchConf)
    # search space in override syntax, e.g. {loader.batch_size: "choice(32,64,128)"};
    # command-line overrides of the same key win
    params: dict[str, Any] = field(default_factory=dict)
    # write the report (ranking, plots, recommended config) into the sweep dir at the end
    report: bool = True


ConfigStore.instance().store(
    group="hydra/sweeper", name="gpubench", node=GpubenchSweeperConf, provider="gpubench"
)
