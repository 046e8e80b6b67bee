"""Upload runs that did not reach MLflow: `python -m gpubench.tracking sync <outputs dir>`. A
run's `run_uid` is its MLflow identity: syncing twice, or after an upload that broke half-way,
leaves no duplicates. A results.json left `running` by a process that is gone is marked `killed`.

Runs go only where the user says: `--uri`, else the embedded store of the run's outputs folder.
The store a run folder records is compared with that, never connected to: a copied folder could
name any host (and be sent MLFLOW_TRACKING_USERNAME/PASSWORD) or any path (and have a database
made there); such runs are skipped, one line per store naming the `--uri` that uploads them."""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path

import yaml

from gpubench.core import record
from gpubench.core.files import damaged, inside, refusal
from gpubench.core.record import RESULTS_FILE, RunRecord, Word, process_alive
from gpubench.core.secrets import error_text, mask_secrets, say
from gpubench.core.stats import count
from gpubench.core.uris import same_store
from gpubench.tracking import runs
from gpubench.tracking.store import Store, default_uri, open_store, uri_problem
from gpubench.tracking.sweeps import close_sweep, live, open_sweep

log = logging.getLogger("gpubench")
PARENT_TAG = "mlflow.parentRunId"

# <experiment>/<run id>/artifacts/ (a run's) or <experiment>/models/m-<id>/artifacts/ (a model's)
_STORE_RUN = re.compile(r"[0-9a-f]{32}|m-[0-9a-f]{32}")


def in_artifact_store(run_dir: Path) -> bool:
    """Under `<run id>/artifacts/` (a server's --artifacts-destination can be any folder)."""
    parts = Path(run_dir).resolve().parts
    return any(p == "artifacts" and _STORE_RUN.fullmatch(prev)
               for prev, p in zip(parts, parts[1:], strict=False))


def _run_default_uri(run_dir: Path) -> str:
    """The embedded store a run with tracking.uri=null was meant for: <its outputs/>/mlflow.db."""
    return default_uri(next((d.parent for d in run_dir.resolve().parents
                             if d.name == "outputs"), None))


def _in_store(info: dict, uri: str, experiment: str) -> bool:
    """A marker (or a parent file) saying its run reached this store and experiment."""
    return bool(info.get("synced")) and same_store(info.get("tracking_uri"), uri) and \
        info.get("experiment") == experiment


class Triage(Word):
    """What sync does with one run folder (_triage)."""

    skipped = "skipped"
    failed = "failed"
    elsewhere = "elsewhere"  # recorded for another store: shown, never followed
    todo = "todo"
    orphan = "orphan"  # uploaded, but not under its sweep's parent
    present = "present"

    @property
    def counted(self) -> str | None:  # its key in sync()'s counts; a todo counts once uploaded
        return {Triage.elsewhere: "skipped", Triage.orphan: "present", Triage.todo: None}.get(
            self, self.value)


def _triage(run_dir: Path, uri: str | None, experiment: str | None) -> tuple[Triage, object]:
    """(outcome, detail) for one run folder: `skipped`: why; `elsewhere`: the store it names;
    `todo`, `present`, `orphan` (not under its sweep's parent): ((store, experiment), record)."""
    if not inside(run_dir / RESULTS_FILE, run_dir):  # never read what a link points out to
        return Triage.skipped, f"its {RESULTS_FILE} is a link out of the run folder"
    rec = record.load(run_dir)
    if rec is None and damaged(run_dir / RESULTS_FILE):
        say(f"{run_dir / RESULTS_FILE} is damaged (not valid JSON): not uploaded, left as it is")
        return Triage.failed, None
    if rec is not None and rec.stale:
        rec.mark_dead()
        try:
            rec.save()
        except OSError as e:  # a read-only folder: the record stays as the run left it
            say(f"{refusal(rec.path, e)}: not marked {rec.status} nor uploaded", "error")
            return Triage.failed, None
        print(f"marked {run_dir} {rec.status}: its process is gone")
    if rec is None or not rec.run_uid or not rec.status.final:
        return Triage.skipped, "no final status (still running, or unreadable)"
    marker, tcfg = runs.read(run_dir / runs.MARKER_FILE), rec.config.get("tracking") or {}
    if not marker and rec.pid and process_alive(rec.host, int(rec.pid)):
        # its own process lives (a job of a running sweep): it uploads the run itself
        return Triage.skipped, f"its process {rec.pid} is alive and uploads it"
    if uri is None and tcfg.get("backend") == "none":
        # it named no store (its tracking.uri was never used nor checked): `--uri` uploads it
        return Triage.skipped, "run with tracking=none (--uri uploads it)"
    dest = uri or _run_default_uri(run_dir)
    recorded = marker.get("tracking_uri") or tcfg.get("uri")
    if uri is None and recorded and not same_store(recorded, dest):
        return Triage.elsewhere, recorded  # shown, never followed (see the module's doc)
    name = experiment or marker.get("experiment") or tcfg.get("experiment") or "gpubench"
    if not _in_store(marker, dest, name):
        return Triage.todo, ((dest, name), rec)
    return (Triage.orphan if _orphan(run_dir, marker, dest, name) else Triage.present), (
        (dest, name), rec)


