"""The Optuna study of a search: opening it (race-safe, with heartbeats), and what its trials mean.

Everything that touches Optuna's storage lives here, behind public Optuna API: the storage object
is built by us (`optuna.storages.RDBStorage`), so trial ids are looked up through the storage's
public methods rather than read from private attributes of Study or Trial.

Several workers (processes, machines) may run the same search on one RDB study at once:

- a worker claims a trial (asks one) only while measured + running trials < n_trials, then
  checks again; a claim past the last slot is given back (see `claim_is_within`);
- while a worker measures, a thread records the trial's heartbeat every `heartbeat_interval`
  seconds; a RUNNING trial whose heartbeat is older than `grace_period` belongs to a worker that
  died (kill -9, a lost machine). `fail_stale` fails it and Optuna's
  `RetryHeartbeatStaleTrialCallback` queues its parameters again, for whichever worker asks next.
  A live worker's trial is never touched;
- a trial counts as measured (`measured_trials`) when it finished and was neither interrupted
  (Ctrl-C), nor a duplicate resolved without running, nor a stale trial that was retried.

Optuna is imported lazily by the callers' first use: Hydra imports the plugin on every run.

Why one module of this size: every touch of Optuna's storage (creation races, heartbeats,
claims, retries) is kept behind this one module's public functions.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import socket
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import optuna
from optuna.storages import InMemoryStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from gpubench.core.record import Rung, RunRecord, Status
from gpubench.core.secrets import mask_secrets

log = logging.getLogger("gpubench.sweep")

# the constraint's name in Optuna: peak memory fraction - memory.ceiling, <= 0 is feasible
MEMORY = "memory"
# attempts at creating/loading a study that several workers create at the same moment
OPEN_ATTEMPTS = 10


@dataclass
class Shared:
    """A study with the storage object it was opened on (None: in memory, one process)."""

    study: optuna.Study
    # built here and handed to create_study, so its public methods reach trials by id
    storage: RDBStorage | InMemoryStorage
    heartbeat_interval: int | None

    @property
    def grace_s(self) -> float | None:
        """Seconds without a beat after which a worker's trial (or confirm claim) is taken for
        abandoned; None without heartbeats."""
        if not self.heartbeat_interval:
            return None
        return self.storage.grace_period or 2 * self.heartbeat_interval

    def trial_id(self, number: int) -> int:
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)


def make_sampler(name: str, seed: int | None, n_startup_trials: int):
    """The sampler of a sweep (scripts/bench_search.py replays grids with the same one)."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # TPE reads each trial's constraint (Trial.set_constraint, Optuna >= 5) by itself
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)


def open_storage(url: str, heartbeat_interval: int | None, grace_period: int | None):
    """An RDB storage with heartbeats on. Several workers creating a fresh database at once
    can collide on its tables: a later attempt finds them made."""
    last: Exception | None = None
    for attempt in range(OPEN_ATTEMPTS):
        try:
            # heartbeats and the retry callback are "experimental" in Optuna 5 (since 2.x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if not heartbeat_interval:
                    return RDBStorage(url)
                # the callback that re-queues a stale trial's parameters is the one of the
                # installed Optuna: RetryHeartbeatStaleTrialCallback (RetryFailedTrialCallback
                # before 4.9, deprecated since)
                return RDBStorage(
                    url, heartbeat_interval=int(heartbeat_interval), grace_period=grace_period,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback())
        except Exception as e:  # sqlalchemy IntegrityError/ProgrammingError while racing
            last = e
            time.sleep(0.2 * (attempt + 1))
    raise RuntimeError(mask_secrets(f"storage {url} could not be opened: {last}")) from last


def open_study(name: str, url: str | None, heartbeat_interval: int | None = None,
               grace_period: int | None = None) -> Shared:
    """Create the study or load it. `create_study(load_if_exists=True)` run by several workers at
    once can fail in all but one with an integrity error (the name is unique): load it then."""
    storage = open_storage(url, heartbeat_interval, grace_period) if url else InMemoryStorage()
    last: Exception | None = None
    for attempt in range(OPEN_ATTEMPTS):
        try:
            study = optuna.create_study(
                storage=storage, study_name=name, direction="maximize", load_if_exists=True,
                # the screen's cut is screen_passes(), not an Optuna pruner
                pruner=optuna.pruners.NopPruner(),
            )
            return Shared(study, storage, heartbeat_interval if url else None)
        except (optuna.exceptions.DuplicatedStudyError, optuna.exceptions.StorageInternalError,
                KeyError) as e:
            last = e  # another worker created it between our lookup and our insert
            time.sleep(0.1 * (attempt + 1))
    raise RuntimeError(f"study {name!r} could neither be created nor loaded: {last}") from last


