"""A sweep's outcome as report rows: its Optuna studies' trials, else its job folders."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpubench.analysis.recommend import Recommendation, Row, latest_per_setup, recommend
from gpubench.analysis.select import training_rows, where
from gpubench.config.knobs import KEYS
from gpubench.core.files import damaged
from gpubench.core.record import RESULTS_FILE, Rung, RunRecord, Status, find_runs, load, missing
from gpubench.core.secrets import error_text, without_masked_password
from gpubench.search.manifest import MANIFEST, problem
from gpubench.search.manifest import read as read_manifest

log = logging.getLogger("gpubench")


def load_dir(sweep_dir: Path) -> tuple[list[Row], Any]:
    """Rows of a sweep dir and its Optuna study (None for grid sweeps and max-batch searches)."""
    manifest, why = read_manifest(sweep_dir), problem(sweep_dir)
    if why is not None:
        log.warning("%s is damaged (%s)%s", sweep_dir / MANIFEST, why,
                    f": reading study {manifest['study_name']}, which it still names"
                    if manifest.get("study_name") and manifest.get("storage") else
                    ": reading the job folders")
    pipes = bool(manifest.get("studies"))  # sweep=pipes: a study per stage
    names = manifest.get("studies") or [manifest.get("study_name")]
    if names[0] and manifest.get("storage"):
        import optuna

        from gpubench.search.study import open_storage

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        base = manifest.get("pipes_study") or ""
        try:
            # sweep.json holds the URL masked: the driver takes the password from the environment
            store = open_storage(without_masked_password(manifest["storage"]))
            rows, main = [], None
            for name in names:  # of sweep=pipes, a row's `trial` names its stage (`compute-3`)
                stage = name.removeprefix(base).lstrip("-") if pipes else None
                is_main = stage in (None, "join")  # the join's (or the only) study
                study = optuna.load_study(study_name=name, storage=store)
                for _, r in trial_rows(study, store, "" if is_main else f"{stage}-"):
                    r.stage = stage
                    rows.append(r)
                main = study if is_main else main
            return rows, main
        except Exception as e:  # a moved or deleted database: the files are still here
            log.warning("%s not readable (%s): reading the files", f"studies of {sweep_dir}"
                        if pipes else f"study {names[0]}", error_text(e))
    # each job by its sweep's manifest: this folder's, or (a folder of several sweeps) the one of
    # the sweep below it that holds the job; a trial is known only within its own sweep
    jobs = {j["dir"]: (sweep_dir, j) for j in manifest.get("jobs", [])}
    for m in sweep_dir.glob(f"*/**/{MANIFEST}"):
        jobs |= {j["dir"]: (m.parent, j) for j in read_manifest(m.parent).get("jobs", [])
                 if j.get("dir") not in jobs}

    def trial_of(job: tuple) -> tuple | None:  # (its sweep, its trial); None: no trial named
        return None if job[1].get("trial") is None else (job[0], job[1]["trial"])

    # a trial measured in full also left its screen's folder: one row per trial
    measured_in_full = {trial_of(j) for j in jobs.values()
                        if Rung.of(j[1].get("rung")) is Rung.full} - {None}
    rows, confirms, full_rows = [], {}, {}
    for d in sorted(find_runs(sweep_dir),
                    key=lambda d: (0, int(d.name), "") if d.name.isdigit() else (1, 0, str(d))):
        job = jobs.get(str(d), (sweep_dir, {}))
        trial = trial_of(job)
        rec = load(d, job[1].get("rung"))
        if rec is None and damaged(d / RESULTS_FILE):
            log.warning("%s is damaged (not valid JSON): not in the report", d / RESULTS_FILE)
        if (rec is None or not rec.status.final
                or rec.rung is Rung.screen and trial in measured_in_full):
            continue
        # pooled into its trial's row, not a row of its own; one whose trial no manifest names
        # stays a row of its own rather than join another sweep's run
        if rec.rung is Rung.confirm and trial is not None:
            confirms.setdefault(trial, []).append(rec)
            continue
        rows.append(Row(d.name, rec))  # a run's own folder reported: its name
        if rec.rung is Rung.full and trial is not None:
            full_rows[trial] = rows[-1]
    for trial in confirms.keys() & full_rows.keys():
        full_rows[trial].confirms = confirms[trial]
    return rows, None


def record_keys(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's params under the keys a record's config flattens to (a group's choice
    `precision` is `precision.name`), so the row shares the ranking's columns."""
    return {f"{k}.name" if f"{k}.name" in KEYS else k: v for k, v in params.items()}


def trial_rows(study, storage, prefix: str = "") -> list[tuple[Any, Row]]:
    """(trial, row) for every measured trial, its confirm rounds' records attached (`storage`: a
    URL or object). A row is labelled by its job folder's name, as a user finds it on disk; its
    `trial` is `prefix` + the trial number (the label too without a folder)."""
    from optuna.trial import TrialState

    from gpubench.search.study import confirm_dirs, measured_trials

    out, from_study = [], []
    confirms = confirm_dirs(study.study_name, storage)
    for t in measured_trials(study):
        a = t.user_attrs
        trial = f"{prefix}{t.number}"
        label = Path(a["dir"]).name if a.get("dir") else trial
        rung = Rung.screen if t.state == TrialState.PRUNED else Rung.of(a.get("rung") or Rung.full)
        rec = load(a["dir"], rung) if a.get("dir") else None
        if rec is None and a.get("dir") and damaged(path := Path(a["dir"]) / RESULTS_FILE):
            log.warning("%s is damaged (not valid JSON): trial %d's row is what the study kept "
                        "(status %s, %s img/s)", path, t.number, a.get("status"),
                        a.get("throughput"))
        if rec is not None:
            row = Row(label, rec, trial=trial)
        else:  # its folder is gone: what the study kept
            told = Status.failed if t.state == TrialState.FAIL else Status.ok
            rec = RunRecord(status=Status.read(a.get("status", told), Status.failed),
                            images_per_sec=a.get("throughput"),
                            peak_memory_fraction=a.get("peak_memory_fraction"),
                            memory_ceiling=float(a.get("memory_ceiling") or 1.0), rung=rung,
                            error=a.get("error"))
            row = Row(label, rec, record_keys(t.params), trial=trial)
            from_study.append(row)
        # a confirm folder gone missing counts as a round that did not measure
        row.confirms = [load(d, Rung.confirm) or missing(d, "confirm record gone", Rung.confirm)
                        for d in confirms.get(t.number, ())]
        out.append((t, row))
    # the study keeps swept keys only: the fixed ones are those of a trial whose record is there
    fixed = next((r.flat for _, r in out if r.record.config), None)
    for r in from_study if fixed else ():
        r.flat = {**fixed, **r.flat}
    return out


def setups(sweep_dir: Path, conditions: dict[str, str] | None = None):
    """(the rows a sweep dir's report ranks from, its study): one per setup matching
    `conditions`, as an MLflow experiment's report ranks (a grid folder's repeats pooled)."""
    rows, study = load_dir(Path(sweep_dir).resolve())
    return latest_per_setup(where(rows, conditions or {})), study


def recommendation(sweep_dir: Path) -> Recommendation | None:
    """What the report of a sweep dir recommends (the rows it ranks, then `recommend`)."""
    return recommend(training_rows(setups(sweep_dir)[0])[0])
