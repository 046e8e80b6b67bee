"""gpubench's Hydra sweeper: the thin front of gpubench.search (loop, pipes, maxbatch), which
launches every trial as an ordinary Hydra job through the configured launcher. Imported by
Hydra's plugin scan on every run: Optuna and SQLAlchemy load only when a sweep starts."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from gpubench.config.errors import ConfigError
from gpubench.config.keys import check_keys, keys
from gpubench.config.settings import device_of
from gpubench.config.uris import STORAGE_SCHEMES, check_uri
from gpubench.core.files import read_json, write_json, write_text
from gpubench.core.record import BOUNDS_MEASURED_ENV, STUDY_ENV  # torch-free
from gpubench.core.secrets import mask_secrets
from gpubench.core.stats import count
from gpubench.search.jobs import Jobs, mark_stale_runs
from gpubench.search.manifest import PIPES_FILE, Manifest, absolute_storage
from gpubench.search.manifest import read as read_manifest
from hydra_plugins.gpubench_sweeper import config as C

log = logging.getLogger("gpubench.sweep")
# Hydra's launchers whose jobs run on this host (hydra-core's, joblib's, submitit's local): only
# there does this host say what bench.device=auto is (device_of asks torch, which those jobs load
# anyway); a cluster's jobs resolve it on their nodes
LOCAL_LAUNCHERS = ("BasicLauncher", "JoblibLauncher", "LocalLauncher")


class GpubenchSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        # checked in sweep(), not here: Hydra wraps an error raised while instantiating
        vars(self).update(settings)

    def check(self) -> None:
        """Every setting, before any work: ConfigError names the first bad one."""
        check_keys(self, keys(C.GpubenchSweeperConf, "hydra.sweeper."))
        # by value: Hydra hands a member of its plugin scan's copy of config.py
        self.mode, self.sampler = C.Mode(self.mode), C.Sampler(self.sampler)
        if self.grace_period is not None and self.grace_period <= self.heartbeat_interval:
            raise ConfigError("hydra.sweeper.grace_period", self.grace_period,
                              f"null or seconds > heartbeat_interval ({self.heartbeat_interval})")
        if self.storage is not None:
            check_uri("hydra.sweeper.storage", self.storage, STORAGE_SCHEMES)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """The search; a ConfigError (exit 2) or a SweepFailed (exit 1) ends it in one line."""
        from gpubench.search.space import parse_search_space  # loads Optuna

        self.check()
        space = parse_search_space(arguments, self.params, self.hydra_context.config_loader)
        if type(self.launcher).__name__ in LOCAL_LAUNCHERS:  # the jobs run here: as they resolve
            space.resolved = {"bench.device": device_of(self.config)}  # a CPU's pin_memory: inert
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))  # Hydra's, masked
        if self.mode is C.Mode.max_batch:  # a search's studies know more: see _search
            mark_stale_runs(sweep_dir)
        manifest = Manifest(sweep_dir, self.mode.value)
        jobs = Jobs(self.launcher, manifest, self.max_failures)
        run = self._max_batch if self.mode is C.Mode.max_batch else self._search
        try:
            run(jobs, space, manifest)
        finally:
            manifest.save()
        jobs.check_measured()  # nothing measured: nothing to report either
        if self.report:
            try:
                from gpubench.report.write import sweep_report

                files = sweep_report(sweep_dir)
                log.info("report: %s in %s", count(len(files), "file"), sweep_dir / "report")
            except Exception as e:  # the measurements are on disk; a report can be made later
                log.warning("report failed (python -m gpubench.report %s): %s", sweep_dir, e)
        return jobs.returns

    def _search(self, jobs, space, manifest) -> None:
        """mode=optuna: one study; mode=pipes: a study per stage (gpubench.search.pipes)."""
        from gpubench.search import study as S
        from gpubench.search.loop import Search
        from gpubench.search.pipes import Pipes, Stage, check_space

        pipes = self.mode is C.Mode.pipes
        space.require_knobs()  # checked before a study is made for nothing
        if pipes:
            check_space(space, self.pipes.data_keys)  # require_swept, and per pipe
        else:
            space.require_swept()
        name = self.study_name or space.study_name()
        storage = absolute_storage(self.storage)
        opened: dict = {}  # one Shared per study: an in-memory study lives in its object

        def open_study(study_name: str):  # created or loaded, its sampler seeded
            if study_name not in opened:
                shared = opened[study_name] = S.open_study(
                    study_name, storage, self.heartbeat_interval, self.grace_period)
                manifest.from_study(shared.study)  # a damaged sweep.json: each job's trial again
                # a resumed sweep (or a second worker) must not replay the same random sequence
                seed = None if self.seed is None else int(self.seed) + len(shared.study.trials)
                shared.study.sampler = S.make_sampler(self.sampler.value, seed,
                                                      self.n_startup_trials)
                if pipes:
                    manifest.update(studies=list(opened))
            return opened[study_name]

        # a job left running is settled as its study was told (the studies named before
        # open_study rewrites sweep.json)
        told: dict = {}
        for n in (read_manifest(manifest.sweep_dir).get("studies") or []) if pipes else [name]:
            told |= S.told_dirs(open_study(n).study)
        mark_stale_runs(manifest.sweep_dir, told)
        main = f"{name}-join" if pipes else name
        manifest.update(study_name=main, storage=storage, study=main,
                        **({"pipes_study": name} if pipes else {}),
                        n_trials=None if pipes else self.n_trials)
        os.environ[STUDY_ENV] = name  # the study the jobs tag their runs with
        if storage is not None:  # the command a team watches it with
            print(f"watch the study: optuna-dashboard '{mask_secrets(storage)}'", flush=True)
        poll = min(float(self.heartbeat_interval), 5.0)
        confirm = C.ConfirmConf(**self.confirm)
        if not pipes:
            steps, full = self.screen.steps, self.config.bench.steps
            screened = steps is not None and full is not None and int(steps) < int(full)
            Search(open_study(name), space, jobs, self.n_trials, self.n_jobs,
                   C.ScreenConf(**{**self.screen, "steps": int(steps) if screened else None}),
                   poll_s=poll, confirm=confirm).run()
            return
        os.environ[BOUNDS_MEASURED_ENV] = "1"

        def search(shared, sub, n, stage, stop=None, confirm=None):
            return Search(shared, sub, jobs, n, self.n_jobs, C.ScreenConf(None, 1.0, 0, []),
                          poll_s=poll, confirm=confirm, stop=stop, labels={"stage": stage},
                          writes_best=stage is Stage.join)

        def write(result: dict) -> None:
            write_json(manifest.sweep_dir / PIPES_FILE, result)
            manifest.update(pipes=result)

        Pipes(C.PipesConf(**OmegaConf.to_container(self.pipes)), space, name, open_study, search,
              confirm, write,
              earlier=(read_json(manifest.sweep_dir / PIPES_FILE) or {}).get("wall_s") or {}).run()

    def _max_batch(self, jobs, space, manifest) -> None:
        from gpubench.search.maxbatch import run_max_batch, summary_lines

        mb = self.max_batch
        result = run_max_batch(jobs, space, self.config, mb.start, int(mb.limit),
                               list(mb.overrides))
        write_json(manifest.sweep_dir / "max_batch.json", result)
        manifest.update(max_batch=result)
        if result["max_batch"] is None:
            log.warning("even batch size 1 does not fit under %.0f%% of %s",
                        100 * result["memory_ceiling"], result["memory_of"])
        for line in summary_lines(result):  # the answer, for the user at the terminal
            print(line, flush=True)