def sync(root: str | Path, uri: str | None = None, experiment: str | None = None,
         timeout_s: float = 10.0) -> dict[str, int]:
    """Upload every run under `root` not in MLflow yet to `uri`; returns counts by outcome."""
    counts = {"uploaded": 0, "present": 0, "skipped": 0, "failed": 0}
    todo: dict[tuple[str, str], list[RunRecord]] = {}
    orphans: dict[tuple[str, str], list[RunRecord]] = {}  # uploaded, but not under their sweep
    elsewhere: dict[str, int] = {}  # runs recorded for another store than the destination
    found = [d for d in record.find_runs(Path(root)) if not in_artifact_store(d)]
    for run_dir in found:
        outcome, detail = _triage(run_dir, uri, experiment)
        if outcome is Triage.skipped:
            print(f"skip {run_dir}: {detail}")
        elif outcome is Triage.elsewhere:
            shown = next((k for k in elsewhere if same_store(k, detail)), mask_secrets(str(detail)))
            elsewhere[shown] = elsewhere.get(shown, 0) + 1
        elif outcome in (Triage.todo, Triage.orphan):
            (todo if outcome is Triage.todo else orphans).setdefault(detail[0], []).append(
                detail[1])
        if outcome.counted is not None:
            counts[outcome.counted] += 1
    for shown, n in elsewhere.items():
        problem = uri_problem(shown)  # a file store MLflow 3 refuses: say what to use instead
        print(f"skip {count(n, 'run')} recorded for {shown}: a store named in a run folder is not "
              "followed; " + (f"--uri {shown!r} uploads them there" if not problem else
                              f"it is not a tracking URI ({problem}); --uri URI uploads them"))

    for key in {**todo, **orphans}:
        recs = todo.get(key, [])
        try:
            with open_store(*key, timeout_s) as store:
                _sync_into(store, recs, orphans.get(key, []), counts)
        except Exception as e:  # report it, go on with the other targets
            log.debug("sync failed", exc_info=True)
            say(f"MLflow not reached at {key[0]} ({error_text(e)}); {count(len(recs), 'run')} not "
                "synced")
            counts["failed"] += len(recs)
    _close_open_sweeps(found, uri, timeout_s)
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return counts


def _orphan(run_dir: Path, marker: dict, uri: str, experiment: str) -> bool:
    """A sweep's job uploaded without the sweep's parent (its worker lost the store-creation race,
    or the parent was not reached): its marker names no parent, or not the sweep's."""
    sweep = runs.sweep_of(run_dir)
    if sweep is None:
        return False
    info = runs.read(sweep / runs.PARENT_FILE)
    known = info.get("run_id") if _in_store(info, uri, experiment) else None
    return marker.get("parent_run_id") != known if known else not marker.get("parent_run_id")


