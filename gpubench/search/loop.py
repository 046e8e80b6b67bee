"""The search loop: ask Optuna for a configuration, launch it as a job, read its record, tell.

A trial is told its speed (0 out of memory) and a memory constraint (> 0: over the ceiling);
other errors FAIL. A screen of `screen.steps` steps prunes trials outside the top `screen.keep`.
A configuration measured already (or by another worker) copies that result (`duplicate_of`).
Then the `confirm.top` fastest are measured again, interleaved (drift hits them alike)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from gpubench.analysis.recommend import recommend
from gpubench.analysis.select import training_rows
from gpubench.core.record import Rung, RunRecord, load
from gpubench.core.stats import count
from gpubench.search import study as S
from gpubench.search.jobs import Jobs
from gpubench.search.rows import trial_rows
from gpubench.search.space import SearchSpace

log = logging.getLogger("gpubench.sweep")

# a trial this worker measured, failed meanwhile by another worker as stale and queued again
TAKEN_OVER = ("%s: taken over by another worker (its heartbeat lapsed); measured again from the "
              "queue")
# this many duplicates in a row means the sampler has nothing new left to propose
MAX_DUPLICATES_IN_A_ROW = 50


def to_confirm(found: list[tuple[RunRecord, Any]], top: int) -> list[Any]:
    """The `top` trials the confirm step re-measures, of (its record, trial): the fastest whose
    own measurement found no disturbance, then flagged ones where slots are left."""
    return [t for _, t in sorted(found, key=lambda p: (p[0].measurement_stable is False,
                                                       -p[0].throughput))[:top]]


@dataclass
class Search:
    shared: S.Shared
    space: SearchSpace
    jobs: Jobs  # and its manifest, sweep.json
    n_trials: int
    n_jobs: int
    # hydra.sweeper.screen and .confirm: a ScreenConf (steps None: no screen) and a ConfirmConf
    # (None, or top 0: no confirm step), of hydra_plugins.gpubench_sweeper.config (a layer above)
    screen: Any
    poll_s: float = 1.0  # seconds between looks at the study while others hold every slot
    confirm: Any = None
    # sweep=pipes: stop before n_trials once this holds, and the stage each job is recorded under
    stop: Callable[[], bool] | None = None
    labels: dict = field(default_factory=dict)
    writes_best: bool = True  # this best is sweep.json's `best` (of sweep=pipes: the join's)

    @property
    def study(self):
        return self.shared.study

    def run(self) -> dict | None:
        """Measure until the study holds n_trials measured trials; the best, or None."""
        size, fixed, in_a_row = self.space.size(), self.space.fixed_values, 0
        while True:
            if stale := S.fail_stale(self.shared):
                log.info("%s of a worker that stopped beating: queued again",
                         count(stale, "trial"))
            measured = S.measured_trials(self.study)
            running = S.running_trials(self.study)
            left = self.n_trials - len(measured)
            done = {S.key(t.params, fixed) for t in measured}
            if left <= 0 or (self.stop is not None and measured and self.stop()):
                break
            if size is not None and len(done) >= size:
                log.info("all %d configurations of the search space are measured", size)
                break
            busy = done | {S.key(t.params, fixed) for t in running}
            free = left - len(running)
            if free <= 0 or (size is not None and len(busy) >= size):
                # other workers hold the last slots: wait for one to end (one may die: retried here)
                S.wait_for_running(self.study, {t.number for t in running}, self.poll_s)
                continue
            held: list = []  # filled as asked: a Ctrl-C while claiming leaves none RUNNING
            dup_numbers: set[int] = set()
            try:
                trials = self._claim(min(self.n_jobs, free), held)
                fresh, dups = S.split_duplicates(self.study, trials, fixed)
                dup_numbers = {t.number for t, _ in dups}
                in_a_row = 0 if fresh else in_a_row + len(dups)
                # the twins beat too: a worker killed meanwhile leaves none RUNNING for good
                with S.heartbeat(self.shared, [t.number for t in trials]):
                    self._measure(fresh)
            except BaseException as e:  # Ctrl-C or an abort: as after kill -9, measured next time
                for t in held:
                    S.abandon(self.shared, t.number, requeue=t.number not in dup_numbers)
                if not isinstance(e, optuna.exceptions.UpdateFinishedTrialError):
                    raise
                # failed as stale by another worker (a pause past grace_period): its retry measures
                log.warning(TAKEN_OVER, e)
                continue
            for t, prev in dups:  # said, or its number is a gap between the trials shown
                twin = self.study.trials[prev]
                S.copy_result(self.study, t, twin)
                log.info("trial %d (%s): trial %d's configuration, %s", t.number,
                         S.describe(t.params), prev, "its result copied" if twin.state.is_finished()
                         else "measured by another worker (this one uncounted)")
            if in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                log.info("the sampler proposed only measured configurations %d times in a row: "
                         "stopping", in_a_row)
                break
        return self._summarize(self._confirm())

    def _claim(self, n: int, held: list) -> list:
        """Ask n trials (into `held` as asked); give back those past the free slots."""
        for _ in range(n):
            held.append(S.ask(self.shared, self.space.distributions))
        kept = []
        for t in held:
            if S.claim_is_within(self.study, t.number, self.n_trials):
                if (device := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
                    S.set_attr(t, "device", device)  # one worker per device
                kept.append(t)
            else:
                S.abandon(self.shared, t.number, requeue=None)
        return kept

    def _launch(self, trials: list, rung: Rung, extra: tuple | list = ()) -> list:
        return self.jobs.launch([self.space.overrides(t.params, extra) for t in trials],
                                [{"trial": t.number, "rung": rung, **self.labels} for t in trials])

    def _measure(self, trials: list) -> None:
        full = trials
        if trials and self.screen.steps is not None:
            extra = [f"bench.steps={self.screen.steps}", *self.screen.overrides]
            full = []
            for t, rec in zip(trials, self._launch(trials, Rung.screen, extra), strict=True):
                S.record(t, rec, Rung.screen)
                if rec.status.crashed or not rec.feasible:
                    self._tell(t, rec)
                    continue
                t.report(rec.throughput, 0)  # not counted by its own cut: it is RUNNING
                if S.screen_passes(self.study, rec.throughput, self.screen.keep,
                                   self.screen.n_startup_trials):
                    full.append(t)
                else:
                    self._tell(t, rec, pruned=True)
        if full:
            for t, rec in zip(full, self._launch(full, Rung.full), strict=True):
                S.record(t, rec, Rung.full)
                self._tell(t, rec)
        self.jobs.raise_unsaved()

    def _tell(self, trial, rec, pruned: bool = False) -> None:
        what = f"trial {trial.number} ({S.describe(trial.params)})"
        if rec.extra.get("requeue"):  # failed by its disk (full): as after Ctrl-C, asked again
            S.abandon(self.shared, trial.number, requeue=True)
            log.warning("%s: %s; queued again for the next invocation", what, rec.error)
            return
        # set once, with the measurement the trial is told (the screen for a pruned one)
        trial.set_constraint(S.MEMORY, rec.constraint)
        if rec.status.crashed:
            self.study.tell(trial, state=TrialState.FAIL)
            self.jobs.count_failure(what, rec)
        elif pruned:
            self.study.tell(trial, state=TrialState.PRUNED)
            log.info("%s: %.1f img/s in the screen, below the cut: pruned", what, rec.throughput)
        else:  # an over-ceiling or OOM trial is told its speed; the constraint ranks it
            self.study.tell(trial, rec.throughput)
            mem = "?" if rec.peak_memory_fraction is None else f"{rec.peak_memory_fraction:.1%}"
            log.info("%s: %.1f img/s, peak memory %s of %s, %s", what, rec.throughput, mem,
                     rec.memory_of, rec.status if rec.feasible else f"{rec.status}, infeasible")

    def _confirm(self) -> list[int]:
        """Re-measure the fastest feasible full-length trials, interleaved (to_confirm: a flagged
        one can never be confirmed, Row.stable, so it takes a slot only where too few others are
        left); the numbers of the trials confirmed."""
        if self.confirm is None or self.confirm.top <= 0:  # no confirm step
            return []
        # a pruned trial's dir and rung are its screen's: not full
        found = [(rec, t) for t in S.measured_trials(self.study) if (a := t.user_attrs).get("dir")
                 and (rec := load(a["dir"], a.get("rung") or Rung.full)) is not None
                 and rec.feasible and rec.full]
        top = to_confirm(found, self.confirm.top)
        if not top:  # nothing measured in full and feasible
            return []
        c = S.queue_rounds(self.shared, top, self.confirm.rounds)
        while True:
            if S.fail_stale(c):
                log.info("confirm rounds of a worker that stopped beating: queued again")
            if not c.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                # others' rounds: wait for them (or their lapse) before judging the best
                running = S.running_trials(c.study)
                if not running or not c.beating:
                    break
                S.wait_for_running(c.study, {t.number for t in running}, self.poll_s)
                continue
            t = S.ask(c, self.space.distributions)
            if "confirm_of" not in t.user_attrs:  # the queue emptied between look and ask
                S.abandon(c, t.number)
                continue
            n, rnd = t.user_attrs["confirm_of"], t.user_attrs["round"]
            try:
                with S.heartbeat(c, [t.number]):
                    [rec] = self.jobs.launch([self.space.overrides(t.params)],
                                             [{"trial": n, "rung": Rung.confirm, **self.labels}])
            except BaseException:  # Ctrl-C: the round is queued again, as after kill -9
                S.abandon(c, t.number, requeue=True)
                raise
            ok = rec.status.measured  # a failed round is still one of the trial's measurements
            try:
                S.set_attr(t, "dir", str(rec.dir))
                c.study.tell(t, rec.throughput if ok else None,
                             state=None if ok else TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError as e:  # as in run(): its retry
                log.warning(TAKEN_OVER, e)
                continue
            log.info("confirm %d/%d of trial %d: %.1f img/s, %s", rnd + 1, self.confirm.rounds,
                     n, rec.throughput, rec.status)
        return [t.number for t in top]

    def _summarize(self, confirmed: list[int]) -> dict | None:
        """sweep.json's `best`: the report's `recommend(...).chosen` on the same rows, so the two
        never disagree; `fastest`, its reference, where that is another trial. Optuna's
        best_trial (feasible, flagged or not) only where the report recommends nothing."""
        rows = trial_rows(self.study, self.shared.storage)
        rec = recommend(training_rows([r for _, r in rows])[0])
        extra: dict = {}
        if rec is None:
            try:
                best = self.study.best_trial  # feasible only (Optuna reads the constraints)
                value = best.value
            except ValueError:
                best = None
        else:
            pick = rec.chosen
            best, value = next(t for t, r in rows if r is pick), pick.throughput
            if confirmed:  # its figure pooled over its measurements
                extra = {"confirmed": pick.confirmed, "interval": list(pick.interval),
                         "measurements": len(pick.pooled)}
            if rec.unconfirmed and self.writes_best:  # the report's own UNCONFIRMED line
                log.warning("best: %s", rec.unconfirmed)
            if rec.best is not pick:
                fastest = next(t for t, r in rows if r is rec.best)
                extra["fastest"] = {"trial": fastest.number, "value": rec.best.throughput,
                                    "interval": list(rec.best.interval),
                                    "dir": fastest.user_attrs.get("dir")}
        out = None if best is None else {
            "trial": best.number, "value": value, "params": best.params,
            "overrides": self.space.overrides(best.params), "dir": best.user_attrs.get("dir"),
            **extra}
        if out is None:
            log.warning("no feasible trial under the memory ceiling"
                        if any(r.record.status.measured for _, r in rows) else
                        "no trial measured: every one failed (each job's folder says why)")
        elif self.writes_best:  # a sweep=pipes stage's pick is no recommendation (its path is)
            # named as the report's ranking names it too: its job folder (`run 5`)
            run = f" (run {os.path.basename(out['dir'])})" if out["dir"] else ""
            log.info("best feasible (as the report recommends): trial %d%s, %.1f img/s: %s",
                     best.number, run, value, " ".join(out["overrides"]))
        self.jobs.manifest.update(measured_trials=len(S.measured_trials(self.study)),
                                  **({"best": out} if out and self.writes_best else {}))
        return out
