"""The Optuna study of a search: opening it (race-safe, with heartbeats), and what its trials mean.
Optuna does the leases; the slot check, a dead local worker and what counts as measured are ours."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property

import optuna
from filelock import FileLock
from optuna.storages import InMemoryStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

# private in Optuna, but it is what Study.optimize beats with around an objective (_run_trial)
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import FrozenTrial, TrialState

from gpubench.config.overrides import format_value
from gpubench.core.files import retry
from gpubench.core.record import Rung, Status, process_alive
from gpubench.core.secrets import mask_secrets
from gpubench.core.uris import sqlite_path
from gpubench.search.jobs import SweepFailed
from gpubench.search.space import key

# the constraint's name in Optuna: peak memory fraction - memory.ceiling, <= 0 is feasible
MEMORY = "memory"
# attempts at opening a storage or a study that several workers create at once
OPEN_ATTEMPTS = 10
# the confirm step's study: the search's study name and this
ROUNDS = "-confirm"


_QUIETING = threading.RLock()


@contextmanager
def _quiet():
    """Optuna calls heartbeats and their callbacks experimental, and warns of heartbeats outside
    `optimize`: we beat ourselves. One thread at a time (the blocks are short): catch_warnings
    swaps the process-wide filter list, and two threads inside at once restore each other's."""
    with _QUIETING, warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Heartbeat of storage")
        yield


with _quiet():
    # queues a failed trial again (with `retry_history`): a stale one and one `abandon`ed alike
    RETRY = RetryHeartbeatStaleTrialCallback()


@dataclass
class Shared:
    """A study with the storage object it was opened on (in memory: one process)."""

    study: optuna.Study
    storage: RDBStorage | InMemoryStorage
    # RUNNING trials that no `ask` has named yet, by number: when this process first saw each
    unnamed: dict[int, float] = field(default_factory=dict)

    @cached_property
    def turn(self) -> FileLock | nullcontext:
        """Held while a trial changes hands. Optuna reads a trial's state, then writes it; SQLite
        has no `SELECT ... FOR UPDATE`, so two workers could pop one queued trial or queue a dead
        one twice. A file lock beside the database: the kernel frees it when its holder dies."""
        db = sqlite_path(getattr(self.storage, "url", ""))
        return FileLock(f"{db}.turn.lock", thread_local=False) if db else nullcontext()

    @property
    def beating(self) -> bool:
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
    """An RDB storage with heartbeats on. Read once first: a server down or a file that is no
    database fails at once; workers creating a fresh one at once can collide on its tables."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        try:
            sqlalchemy.inspect(engine).get_table_names()
        finally:
            engine.dispose()
        with _quiet():
            return retry(lambda: RDBStorage(url, heartbeat_interval=heartbeat_interval,
                                            grace_period=grace_period,
                                            heartbeat_stale_trial_callback=RETRY),
                         OPEN_ATTEMPTS, 0.2)
    except Exception as e:
        raise cannot_open(url, e) from e


def cannot_open(url: str | None, e: BaseException) -> SweepFailed:
    """The URL and the innermost cause (Optuna's and SQLAlchemy's wrappers add SQL and a link)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return SweepFailed(f"the study storage {url} could not be opened: {e}")


def open_study(name: str, url: str | None, heartbeat_interval: int | None = None,
               grace_period: int | None = None) -> Shared:
    """Create the study or load it (SweepFailed when its storage does not open or take it)."""
    storage = open_storage(url, heartbeat_interval, grace_period) if url else InMemoryStorage()
    try:
        return _open(name, storage)
    except optuna.exceptions.OptunaError as e:
        raise cannot_open(url, e) from e


def _open(name: str, storage) -> Shared:
    # workers creating one study at once fail in all but one (lookup, then insert): retried
    return retry(lambda: Shared(optuna.create_study(
        storage=storage, study_name=name, direction="maximize", load_if_exists=True,
        pruner=optuna.pruners.NopPruner()), storage),  # the screen's cut: screen_passes()
        OPEN_ATTEMPTS, 0.1, (optuna.exceptions.DuplicatedStudyError,
                             optuna.exceptions.StorageInternalError, KeyError))


def ask(shared: Shared, distributions):
    """A trial claimed by this process (attr `worker`: host:pid:trial; the number because the
    retry callback copies attributes), beaten at once: Optuna's stale check skips a trial that
    never beat (see fail_stale). Named within the turn: under a file lock, a trial seen unnamed
    is one whose asker died holding it (the kernel freed the lock), failed at once."""
    with _quiet(), shared.turn:
        t = shared.study.ask(distributions)
        if shared.beating:
            shared.storage.record_heartbeat(shared.trial_id(t.number))
        set_attr(t, "worker", f"{socket.gethostname()}:{os.getpid()}:{t.number}")
    return t


