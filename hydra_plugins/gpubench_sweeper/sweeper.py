"""gpubench's Hydra sweeper: Optuna ask/tell over Hydra jobs, a memory ceiling as a constraint.

Every trial is an ordinary Hydra job run by the configured launcher (so callbacks such as the
MLflow one see it as a child run). After the launcher returns, the sweeper reads the job's
results.json: its status, throughput and peak memory decide what Optuna is told.

- feasible trial: COMPLETE, value = e2e images/sec, constraint = peak fraction - ceiling <= 0
- over the ceiling: COMPLETE with its measured speed and a positive constraint (infeasible)
- out of memory: COMPLETE, value 0.0, constraint 1.0 (infeasible); the runner freed the memory
- any other error, a NaN, no results.json: FAIL with the message; the sweep goes on until more
  than `max_failures` trials failed in this invocation
- screening: each trial is first measured `screen.steps` steps; a trial whose screen is in the
  top `screen.keep` fraction of all screens so far is measured at full length, the rest end PRUNED
- resume: the study lives in `storage` under a name derived from the search space; trials a
  killed process left RUNNING are marked FAIL (attr `interrupted`), are not counted, and their
  parameters are queued again, so the sweep continues to `n_trials` measured trials
- a sampled configuration that was already measured is not run again: the trial gets the earlier
  result (attr `duplicate_of`) and does not count toward `n_trials`

Optuna is imported only when a sweep starts: Hydra imports this module on every run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from gpubench.files import read_json, write_json

log = logging.getLogger("gpubench.sweep")

MANIFEST = "sweep.json"
# the constraint's name in Optuna: peak memory fraction - memory.ceiling, <= 0 is feasible
MEMORY = "memory"
# this many duplicates in a row means the sampler has nothing new left to propose
MAX_DUPLICATES_IN_A_ROW = 50


class SweepAborted(RuntimeError):
    pass


def absolute_storage(url: str | None) -> str | None:
    """A relative sqlite URL made absolute (and its folder created), so the study is found again
    from the sweep manifest whatever the reader's working directory."""
    prefix = "sqlite:///"
    if not url or not url.startswith(prefix) or url.startswith(prefix + "/"):
        return url
    path = Path(url[len(prefix):]).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return prefix + str(path)