def ask(study, distributions):
    """A trial with its parameters. Optuna warns that heartbeats are meant for `optimize`; we
    record them ourselves around each measurement (`heartbeat`), so the warning is moot."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return study.ask(distributions)


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
    """Numbers of stale trials whose parameters were queued again by the retry callback."""
    out: set[int] = set()
    for t in trials:
        out.update(t.system_attrs.get("retry_history", ()))
    return out


def measured_trials(study) -> list[FrozenTrial]:
    """Finished trials that count toward n_trials: not interrupted, not a duplicate, not a
    stale trial that another worker retries."""
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
    """host:pid:trial of this sweep process for a trial it claims (attr `worker`). The trial
    number is part of it because Optuna's retry callback copies a stale trial's attributes onto
    its retry: a copied value names another trial and is ignored."""
    return f"{socket.gethostname()}:{os.getpid()}:{number}"


def worker_pid(t: FrozenTrial) -> int | None:
    parts = str(t.user_attrs.get("worker", "")).rsplit(":", 2)
    if len(parts) != 3 or parts[2] != str(t.number):
        return None
    return int(parts[1])


def _worker_gone(t: FrozenTrial, grace_s: float) -> bool:
    """The claiming process is known dead: same host, no such pid (the run record's rule). A
    trial no worker claimed (its process died between asking and claiming, or an older
    gpubench left it; a retry still carries its stale original's claim) has no heartbeat either, which Optuna never calls stale: it is taken for
    dead once it has been RUNNING for the grace period."""
    pid = worker_pid(t)
    if pid is None:
        if t.datetime_start is None:
            return False
        return (datetime.now() - t.datetime_start).total_seconds() > grace_s
    return _process_gone(str(t.user_attrs["worker"]).rsplit(":", 2)[0], pid)


def _process_gone(host: str, pid: int) -> bool:
    """Known dead: a process of this host that no longer exists (the run record's rule; a
    process on another host cannot be checked from here)."""
    return RunRecord(status=Status.running, pid=pid, host=host).stale


def fail_stale(shared: Shared) -> int:
    """Fail trials whose worker is gone and queue them again (the storage's retry callback):
    those whose heartbeat is older than the grace period, and at once those claimed by a
    process of this host that no longer exists (a resume right after kill -9 need not wait out
    the grace period). Returns how many RUNNING trials were failed. No-op without heartbeats."""
    if not shared.heartbeat_interval:
        return 0
    study, storage = shared.study, shared.storage
    grace = shared.grace_s
    before = {t.number for t in running_trials(study)}
    for t in running_trials(study):
        if not _worker_gone(t, grace):
            continue
        tid = shared.trial_id(t.number)
        try:
            if not storage.set_trial_state_values(tid, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker was first
            continue
        # the same callback Optuna's fail_stale_trials runs on a stale trial
        storage.get_heartbeat_stale_trial_callback()(study, copy.deepcopy(storage.get_trial(tid)))
    with warnings.catch_warnings():  # fail_stale_trials is "experimental" in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return len(before - {t.number for t in running_trials(study)})


def claim_is_within(study, number: int, n_trials: int) -> bool:
    """After asking trial `number`: is it one of the first n_trials - measured running trials?
    Two workers may both see a free slot and ask at once; both then see each other's RUNNING
    trial here, and the later-numbered one gives its claim back. The only overshoot left is two
    claims whose own check runs before the other's claim is stored (milliseconds apart): at
    most workers - 1 extra trials, and only on the last slots of a study."""
    slots = n_trials - len(measured_trials(study))
    running = sorted(t.number for t in running_trials(study))
    return number in running[:max(slots, 0)]


def abandon(shared: Shared, number: int, requeue: bool | None = False) -> bool:
    """End a RUNNING trial as FAIL, marked `interrupted` so it does not count as measured;
    with `requeue`, its parameters are queued again (attr `retry_of`); with None, only when it
    came from the queue (a retry or an enqueued point: losing it would lose that point).
    False if it was not RUNNING."""
    s = shared.storage
    tid = shared.trial_id(number)
    t = s.get_trial(tid)
    if t.state != TrialState.RUNNING:
        return False
    s.set_trial_user_attr(tid, "interrupted", True)
    try:
        s.set_trial_state_values(tid, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale meanwhile
        return False
    if requeue is None:
        requeue = bool({"fixed_params", "failed_trial"} & set(t.system_attrs)
                       or "retry_of" in t.user_attrs)
    if requeue:
        shared.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
    return True


@contextmanager
def heartbeat(shared: Shared, numbers: list[int]):
    """Beat for these trials while the block runs (a daemon thread: a process that dies stops
    beating, which is the point)."""
    if not shared.heartbeat_interval or not numbers:
        yield
        return
    ids = [shared.trial_id(n) for n in numbers]

    def beat() -> None:
        for tid in ids:
            shared.storage.record_heartbeat(tid)

    beat()  # the first beat before any work, so the trial is never beat-less
    with _every(shared.heartbeat_interval, beat, "gpubench-heartbeat"):
        yield


@contextmanager
def _every(interval: float, fn, name: str):
    """Call fn every `interval` seconds while the block runs, from a daemon thread: a process
    that dies stops calling it, which is the point of a heartbeat."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                fn()
            except Exception as e:  # a blip of the database: the next beat may pass
                log.debug("%s: beat not recorded: %s", name, e)

    th = threading.Thread(target=loop, name=name, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


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


# The confirm step's measurements, as study user attrs (Optuna refuses attributes on a finished
# trial, and confirmations run after their trial was told): one key per job,
# confirm_dir:<trial>:<round>:<worker>, never a list read and written back, and never a key two
# workers could both write (either would lose a folder); and the claim of a round by the worker
# measuring it, confirm_claim:<trial>:<round> = {"by": host:pid, "at": unix time of its last beat}.
CONFIRM_ATTR = "confirm_dir:{}:{}:{}"
CONFIRM_CLAIM = "confirm_claim:{}:{}"
OLD_CONFIRM_ATTR = "confirm_dirs:{}"  # a list, as gpubench 0.1 kept it: still read on resume


def confirm_dirs(study, number: int) -> list[str]:
    """Trial `number`'s confirm folders, in round order (a round two workers both measured
    gives two)."""
    attrs = study.user_attrs
    prefix = f"confirm_dir:{number}:"
    keyed = sorted((int(k.split(":")[2]), k, v) for k, v in attrs.items() if k.startswith(prefix))
    return [*attrs.get(OLD_CONFIRM_ATTR.format(number), []), *(v for _, _, v in keyed)]


def confirm_done(study, number: int, rnd: int) -> bool:
    attrs = study.user_attrs
    return (len(attrs.get(OLD_CONFIRM_ATTR.format(number), [])) > rnd
            or any(k.startswith(f"confirm_dir:{number}:{rnd}:") for k in attrs))


def add_confirm_dir(study, number: int, rnd: int, run_dir, me: str | None = None) -> None:
    set_attr(study, CONFIRM_ATTR.format(number, rnd, me or this_worker()), str(run_dir))


def this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _claim_gone(holder: object, grace_s: float | None) -> bool:
    """A claim whose worker is known dead (this host, no such pid) or, with heartbeats, has not
    beaten for the grace period (a worker on another host, or one stopped without a word)."""
    if not isinstance(holder, dict) or not holder.get("by"):
        return True  # released (Ctrl-C), or not a claim at all
    host, _, pid = str(holder["by"]).rpartition(":")
    if pid.isdigit() and _process_gone(host, int(pid)):
        return True
    return grace_s is not None and time.time() - float(holder.get("at") or 0) > grace_s


def claim_confirm(shared: Shared, number: int, rnd: int, me: str | None = None) -> bool:
    """Take round `rnd` of trial `number`'s confirmation for this worker. False when it is
    measured already (a resume) or claimed by another worker that is alive (see _claim_gone):
    several workers reaching the confirm step together share its rounds instead of each
    measuring all of them. The claim is written, then read back: of two workers claiming at
    once, the later write wins and only its worker sees itself there. The one overlap left, a
    claim written after the other's read-back (milliseconds), measures a round twice; both
    measurements are kept (one key per job) and pooled."""
    study, me = shared.study, me or this_worker()
    if confirm_done(study, number, rnd):
        return False
    key = CONFIRM_CLAIM.format(number, rnd)
    holder = study.user_attrs.get(key)
    if isinstance(holder, dict) and holder.get("by") != me and not _claim_gone(holder, shared.grace_s):
        return False
    set_attr(study, key, {"by": me, "at": time.time()})
    return (study.user_attrs.get(key) or {}).get("by") == me


@contextmanager
def holding_claim(shared: Shared, number: int, rnd: int, me: str | None = None):
    """While this worker measures a claimed round: the claim beats with the trials' heartbeat
    interval (so a worker that dies, on any host, loses it after the grace period), and is
    given back at once when the measurement is interrupted (Ctrl-C: the next worker or a
    resume takes it without waiting)."""
    study, me = shared.study, me or this_worker()
    key = CONFIRM_CLAIM.format(number, rnd)
    try:
        if shared.heartbeat_interval:
            with _every(shared.heartbeat_interval,
                        lambda: set_attr(study, key, {"by": me, "at": time.time()}),
                        "gpubench-confirm-claim"):
                yield
        else:
            yield
    except BaseException:
        try:
            set_attr(study, key, None)
        except Exception as e:  # the claim then goes stale instead
            log.debug("confirm claim not given back: %s", e)
        raise