@contextmanager
def heartbeat(shared: Shared, numbers: list[int]):
    """Optuna's heartbeat thread for each trial while the block runs. As in `optimize`, a beat
    the database refuses ends it: grace_period must exceed its worst pause (docs/scaling.md)."""
    with ExitStack() as beating:
        for n in numbers:
            beating.enter_context(get_heartbeat_thread(shared.trial_id(n), shared.storage))
        yield


def told_dirs(study) -> dict[str, tuple[str, str | None]]:
    """Each job folder's final (status, error) in the study (its record may be unfinished)."""
    return {str(t.user_attrs["dir"]): (str(status), t.user_attrs.get("error"))
            for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("dir") and (status := Status.read(t.user_attrs.get("status")))
            and status.final}


def describe(params: dict) -> str:
    """`channels_last=true loader.batch_size=8`: a trial's params as the command line takes them."""
    return " ".join(f"{k}={format_value(v)}" for k, v in params.items())


def measured_trials(study) -> list[FrozenTrial]:
    """Finished trials counting toward n_trials: not interrupted, duplicate or queued again."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return [t for t in trials if t.state.is_finished() and not t.user_attrs.get("interrupted")
            and "duplicate_of" not in t.user_attrs and t.number not in retried]


def running_trials(study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def wait_for_running(study, numbers: set[int], timeout_s: float, look_s: float = 0.2) -> bool:
    """Wait, at most timeout_s, until one of these RUNNING trials ends (True). It looks every
    look_s (one cheap query): sleeping out the whole poll would add to wall time."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(look_s, left))
        if not numbers <= {t.number for t in running_trials(study)}:
            return True
    return False


def worker_pid(t: FrozenTrial) -> int | None:
    """The pid of the process that asked trial t (`ask`), None for a copied `worker`."""
    parts = str(t.user_attrs.get("worker", "")).rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[2] == str(t.number) else None


def fail_stale(shared: Shared, clock: Callable[[], float] = time.monotonic) -> int:
    """Fail the trials of workers that are gone and queue them again; how many were failed.
    Optuna's `fail_stale_trials` knows only time: a dead process of this host is failed at once
    (a resume after kill -9 need not wait). A trial never named (see `ask`), which Optuna skips,
    is failed at once under the turn's file lock; without one (a server database) once unnamed a
    grace period, timed on this process's `clock` (another host's clock is not this one's)."""
    if not shared.beating:  # in memory: one process
        return 0
    with shared.turn:
        before = running_trials(shared.study)
        now = clock()
        # under a file lock, no asker alive leaves a trial unnamed outside the turn
        grace = -1.0 if isinstance(shared.turn, FileLock) else float(
            shared.storage.grace_period or 2 * shared.storage.heartbeat_interval)
        shared.unnamed = {t.number: shared.unnamed.get(t.number, now) for t in before
                          if worker_pid(t) is None}
        for t in before:
            pid = worker_pid(t)
            if (now - shared.unnamed[t.number] > grace if pid is None else
                    process_alive(t.user_attrs["worker"].split(":")[0], pid) is False):
                abandon(shared, t.number, requeue=True)
        with _quiet():
            optuna.storages.fail_stale_trials(shared.study)
        return len({t.number for t in before} - {t.number for t in running_trials(shared.study)})


def claim_is_within(study, number: int, n_trials: int) -> bool:
    """Is trial `number` one of the first n_trials - measured running trials? (Optuna's
    MaxTrialsCallback counts finished trials only.) Of two workers asking at once the later
    gives its claim back; checks racing each other's writes overshoot by at most workers - 1."""
    slots = n_trials - len(measured_trials(study))
    return number in sorted(t.number for t in running_trials(study))[:max(slots, 0)]


