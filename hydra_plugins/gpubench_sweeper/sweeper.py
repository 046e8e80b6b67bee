"""gpubench's Hydra sweeper: the thin front of gpubench.search.loop (Optuna) and gpubench.search.maxbatch.

Hydra builds it from `GpubenchSweeperConf` (config.py); `sweep()` checks the settings, opens the
study and hands over to the library, which launches every trial as an ordinary Hydra job through
the configured launcher (so callbacks such as the MLflow one see it as a child run) and reads its
results.json through gpubench.core.record. What a sweep does per trial, on resume, and with several
workers on one study is written in gpubench/search.py and gpubench/study.py.

Imported by Hydra's plugin scan on every run: Optuna and SQLAlchemy load only when a sweep starts.
"""

from __future__ import annotations

import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from gpubench.core.files import write_json, write_text
from gpubench.core.record import STUDY_ENV  # torch-free: jobs tag their runs with their study
from gpubench.core.secrets import mask_secrets
from gpubench.core.uris import SQL_SCHEMES

log = logging.getLogger("gpubench.sweep")


class SweeperConfigError(ValueError):
    """A bad hydra.sweeper setting; its message is one line naming key, value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        v = value.value if isinstance(value, Enum) else value
        super().__init__(f"hydra.sweeper.{key}={v!r}: allowed: {allowed}")


def check_storage(url: str | None) -> None:
    """A storage is an SQLAlchemy URL of a database Optuna's RDB storage knows."""
    if url is None:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    allowed = ("null (in memory) or an SQLAlchemy URL such as sqlite:///outputs/optuna.db or "
               "postgresql+psycopg://user@host/db")
    try:
        u = make_url(str(url))
    except (ArgumentError, ValueError):
        raise SweeperConfigError("storage", url, allowed) from None
    if u.get_backend_name() not in SQL_SCHEMES:
        raise SweeperConfigError("storage", url, allowed)