def next_job_index(sweep_dir: Path) -> int:
    """Job numbers continue after the folders already there: a resumed sweep writing into the same
    sweep dir must not overwrite earlier jobs' results."""
    nums = [int(p.name) for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(nums, default=-1) + 1


class GpubenchSweeper(Sweeper):
    def __init__(
        self,
        mode: str,
        n_trials: int,
        n_jobs: int,
        study_name: str | None,
        storage: str | None,
        sampler: str,
        seed: int | None,
        n_startup_trials: int,
        max_failures: int,
        screen: DictConfig,
        max_batch: DictConfig,
        params: DictConfig | None,
        report: bool,
    ) -> None:
        if mode not in ("optuna", "max_batch"):
            raise ValueError(f"hydra.sweeper.mode={mode!r}: optuna or max_batch")
        if sampler not in ("tpe", "random"):
            raise ValueError(f"hydra.sweeper.sampler={sampler!r}: tpe or random")
        if n_trials < 1 or n_jobs < 1 or max_failures < 0:
            raise ValueError("hydra.sweeper: n_trials and n_jobs >= 1, max_failures >= 0")
        if not 0.0 < float(screen.keep) <= 1.0:
            raise ValueError(f"hydra.sweeper.screen.keep={screen.keep}: a fraction in (0, 1]")
        self.mode, self.n_trials, self.n_jobs = mode, int(n_trials), int(n_jobs)
        self.study_name, self.storage = study_name, storage
        self.sampler_name, self.seed = sampler, seed
        self.n_startup_trials, self.max_failures = int(n_startup_trials), int(max_failures)
        self.screen, self.max_batch = screen, max_batch
        self.params = {str(k): v for k, v in (params or {}).items()}
        self.report = bool(report)
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None
        self.returns: list = []
        self.jobs: list[dict] = []
        self.failures = 0

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # ------------------------------------------------------------------ entry point

    def sweep(self, arguments: list[str]) -> Any:
        from gpubench.sweep import parse_search_space

        assert self.config is not None and self.hydra_context is not None
        space = parse_search_space(arguments, self.params, self.hydra_context.config_loader)
        self.sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        self.job_idx = next_job_index(self.sweep_dir)
        # a resume into the same sweep dir keeps the earlier invocations' jobs in the manifest
        self.jobs = list((read_json(self.sweep_dir / MANIFEST) or {}).get("jobs", []))
        self.manifest: dict = {"mode": self.mode, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if self.mode == "max_batch":
            self._find_max_batch(space)
        else:
            self._optimize(space)
        if self.report:
            self._write_report()
        return self.returns

    # ------------------------------------------------------------------ jobs

    def _launch(self, batch: list[list[str]], labels: list[dict]) -> list:
        """Run jobs through the launcher; one Outcome per job, whatever happened to it."""
        from gpubench.sweep import Outcome, read_outcome

        self.validate_batch_is_legal(batch)
        first = self.job_idx
        self.job_idx += len(batch)
        try:
            rets = self.launcher.launch(batch, initial_job_idx=first)
        except Exception as e:  # the launcher itself broke: every job of the batch failed
            log.error("launcher failed: %s", e)
            return [
                Outcome("missing", 0.0, None, 1.0, f"launcher: {type(e).__name__}: {e}",
                        self.sweep_dir / str(first + i))
                for i in range(len(batch))
            ]
        self.returns.append(rets)
        outcomes = []
        for i, r in enumerate(rets):
            error = r._return_value if r.status == JobStatus.FAILED else None
            out_dir = Path(str(r.hydra_cfg.hydra.runtime.output_dir))
            oc = read_outcome(out_dir, error)
            if not oc.crashed and not math.isfinite(oc.throughput):
                oc.status, oc.error = "failed", "non-finite throughput"
            outcomes.append(oc)
            self.jobs.append({"num": first + i, "dir": str(out_dir), **labels[i],
                              "status": oc.status})
        self._save_manifest()
        return outcomes

    def _save_manifest(self) -> None:
        self.manifest["jobs"] = self.jobs
        write_json(self.sweep_dir / MANIFEST, self.manifest)

    def _count_failure(self, what: str, error: str | None) -> None:
        self.failures += 1
        log.warning("%s failed (%d of at most %d): %s", what, self.failures, self.max_failures,
                    error)
        if self.failures > self.max_failures:
            self.manifest["aborted"] = f"more than {self.max_failures} failed trials"
            self._save_manifest()
            raise SweepAborted(
                f"{self.failures} failed trials (hydra.sweeper.max_failures={self.max_failures}); "
                f"last error: {error}"
            )

    # ------------------------------------------------------------------ Optuna

    def _study(self, space):
        import optuna

        name = self.study_name or space.study_name()
        storage = absolute_storage(self.storage)
        # the screen's cut is screen_passes(), not an Optuna pruner
        study = optuna.create_study(
            storage=storage, study_name=name, direction="maximize", load_if_exists=True,
            pruner=optuna.pruners.NopPruner(),
        )
        # a resumed sweep must not replay the same random sequence as the first run
        seed = None if self.seed is None else int(self.seed) + len(study.trials)
        study.sampler = make_sampler(self.sampler_name, seed, self.n_startup_trials)
        self.manifest.update(study_name=name, storage=storage, n_trials=self.n_trials)
        self._save_manifest()  # the study can be found from the sweep dir from the start
        return study

    def _optimize(self, space) -> None:
        from gpubench import sweep as S

        if not space.params:
            raise S.SearchSpaceError(
                "nothing to search: give swept overrides such as 'loader.batch_size=choice(32,64)'"
                " or a preset (sweep=throughput)"
            )
        study = self._study(space)
        resumed = recover_interrupted(study)
        if resumed:
            log.info("resuming study %s: %d interrupted trial(s) queued again",
                     study.study_name, resumed)
        screen_steps = self._screen_steps()
        in_a_row = 0
        while True:
            measured = measured_trials(study)
            left = self.n_trials - len(measured)
            if left <= 0:
                break
            size = space.size()
            if size is not None and len({_key(t.params) for t in measured}) >= size:
                log.info("all %d configurations of the search space are measured", size)
                break
            trials = [study.ask(space.distributions) for _ in range(min(self.n_jobs, left))]
            fresh, dups = split_duplicates(study, trials)
            in_a_row = 0 if fresh else in_a_row + len(dups)
            try:
                self._measure(study, space, fresh, screen_steps)
            except BaseException:  # Ctrl-C or an abort: leave nothing RUNNING behind
                for t in fresh:  # as after kill -9: measured by the next invocation
                    abandon(study, t.number, requeue=True)
                for t, _ in dups:
                    abandon(study, t.number)
                raise
            for t, prev in dups:
                copy_result(study, t, study.trials[prev])
            if in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                log.info("the sampler proposed only measured configurations %d times in a row: "
                         "stopping", in_a_row)
                break
        self._summarize(study, space)

    def _screen_steps(self) -> int | None:
        steps = self.screen.steps
        full = self.config.bench.steps
        if steps is None or full is None or int(steps) >= int(full):
            return None
        return int(steps)

    def _measure(self, study, space, trials: list, screen_steps: int | None) -> None:
        if not trials:
            return
        full = trials
        if screen_steps is not None:
            extra = [f"bench.steps={screen_steps}", *self.screen.overrides]
            outcomes = self._launch(
                [space.overrides(t.params, extra) for t in trials],
                [{"trial": t.number, "rung": "screen"} for t in trials],
            )
            full = []
            for t, oc in zip(trials, outcomes, strict=True):
                record(t, oc, "screen")
                if oc.crashed or not oc.feasible:
                    self._tell(study, t, oc)
                    continue
                keep = screen_passes(study, oc.throughput, float(self.screen.keep),
                                     int(self.screen.n_startup_trials))
                t.report(oc.throughput, 0)
                if keep:
                    full.append(t)
                else:
                    self._tell(study, t, oc, pruned=True)
        if full:
            outcomes = self._launch(
                [space.overrides(t.params) for t in full],
                [{"trial": t.number, "rung": "full"} for t in full],
            )
            for t, oc in zip(full, outcomes, strict=True):
                record(t, oc, "full")
                self._tell(study, t, oc)

    def _tell(self, study, trial, oc, pruned: bool = False) -> None:
        from optuna.trial import TrialState

        what = f"trial {trial.number} ({_describe(trial.params)})"
        # set once, with the measurement the trial is told (the screen for a pruned one)
        trial.set_constraint(MEMORY, oc.constraint)
        if oc.crashed:
            study.tell(trial, state=TrialState.FAIL)
            self._count_failure(what, oc.error)
            return
        if pruned:
            study.tell(trial, state=TrialState.PRUNED)
            log.info("%s: %.1f img/s in the screen, below the cut: pruned", what, oc.throughput)
            return
        study.tell(trial, oc.throughput)
        mem = "?" if oc.peak_fraction is None else f"{oc.peak_fraction:.1%}"
        log.info("%s: %.1f img/s, peak memory %s of the device, %s", what, oc.throughput, mem,
                 oc.status if oc.feasible else f"{oc.status}, infeasible")

    def _summarize(self, study, space) -> None:
        measured = measured_trials(study)
        self.manifest["measured_trials"] = len(measured)
        try:
            best = study.best_trial
        except ValueError:
            best = None
        if best is None:
            log.warning("no feasible trial under the memory ceiling")
        else:
            self.manifest["best"] = {
                "trial": best.number, "value": best.value, "params": best.params,
                "overrides": space.overrides(best.params), "dir": best.user_attrs.get("dir"),
            }
            log.info("best feasible: trial %d, %.1f img/s: %s", best.number, best.value,
                     " ".join(space.overrides(best.params)))
        self._save_manifest()

    # ------------------------------------------------------------------ max batch

    def _find_max_batch(self, space) -> None:
        from gpubench import sweep as S
        from gpubench.config import resolve_device

        if space.params:
            raise S.SearchSpaceError(
                "sweep=max_batch searches loader.batch_size itself: pass fixed overrides only"
            )
        cfg = self.config
        start = self.max_batch.start or cfg.loader.batch_size
        if start is None:  # sized by device, as the runner does
            start = 128 if resolve_device(cfg) == "cuda" else 16
        reserve = float(cfg.memory.reserve)
        found: list = []

        def fits(b: int) -> bool:
            oc = self._launch(
                [space.overrides({}, [*self.max_batch.overrides, f"loader.batch_size={b}"])],
                [{"rung": "probe", "batch_size": b}],
            )[0]
            found.append((b, oc))
            ok = S.fits_under(oc, reserve)
            mem = "?" if oc.peak_fraction is None else f"{oc.peak_fraction:.1%}"
            log.info("batch %d: %s, peak memory %s -> %s", b, oc.status, mem,
                     "fits" if ok else "does not fit")
            if oc.crashed:
                self._count_failure(f"probe batch {b}", oc.error)
            return ok

        limit = int(self.max_batch.limit)
        best, _ = S.find_max_batch(fits, int(start), limit)
        ceiling = float(cfg.memory.ceiling)
        result = {
            "max_batch": best,
            "memory_ceiling": ceiling,
            "reserve": reserve,
            "threshold": ceiling * (1.0 - reserve),
            "limit_reached": best == limit,
            "probes": [
                {"batch_size": b, "fits": S.fits_under(oc, reserve), "status": oc.status,
                 "peak_memory_fraction": oc.peak_fraction, "dir": str(oc.dir)}
                for b, oc in found
            ],
        }
        (self.sweep_dir / "max_batch.json").write_text(json.dumps(result, indent=2))
        self.manifest["max_batch"] = result
        self._save_manifest()
        if best is None:
            log.warning("even batch size 1 does not fit under %.0f%% of the device", 100 * ceiling)
            print("max batch: none fits")
            return
        note = " (max_batch.limit reached)" if best == limit else ""
        print(f"max batch under {ceiling:.0%} x (1 - {reserve:.0%}) of device memory: {best}{note}")
        ups = [b for b in (2 ** i for i in range(2, 16)) if b < best][-3:] + [best]
        print("use it as the upper bound of a search, e.g.  "
              f"'loader.batch_size=choice({','.join(map(str, ups))})'")

    # ------------------------------------------------------------------ report

    def _write_report(self) -> None:
        try:
            from gpubench.report import sweep_report

            files = sweep_report(self.sweep_dir)
            log.info("report: %d file(s) in %s", len(files), self.sweep_dir / "report")
        except Exception as e:  # the measurements are on disk; a report can be made later
            log.warning("report failed (python -m gpubench.report %s): %s", self.sweep_dir, e)


# ---------------------------------------------------------------------- study helpers


def make_sampler(name: str, seed: int | None, n_startup_trials: int):
    """The sampler of a sweep (scripts/bench_search.py replays grids with the same one)."""
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # TPE reads each trial's constraint (Trial.set_constraint, Optuna >= 5) by itself
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _describe(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def measured_trials(study) -> list:  # noqa: N802 - reads as "the measured set"
    """Finished trials that count toward n_trials: not interrupted, not a duplicate."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return [
        t for t in study.get_trials(deepcopy=False, states=done)
        if not t.user_attrs.get("interrupted") and "duplicate_of" not in t.user_attrs
    ]


def recover_interrupted(study) -> int:
    """Trials a killed sweep left RUNNING: mark them FAIL (interrupted) and queue their parameters
    again, so the configuration the sampler chose is still measured. Assumes one sweep process
    per study at a time."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return sum(abandon(study, t.number, requeue=True) for t in stale)


def abandon(study, number: int, requeue: bool = False) -> bool:
    """End a RUNNING trial as FAIL, marked `interrupted` so it does not count as measured;
    with `requeue`, its parameters are queued again (attr `retry_of`). False if not RUNNING."""
    from optuna.trial import TrialState

    # by id through the storage: the Trial object belongs to whichever process asked for it
    t = study._storage.get_trial(study._storage.get_trial_id_from_study_id_trial_number(
        study._study_id, number))
    if t.state != TrialState.RUNNING:
        return False
    study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
    study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    if requeue:
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
    return True


def screen_passes(study, value: float, keep: float, n_startup: int) -> bool:
    """Whether a screen throughput is in the top `keep` fraction of the screens so far (those of
    kept and pruned trials alike, duplicates aside); the first `n_startup` screens always pass.
    Optuna's PercentilePruner compares with COMPLETE trials only, i.e. with the kept screens: a
    bar that rises with every trial kept, so it keeps far less than `keep` over a sweep."""
    from optuna.trial import TrialState

    screens = [
        t.intermediate_values[0]
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if 0 in t.intermediate_values and "duplicate_of" not in t.user_attrs
    ]
    if len(screens) < n_startup:
        return True
    # its rank among the screens, itself included (ties in its favour): keep 0.5 with 4 earlier
    # screens keeps the top 3 of 5
    better = sum(s > value for s in screens)
    return better < math.ceil(keep * (len(screens) + 1))


def split_duplicates(study, trials: list) -> tuple[list, list]:
    """Trials whose parameters were measured already (or are asked twice in this batch) are not
    run again; they are resolved with the earlier result."""
    seen = {_key(t.params): t.number for t in measured_trials(study)}
    fresh, dups = [], []
    for t in trials:
        k = _key(t.params)
        if k in seen:
            dups.append((t, seen[k]))
        else:
            seen[k] = t.number
            fresh.append(t)
    return fresh, dups


def copy_result(study, trial, prev) -> None:
    """Tell a duplicate trial what its twin measured, without running it."""
    from optuna.trial import TrialState

    for k, v in prev.user_attrs.items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("duplicate_of", prev.number)
    for k, v in prev.constraints.items():
        trial.set_constraint(k, v)
    if prev.state == TrialState.COMPLETE:
        study.tell(trial, prev.value)
    elif prev.state == TrialState.PRUNED and prev.intermediate_values:
        step, value = max(prev.intermediate_values.items())
        trial.report(value, step)
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


def record(trial, oc, rung: str) -> None:
    """What the report and a later resume need, stored on the trial before it is told."""
    trial.set_user_attr("status", oc.status)
    trial.set_user_attr("rung", rung)
    trial.set_user_attr("dir", str(oc.dir))
    if rung == "screen":
        trial.set_user_attr("screen_dir", str(oc.dir))
        trial.set_user_attr("screen_throughput", oc.throughput)
    trial.set_user_attr("throughput", oc.throughput)
    trial.set_user_attr("peak_memory_fraction", oc.peak_fraction)
    trial.set_user_attr("memory_ceiling", oc.ceiling)
    if oc.error:
        trial.set_user_attr("error", str(oc.error)[:1000])