def _close_open_sweeps(found: list[Path], uri: str | None, timeout_s: float) -> None:
    """Close the parents of interrupted sweeps left RUNNING (a live sweep closes its own)."""
    for sweep in sorted({runs.sweep_of(d) for d in found} - {None}):
        info = runs.read(sweep / runs.PARENT_FILE)
        dest = uri or _run_default_uri(sweep)
        if not _in_store(info, dest, info.get("experiment")) or info.get("finished") or \
                live(sweep):
            continue
        try:
            with open_store(dest, info["experiment"], timeout_s) as store:
                close_sweep(store, sweep, info["run_id"])
        except Exception as e:  # the runs are in; only the sweep summary waits
            log.debug("closing sweep failed", exc_info=True)
            say(f"sweep {sweep} not closed in MLflow ({error_text(e)})")


def _sync_into(store: Store, recs: list[RunRecord], orphans: list[RunRecord], counts: dict) -> None:
    parents: dict[Path, str] = {}

    def parent_of(sweep: Path) -> str:
        if sweep not in parents:
            info = runs.read(sweep / runs.PARENT_FILE)
            if _in_store(info, store.uri, store.experiment):
                parents[sweep] = info["run_id"]
            else:  # the sweep's parent, made from its multirun.yaml
                try:
                    h = (yaml.safe_load((sweep / "multirun.yaml").read_text()) or {}).get("hydra")
                except (OSError, yaml.YAMLError):
                    h = None
                parents[sweep] = open_sweep(store, sweep, h or {})
        return parents[sweep]

    for rec in recs:
        run_dir = Path(rec.dir)
        with contextlib.ExitStack() as held:
            try:
                holder = held.enter_context(runs.upload_claim(run_dir))
            except OSError as e:  # a folder that refuses the claim file refuses the marker too
                say(f"{refusal(run_dir / runs.CLAIM_FILE, e)}: not uploaded", "error")
                counts["failed"] += 1
                continue
            if holder is not None:  # its own process (or another sync) is uploading it now
                print(f"skip {run_dir}: being uploaded by {holder}")
                counts["skipped"] += 1
                continue
            _upload_one(store, rec, run_dir, parent_of, counts)
    for rec in orphans:
        run_dir = Path(rec.dir)
        rid = runs.read(run_dir / runs.MARKER_FILE)["run_id"]
        parent = store.client.get_run(rid).data.tags.get(PARENT_TAG)
        if parent is None:
            parent = parent_of(runs.sweep_of(run_dir))
            store.client.set_tag(rid, PARENT_TAG, parent)
            print(f"attached {run_dir} (run {rid}) to its sweep's parent run {parent}")
        runs.write_marker(run_dir, rec.run_uid, store.uri, store.experiment, rid,
                          store.experiment_id, parent_id=parent)
    for sweep, pid in parents.items():
        if not live(sweep):  # a running sweep ends its parent itself
            close_sweep(store, sweep, pid)


def _upload_one(store: Store, rec: RunRecord, run_dir: Path, parent_of, counts: dict) -> None:
    """One claimed run: uploaded unless in the store already (by its marker or run_uid)."""
    from mlflow.entities import RunStatus

    marker = runs.read(run_dir / runs.MARKER_FILE)
    if _in_store(marker, store.uri, store.experiment):
        counts["present"] += 1  # uploaded by its own process while this sync looked
        return
    sweep = runs.sweep_of(run_dir)
    parent = parent_of(sweep) if sweep else None
    rid = None
    for r in store.find("run_uid", rec.run_uid):
        if RunStatus.is_terminated(RunStatus.from_string(r.info.status)):
            rid = r.info.run_id  # uploaded before; only the marker missed it
            if parent and r.data.tags.get(PARENT_TAG) != parent:
                store.client.set_tag(rid, PARENT_TAG, parent)
        else:
            store.client.delete_run(r.info.run_id)  # a half-done upload: replace it
    if rid:
        counts["present"] += 1
    else:
        rid = runs.upload(store, rec, run_dir, parent, overrides=runs.read_overrides(run_dir))
        counts["uploaded"] += 1
        print(f"uploaded {run_dir} -> run {rid}")
    try:
        runs.write_marker(run_dir, rec.run_uid, store.uri, store.experiment, rid,
                          store.experiment_id, parent_id=parent)
    except OSError as e:  # uploaded; a later sync finds it by its run_uid
        say(f"{refusal(run_dir / runs.MARKER_FILE, e)}: uploaded as run {rid}, without its "
            "marker")
