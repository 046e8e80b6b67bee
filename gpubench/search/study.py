"""The Optuna study of a search: opening it (race-safe, with heartbeats), and what its trials mean.

Everything that touches Optuna's storage lives here, behind public Optuna API where it has one:
the storage object is built by us (`optuna.storages.RDBStorage`), so trial ids are looked up
through the storage's public methods rather than read from private attributes of Study or Trial.

Several workers (processes, machines) may run the same search on one RDB study at once. Optuna
does the leases: each measured trial beats with Optuna's own heartbeat thread (`heartbeat`);
`fail_stale` runs Optuna's `fail_stale_trials`, which fails a RUNNING trial whose heartbeat is
older than `grace_period`, and the storage's `RetryHeartbeatStaleTrialCallback` queues its
parameters again, for whichever worker asks next; a live worker's trial is never touched. What
is ours, because Optuna has no such thing (see each): the slot check that keeps all workers
together at n_trials (`claim_is_within`), failing at once the trial of a process of this host
that is gone (`fail_stale`), and what counts as measured (`measured_trials`: finished, and
neither interrupted, nor a duplicate resolved without running, nor a trial that was retried).

The confirm step's rounds are trials of a study of their own (`queue_rounds`), so the same queue,
heartbeats and retries share them among workers.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import optuna
from optuna.storages import InMemoryStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

# the thread Study.optimize beats with (optuna/study/_optimize.py, `_run_trial`: `with
# get_heartbeat_thread(trial._trial_id, study._storage)`); a module Optuna marks private, used
# because it is what optimize does around an objective, and it works around any block
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import FrozenTrial, TrialState

from gpubench.core.files import retry
from gpubench.core.record import Rung, Status, process_alive
from gpubench.core.secrets import mask_secrets
from gpubench.search.jobs import SweepFailed

# the constraint's name in Optuna: peak memory fraction - memory.ceiling, <= 0 is feasible
MEMORY = "memory"
# attempts at creating/loading a storage or a study that several workers create at once
OPEN_ATTEMPTS = 10
# the confirm step's study: the search's study name and this
ROUNDS = "-confirm"


@contextmanager
def _quiet():
    """Optuna 5 calls heartbeats, fail_stale_trials and the retry callback "experimental" (they
    are since 2.x), and `ask` outside `optimize` warns that heartbeats are meant for it: we beat
    around each measurement ourselves (`heartbeat`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Heartbeat of storage")
        yield


with _quiet():
    # Optuna's re-queueing of a failed trial (parameters, attributes, `retry_history`): for a
    # stale one (the storage's callback) and for one given up on Ctrl-C (`abandon`) alike
    RETRY = RetryHeartbeatStaleTrialCallback()


@dataclass
class Shared:
    """A study with the storage object it was opened on (in memory: one process)."""

    study: optuna.Study
    # built here and handed to create_study, so its public methods reach trials by id
    storage: RDBStorage | InMemoryStorage

    @property
    def beating(self) -> bool:
        """Heartbeats on (every RDB storage here: hydra.sweeper.heartbeat_interval >= 1)."""
        return isinstance(self.storage, RDBStorage) and bool(self.storage.heartbeat_interval)

    def trial_id(self, number: int) -> int:
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)


def make_sampler(name: str, seed: int | None, n_startup_trials: int):
    """The sampler of a sweep (scripts/bench_search.py replays grids with the same one)."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # TPE reads each trial's constraint (Trial.set_constraint, Optuna >= 5) by itself
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)


def open_storage(url: str, heartbeat_interval: int | None = None,
                 grace_period: int | None = None) -> RDBStorage:
    """An RDB storage with heartbeats on. The database is reached and read once first: a
    server that is down, a file that is no database, a lock another process holds fail there,
    at once, as one line (SweepFailed). Then several workers creating a fresh database at once
    can collide on its tables (sqlalchemy IntegrityError, ProgrammingError): a later attempt
    finds them made."""
    import sqlalchemy

    def make() -> RDBStorage:
        with _quiet():
            return RDBStorage(url, heartbeat_interval=heartbeat_interval,
                              grace_period=grace_period, heartbeat_stale_trial_callback=RETRY)

    try:
        engine = sqlalchemy.create_engine(url)
        try:
            sqlalchemy.inspect(engine).get_table_names()
        finally:
            engine.dispose()
        return retry(make, OPEN_ATTEMPTS, 0.2)
    except Exception as e:
        raise cannot_open(url, e) from e


def cannot_open(url: str | None, e: BaseException) -> SweepFailed:
    """The one line of a storage that does not open: the URL (masked) and the database's own
    reason, the innermost cause under Optuna's and SQLAlchemy's wrappers (whose text adds the
    SQL and a link)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return SweepFailed(f"the study storage {url} could not be opened: {e}")