class GpubenchSweeper(Sweeper):
    def __init__(self, mode, n_trials: int, n_jobs: int, study_name: str | None,
                 storage: str | None, sampler, seed: int | None, n_startup_trials: int,
                 max_failures: int, heartbeat_interval: int, grace_period: int | None,
                 screen: DictConfig, max_batch: DictConfig, params: DictConfig | None,
                 report: bool, confirm: DictConfig | None = None) -> None:
        # checked in sweep(), not here: Hydra wraps an error raised while instantiating into a
        # multi-line report
        self.mode, self.sampler = mode, sampler
        self.n_trials, self.n_jobs, self.max_failures = n_trials, n_jobs, max_failures
        self.study_name, self.storage, self.seed = study_name, storage, seed
        self.n_startup_trials = n_startup_trials
        self.heartbeat_interval, self.grace_period = heartbeat_interval, grace_period
        self.screen, self.max_batch = screen, max_batch
        self.confirm = confirm if confirm is not None else {"top": 3, "rounds": 2}
        self.params = {str(k): v for k, v in (params or {}).items()}
        self.report = bool(report)
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None

    def check(self) -> None:
        """Every setting, before any work; SweeperConfigError names the first bad one."""
        from hydra_plugins.gpubench_sweeper.config import Mode, Sampler

        for key, enum in (("mode", Mode), ("sampler", Sampler)):
            v = getattr(self, key)
            try:
                setattr(self, key, enum(v.value if isinstance(v, Enum) else v))
            except ValueError:
                raise SweeperConfigError(key, v, " or ".join(m.value for m in enum)) from None
        for key, low in (("n_trials", 1), ("n_jobs", 1), ("max_failures", 0),
                         ("n_startup_trials", 0), ("heartbeat_interval", 1)):
            v = getattr(self, key)
            if not isinstance(v, int) or v < low:
                raise SweeperConfigError(key, v, f"an integer >= {low}")
        if self.grace_period is not None and self.grace_period <= self.heartbeat_interval:
            raise SweeperConfigError("grace_period", self.grace_period,
                                     f"null or seconds > heartbeat_interval "
                                     f"({self.heartbeat_interval})")
        keep = self.screen.keep
        if not 0.0 < float(keep) <= 1.0:
            raise SweeperConfigError("screen.keep", keep, "a fraction in (0, 1]")
        steps = self.screen.steps
        if steps is not None and int(steps) < 1:
            raise SweeperConfigError("screen.steps", steps, "null (no screen) or an integer >= 1")
        for key, low in (("top", 0), ("rounds", 1)):
            v = self.confirm[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise SweeperConfigError(f"confirm.{key}", v,
                                         f"an integer >= {low}" + (" (0: no confirm step)"
                                                                   if low == 0 else ""))
        if int(self.max_batch.limit) < 1:
            raise SweeperConfigError("max_batch.limit", self.max_batch.limit, "an integer >= 1")
        start = self.max_batch.start
        if start is not None and int(start) < 1:
            raise SweeperConfigError("max_batch.start", start, "null or an integer >= 1")
        check_storage(self.storage)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from gpubench.cli.errors import release_stderr
        from gpubench.config.schema import ConfigError
        from gpubench.search.space import SearchSpaceError

        release_stderr()  # composed fine: what follows (Optuna's log lines too) is no compose error
        try:
            return self._sweep(arguments)
        # ConfigError: a key the sweeper itself reads (max batch's memory.*, its first probe)
        except (SweeperConfigError, SearchSpaceError, ConfigError) as e:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"gpubench: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    def _sweep(self, arguments: list[str]) -> Any:
        from gpubench.search.jobs import Jobs, mark_stale_runs
        from gpubench.search.manifest import Manifest
        from gpubench.search.space import parse_search_space

        assert self.config is not None and self.hydra_context is not None
        self.check()
        space = parse_search_space(arguments, self.params, self.hydra_context.config_loader)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))  # as Hydra's, masked
        stale = mark_stale_runs(sweep_dir)
        if stale:
            log.info("%d run(s) left running by a process that died: recorded as killed", stale)
        manifest = Manifest(sweep_dir, self.mode.value)
        jobs = Jobs(self.launcher, manifest, self.max_failures)
        try:
            if self.mode.value == "max_batch":
                self._max_batch(jobs, space, manifest)
            else:
                self._optimize(jobs, space, manifest)
        finally:
            manifest.save()
        if self.report:
            self._write_report(sweep_dir)
        return jobs.returns

    def _optimize(self, jobs, space, manifest) -> None:
        from gpubench.search import study as S
        from gpubench.search.loop import Confirm, Screen, Search
        from gpubench.search.manifest import absolute_storage

        space.require_swept()  # before a study is made for nothing
        name = self.study_name or space.study_name()
        storage = absolute_storage(self.storage)
        shared = S.open_study(name, storage, self.heartbeat_interval, self.grace_period)
        # a resumed sweep (or a second worker) must not replay the same random sequence
        seed = None if self.seed is None else int(self.seed) + len(shared.study.trials)
        shared.study.sampler = S.make_sampler(self.sampler.value, seed, self.n_startup_trials)
        manifest.update(study_name=name, storage=storage, study=name, n_trials=self.n_trials)
        os.environ[STUDY_ENV] = name
        if storage is not None:  # the command a team watches the shared study with
            print(f"watch the study: optuna-dashboard '{mask_secrets(storage)}'", flush=True)
        steps, full = self.screen.steps, self.config.bench.steps
        screened = steps is not None and full is not None and int(steps) < int(full)
        screen = Screen(int(steps) if screened else None, float(self.screen.keep),
                        int(self.screen.n_startup_trials), list(self.screen.overrides))
        confirm = Confirm(int(self.confirm["top"]), int(self.confirm["rounds"]))
        Search(shared, space, jobs, manifest, self.n_trials, self.n_jobs, screen,
               poll_s=min(float(self.heartbeat_interval), 5.0), confirm=confirm).run()

    def _max_batch(self, jobs, space, manifest) -> None:
        from gpubench.search.maxbatch import run_max_batch, summary_lines

        mb = self.max_batch
        result = run_max_batch(jobs, space, self.config, mb.start, int(mb.limit),
                               list(mb.overrides))
        write_json(manifest.sweep_dir / "max_batch.json", result)
        manifest.update(max_batch=result)
        if result["max_batch"] is None:
            log.warning("even batch size 1 does not fit under %.0f%% of the device",
                        100 * result["memory_ceiling"])
        for line in summary_lines(result):  # the answer, for the user at the terminal
            print(line, flush=True)

    def _write_report(self, sweep_dir: Path) -> None:
        try:
            from gpubench.report.write import sweep_report

            files = sweep_report(sweep_dir)
            log.info("report: %d file(s) in %s", len(files), sweep_dir / "report")
        except Exception as e:  # the measurements are on disk; a report can be made later
            log.warning("report failed (python -m gpubench.report %s): %s", sweep_dir, e)