def abandon(shared: Shared, number: int, requeue: bool | None = False) -> bool:
    """End a RUNNING trial as FAIL, marked `interrupted` (not measured), False if it was not
    RUNNING; `requeue` queues it again, None only if it came from the queue (not to lose it)."""
    s, tid = shared.storage, shared.trial_id(number)
    with shared.turn:
        t = s.get_trial(tid)  # as it was asked: its retry must not inherit `interrupted`
        if t.state != TrialState.RUNNING:
            return False
        try:
            s.set_trial_user_attr(tid, "interrupted", True)
            s.set_trial_state_values(tid, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker failed it meanwhile
            return False
        if requeue or (requeue is None and {"fixed_params", "failed_trial"} & set(t.system_attrs)):
            RETRY(shared.study, t)
    return True


def screen_passes(study, value: float, keep: float, n_startup: int) -> bool:
    """Whether a screen is in the top `keep` of the screens so far (pruned too, duplicates
    aside); the first `n_startup` pass. (Optuna's PercentilePruner compares with kept ones only:
    a rising bar that keeps far less than `keep`.)"""
    told = (TrialState.COMPLETE, TrialState.PRUNED)
    screens = [t.intermediate_values[0] for t in study.get_trials(deepcopy=False, states=told)
               if 0 in t.intermediate_values and "duplicate_of" not in t.user_attrs]
    if len(screens) < n_startup:
        return True
    # its rank, itself included (ties in its favour): keep 0.5 with 4 earlier screens keeps 3 of 5
    return sum(s > value for s in screens) < math.ceil(keep * (len(screens) + 1))


def split_duplicates(study, trials: list, fixed: dict | None = None) -> tuple[list, list]:
    """(fresh, [(trial, earlier number)]): parameters measured already, being measured by
    another worker (a lower-numbered RUNNING trial) or twice in this batch are not run again
    (as runs: `key`, with the search's `fixed` values)."""
    mine = {t.number for t in trials}
    seen = {key(t.params, fixed): t.number for t in measured_trials(study)}
    others = [(t.number, key(t.params, fixed)) for t in running_trials(study)
              if t.number not in mine]
    fresh, dups = [], []
    for t in trials:
        k = key(t.params, fixed)
        # of two live twins the lower-numbered one is measured: both workers see both trials
        earlier = [n for n, o in others if o == k and n < t.number]
        if k in seen or earlier:
            dups.append((t, seen[k] if k in seen else min(earlier)))
        else:
            seen[k] = t.number
            fresh.append(t)
    return fresh, dups


def set_attr(owner, key: str, value) -> None:
    """A user attribute, masked: the storage may be a shared database that others read."""
    owner.set_user_attr(key, mask_secrets(value))


def copy_result(study, trial, prev: FrozenTrial) -> None:
    """Tell a duplicate what its twin measured (a twin measured elsewhere yet: FAIL, uncounted)."""
    for k, v in {**prev.user_attrs, "duplicate_of": prev.number}.items():
        set_attr(trial, k, v)
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
    """What the report and a later resume need, stored before the trial is told."""
    attrs = {"status": str(rec.status), "rung": rung.value, "dir": str(rec.dir),
             "throughput": rec.throughput, "peak_memory_fraction": rec.peak_memory_fraction,
             "memory_ceiling": rec.memory_ceiling}
    if rung == Rung.screen:
        attrs |= {"screen_dir": str(rec.dir), "screen_throughput": rec.throughput}
    if rec.error:
        attrs["error"] = str(rec.error)[:1000]
    for k, v in attrs.items():
        set_attr(trial, k, v)


def queue_rounds(shared: Shared, top: list[FrozenTrial], rounds: int) -> Shared:
    """The confirm step's study (`<study>-confirm`: the search never takes, counts or learns from
    a round), `top` queued `rounds` times, interleaved (A, B, C, A, B, C), attrs `confirm_of` and
    `round`. Rounds share parameters, so one is looked for by its attrs (`skip_if_exists` cannot
    tell them apart); two workers queueing one at once both keep it (pooled)."""
    c = _open(shared.study.study_name + ROUNDS, shared.storage)
    for rnd in range(rounds):
        for t in top:
            if not any(r.user_attrs.get("confirm_of") == t.number and r.user_attrs.get("round")
                       == rnd for r in c.study.get_trials(deepcopy=False)):
                c.study.enqueue_trial(t.params, user_attrs={"confirm_of": t.number, "round": rnd})
    return c


def _rounds(study_name: str, storage) -> optuna.Study | None:
    """The confirm step's study (`storage`: URL or object); None where no confirm step ran."""
    try:
        with _quiet():
            return optuna.load_study(study_name=study_name + ROUNDS, storage=storage)
    except KeyError:
        return None


def rounds_left(shared: Shared) -> int:
    """The confirm step's rounds still queued or running (a resume after a kill measures them,
    whatever the partly confirmed figures now say)."""
    rounds = _rounds(shared.study.study_name, shared.storage)
    return 0 if rounds is None else len(
        rounds.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)))


def confirm_dirs(study_name: str, storage) -> dict[int, list[str]]:
    """Each confirmed trial's confirm folders, in round order."""
    if (rounds := _rounds(study_name, storage)) is None:
        return {}
    out: dict[int, list[str]] = {}
    for r in sorted(measured_trials(rounds), key=lambda r: (r.user_attrs["round"], r.number)):
        out.setdefault(r.user_attrs["confirm_of"], []).append(r.user_attrs["dir"])
    return out