def open_study(name: str, url: str | None, heartbeat_interval: int | None = None,
               grace_period: int | None = None) -> Shared:
    """Create the study or load it (SweepFailed when its storage does not open or take it: a
    database on a read-only mount)."""
    storage = open_storage(url, heartbeat_interval, grace_period) if url else InMemoryStorage()
    try:
        return _open(name, storage)
    except optuna.exceptions.OptunaError as e:
        raise cannot_open(url, e) from e


def _open(name: str, storage) -> Shared:
    """`create_study(load_if_exists=True)` run by several workers at once can fail in all but
    one (the name is unique: another worker created it between our lookup and our insert):
    load it then."""
    def make() -> Shared:
        return Shared(optuna.create_study(
            storage=storage, study_name=name, direction="maximize", load_if_exists=True,
            pruner=optuna.pruners.NopPruner()), storage)  # the screen's cut: screen_passes()
    return retry(make, OPEN_ATTEMPTS, 0.1, (optuna.exceptions.DuplicatedStudyError,
                                            optuna.exceptions.StorageInternalError, KeyError))


def ask(shared: Shared, distributions):
    """A trial with its parameters, claimed by this process (attr `worker`), with one beat at
    once: Optuna's stale check passes over a trial that never beat, so a worker killed before
    its heartbeat thread starts would leave it RUNNING for good."""
    with _quiet():
        t = shared.study.ask(distributions)
    if shared.beating:
        shared.storage.record_heartbeat(shared.trial_id(t.number))
    set_attr(t, "worker", claimed_by(t.number))
    return t


# ---------------------------------------------------------------------- trial sets


def told_dirs(study) -> dict[str, tuple[str, str | None]]:
    """The outcome the study recorded for each job folder (trial attrs `dir`, `status`,
    `error`): what a resume writes into a record its job could not finish (a full disk)."""
    return {str(t.user_attrs["dir"]): (str(t.user_attrs["status"]), t.user_attrs.get("error"))
            for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("dir") and t.user_attrs.get("status") in Status.__members__
            and t.user_attrs["status"] != "running"}


def key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def describe(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of failed trials whose parameters Optuna's retry callback queued again (stale,
    or given up on Ctrl-C): each retry's `retry_history`."""
    out: set[int] = set()
    for t in trials:
        out.update(t.system_attrs.get("retry_history", ()))
    return out


def measured_trials(study) -> list[FrozenTrial]:
    """Finished trials that count toward n_trials: not interrupted, not a duplicate, not a
    trial that was retried."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    return [
        t for t in trials
        if t.state.is_finished() and not t.user_attrs.get("interrupted")
        and "duplicate_of" not in t.user_attrs and t.number not in retried
    ]


def running_trials(study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def wait_for_running(study, numbers: set[int], timeout_s: float, look_s: float = 0.2) -> bool:
    """Wait until one of these RUNNING trials (other workers' last slots) ends, at most
    timeout_s (the caller then looks for stale trials). True when one ended. A worker whose own
    last trial ends early would otherwise sleep out its whole poll after the study is done, and
    only then exit: the study's wall time grows by both. A look is one query of the RUNNING
    trials (a few rows, not the study), so it is cheap enough to make every look_s."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(look_s, left))
        if not numbers <= {t.number for t in running_trials(study)}:
            return True
    return False


def claimed_by(number: int) -> str:
    """host:pid:trial of this sweep process for a trial it asked (attr `worker`). The trial
    number is part of it because Optuna's retry callback copies a failed trial's attributes onto
    its retry: a copied value names another trial and is ignored."""
    return f"{socket.gethostname()}:{os.getpid()}:{number}"


def worker_pid(t: FrozenTrial) -> int | None:
    parts = str(t.user_attrs.get("worker", "")).rsplit(":", 2)
    if len(parts) != 3 or parts[2] != str(t.number):
        return None
    return int(parts[1])


def fail_stale(shared: Shared) -> int:
    """Fail the trials of workers that are gone and queue them again (RETRY, the storage's
    callback). Optuna's `fail_stale_trials` takes those whose heartbeat is older than the grace
    period. It knows only time, so a trial whose worker was a process of this host that no
    longer exists is failed here first, at once: a resume right after kill -9 need not wait out
    the grace period (60 s by default). Returns how many RUNNING trials were failed. No-op
    without heartbeats (in memory: one process)."""
    if not shared.beating:
        return 0
    study, storage = shared.study, shared.storage
    before = {t.number for t in running_trials(study)}
    for t in running_trials(study):
        pid = worker_pid(t)
        if pid is None or process_alive(t.user_attrs["worker"].rsplit(":", 2)[0], pid) is not False:
            continue
        tid = shared.trial_id(t.number)
        try:
            if storage.set_trial_state_values(tid, TrialState.FAIL):
                RETRY(study, storage.get_trial(tid))  # as fail_stale_trials does with its own
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker was first
            continue
    with _quiet():
        optuna.storages.fail_stale_trials(study)
    return len(before - {t.number for t in running_trials(study)})


def claim_is_within(study, number: int, n_trials: int) -> bool:
    """After asking trial `number`: is it one of the first n_trials - measured running trials?
    Optuna's own limit cannot say: `MaxTrialsCallback(n, states)` counts trials in those states
    after one ends and calls `study.stop()`, which only ends `optimize`; it neither sees the
    trials other workers are measuring (each worker would take one more: up to workers - 1 over
    n) nor tells interrupted, duplicate and retried trials from measured ones.
    Two workers may both see a free slot and ask at once; both then see each other's RUNNING
    trial here, and the later-numbered one gives its claim back. The only overshoot left is two
    claims whose own check runs before the other's claim is stored (milliseconds apart): at
    most workers - 1 extra trials, and only on the last slots of a study."""
    slots = n_trials - len(measured_trials(study))
    running = sorted(t.number for t in running_trials(study))
    return number in running[:max(slots, 0)]


def abandon(shared: Shared, number: int, requeue: bool | None = False) -> bool:
    """End a RUNNING trial as FAIL, marked `interrupted` so it does not count as measured; with
    `requeue`, Optuna's retry callback queues its parameters and attributes again (the retry's
    `retry_history` names this trial); with None, only when it came from the queue (a retry or
    an enqueued point: losing it would lose that point). False if it was not RUNNING."""
    s, tid = shared.storage, shared.trial_id(number)
    t = s.get_trial(tid)  # as it was asked: its retry must not inherit `interrupted`
    if t.state != TrialState.RUNNING:
        return False
    try:
        s.set_trial_user_attr(tid, "interrupted", True)
        s.set_trial_state_values(tid, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale meanwhile
        return False
    if requeue or (requeue is None and {"fixed_params", "failed_trial"} & set(t.system_attrs)):
        RETRY(shared.study, t)
    return True


@contextmanager
def heartbeat(shared: Shared, numbers: list[int]):
    """Optuna's heartbeat thread for each of these trials while the block runs (a no-op without
    heartbeats). As in `optimize`, a beat the database refuses ends that thread: the trial then
    goes stale after grace_period, which is why grace_period must stay above a database's worst
    pause (docs/scaling.md)."""
    with ExitStack() as beating:
        for n in numbers:
            beating.enter_context(get_heartbeat_thread(shared.trial_id(n), shared.storage))
        yield


# ---------------------------------------------------------------------- screen, duplicates


def screen_passes(study, value: float, keep: float, n_startup: int) -> bool:
    """Whether a screen throughput is in the top `keep` fraction of the screens so far (those of
    kept and pruned trials alike, duplicates aside); the first `n_startup` screens always pass.
    Optuna's PercentilePruner compares with COMPLETE trials only, i.e. with the kept screens: a
    bar that rises with every trial kept, so it keeps far less than `keep` over a sweep."""
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
    """Trials whose parameters were measured already, are being measured by another worker
    (a lower-numbered RUNNING trial), or are asked twice in this batch are not run again;
    they are resolved with the earlier trial. Returns (fresh, [(trial, earlier number)])."""
    mine = {t.number for t in trials}
    seen = {key(t.params): t.number for t in measured_trials(study)}
    others = [(t.number, key(t.params)) for t in running_trials(study) if t.number not in mine]
    fresh, dups = [], []
    for t in trials:
        k = key(t.params)
        # of two live trials with the same parameters, the lower-numbered one is measured;
        # both workers see both trials, so exactly one of them runs it
        earlier = [n for n, o in others if o == k and n < t.number]
        if k in seen:
            dups.append((t, seen[k]))
        elif earlier:
            dups.append((t, min(earlier)))
        else:
            seen[k] = t.number
            fresh.append(t)
    return fresh, dups


def set_attr(owner, key: str, value) -> None:
    """A trial's or a study's user attribute, masked: the storage may be a shared database that
    others read (an error message or a path may name a URL with its password)."""
    owner.set_user_attr(key, mask_secrets(value))


def copy_result(study, trial, prev: FrozenTrial) -> None:
    """Tell a duplicate trial what its twin measured, without running it (a twin still being
    measured elsewhere: FAIL, which samplers ignore; it never counts as measured)."""
    for k, v in prev.user_attrs.items():
        set_attr(trial, k, v)
    set_attr(trial, "duplicate_of", prev.number)
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


def record(trial, rec, rung: Rung) -> None:
    """What the report and a later resume need, stored on the trial before it is told."""
    set_attr(trial, "status", str(rec.status))
    set_attr(trial, "rung", rung.value)
    set_attr(trial, "dir", str(rec.dir))
    if rung == Rung.screen:
        set_attr(trial, "screen_dir", str(rec.dir))
        set_attr(trial, "screen_throughput", rec.throughput)
    set_attr(trial, "throughput", rec.throughput)
    set_attr(trial, "peak_memory_fraction", rec.peak_memory_fraction)
    set_attr(trial, "memory_ceiling", rec.memory_ceiling)
    if rec.error:
        set_attr(trial, "error", str(rec.error)[:1000])


# ---------------------------------------------------------------------- the confirm step


def queue_rounds(shared: Shared, top: list[FrozenTrial], rounds: int) -> Shared:
    """The confirm step's study (`<study>-confirm`, same storage), its rounds queued: each of
    `top`'s parameters `rounds` times, interleaved (A, B, C, A, B, C), as trials with attrs
    `confirm_of` (the trial's number) and `round`. Optuna's queue then hands each round to one
    worker, its heartbeats and retries give a dead worker's round to the next, and a resume
    finds them queued or measured. A study of its own: the search's `ask` never takes a round,
    and a round is no trial of the search (not counted, not learnt from). A round already in the
    study is not queued again (`enqueue_trial(skip_if_exists=True)` cannot tell rounds apart:
    they share their parameters); of two workers queueing the same round in the same
    milliseconds both may stay, and both measurements are pooled."""
    c = _open(shared.study.study_name + ROUNDS, shared.storage)
    for rnd in range(rounds):
        for t in top:
            if not any(r.user_attrs.get("confirm_of") == t.number and r.user_attrs.get("round")
                       == rnd for r in c.study.get_trials(deepcopy=False)):
                c.study.enqueue_trial(t.params, user_attrs={"confirm_of": t.number, "round": rnd})
    return c


def confirm_dirs(study_name: str, storage) -> dict[int, list[str]]:
    """Each confirmed trial's confirm folders, in round order (a round two workers both measured
    gives two): the measured rounds of `<study_name>-confirm` in `storage` (a URL or the storage
    object), none when it does not exist."""
    try:
        rounds = optuna.load_study(study_name=study_name + ROUNDS, storage=storage)
    except KeyError:  # no confirm step ran
        return {}
    out: dict[int, list[str]] = {}
    for r in sorted(measured_trials(rounds), key=lambda r: (r.user_attrs["round"], r.number)):
        out.setdefault(r.user_attrs["confirm_of"], []).append(r.user_attrs["dir"])
    return out
