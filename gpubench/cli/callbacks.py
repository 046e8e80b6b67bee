"""Hydra callback: a multirun is one MLflow parent run with a child per job, made in the launching
process before any job (parallel jobs would race to create a sqlite store), found by PARENT_ENV or
the sweep dir's parent file; folders not to write into are refused (`own_folder`). MLflow is
loaded only for a tracked sweep: every run imports this module."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpubench.cli.signals import killed_by_signal
from gpubench.config.errors import ConfigError
from gpubench.core.exits import REJECTED, Refusal
from gpubench.core.files import LinkError, check_no_links, mask_files
from gpubench.core.record import RESULTS_FILE, Status, find_runs, load
from gpubench.core.secrets import mask_logging, say
from gpubench.search.jobs import unmeasured

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
# __main__.cli's exit code: a sweep parent closed at exit is KILLED after a signal, else FAILED
EXIT: dict[str, int | None] = {}
CLOSE_GRACE_S = 5.0  # beyond tracking.timeout_s, for closing a sweep's parent at exit
_STARTED: dict[str, float] = {}  # each sweep's start (a report made since was printed already)
# its jobs always take new numbered folders (search.manifest reserve_job_dir): a sweep folder
# holding runs is resumed; the other sweepers number their jobs from 0 every time
RESUMING_SWEEPER = "hydra_plugins.gpubench_sweeper.sweeper.GpubenchSweeper"

log = logging.getLogger("gpubench")


def _tracked(config: DictConfig) -> bool:
    return config.get("tracking", {}).get("backend", "none") != "none"


def _sweep_dir(config: DictConfig) -> Path:
    # the same folder the launcher uses: ${now:...} is resolved once per process and cached
    return Path(str(config.hydra.sweep.dir)).absolute()


def own_folder(key: str, value: Any, resumes: bool = False) -> Path:
    """A run's or sweep's folder, before run_job writes `.hydra/*.yaml`: not blank, no symbolic
    link, no earlier run to write over (a sweep's unless `resumes`). Else one line, exit 2 (a
    SystemExit: Hydra turns a callback's Exception into a warning)."""
    if value is None or not str(value).strip():
        raise SystemExit(ConfigError(key, value, "a folder path (blank writes into the current "
                                     f"folder); leave {key} unset for a new timestamped folder"))
    folder = Path(str(value)).absolute()
    try:
        check_no_links(folder)
    except LinkError as e:
        raise SystemExit(ConfigError(key, str(folder),
                                     f"a folder holding no symbolic link ({e})")) from None
    if key == "hydra.run.dir":
        earlier = [folder] if (folder / RESULTS_FILE).exists() else []
    else:
        earlier = [] if resumes else find_runs(folder)
    if earlier:
        why = "" if key == "hydra.run.dir" else ": this sweeper numbers its jobs from 0"
        raise SystemExit(ConfigError(key, str(folder), (
            f"a folder holding no earlier run ({earlier[0] / RESULTS_FILE} is one, never written "
            f"over{why}); leave {key} unset for a new timestamped folder, or move that run away")))
    return folder


class MlflowSweepCallback(Callback):
    # Hydra's launchers log each job's overrides (a URI with its password): masked from the start
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        own_folder("hydra.run.dir", config.hydra.run.dir)
        mask_logging()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra has just saved the job's config and overrides (the sweeper its multirun.yaml)
        hc = config.get("hydra") or {}
        out, sub = hc.get("runtime", {}).get("output_dir"), hc.get("output_subdir")
        files = [Path(str(out), str(sub), f) for f in HYDRA_FILES] if out and sub else []
        if str(getattr(hc.get("mode"), "name", hc.get("mode"))) == "MULTIRUN":
            files.append(_sweep_dir(config) / "multirun.yaml")
        mask_files(files)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        resumes = OmegaConf.select(config, "hydra.sweeper._target_") == RESUMING_SWEEPER
        sweep_dir = own_folder("hydra.sweep.dir", config.hydra.sweep.dir, resumes)
        mask_logging()
        _STARTED[str(sweep_dir)] = time.time()
        REJECTED.clear()  # this multirun's refusals only (_fail_unmeasured)
        if not _tracked(config):
            return
        from gpubench import tracking

        t, uri = config.tracking, tracking.resolve_uri(config.tracking.uri)
        tracking.mark_ended(sweep_dir, False)  # until on_multirun_end: `sync` then knows
        try:
            with tracking.open_store(uri, t.experiment, float(t.timeout_s)) as store:
                # as written: iterating the node resolves an override's ${oc.env:...}
                rid = tracking.open_sweep(store, sweep_dir, OmegaConf.to_container(config.hydra),
                                          t.get("run_name"))
        except Exception as e:  # jobs still run; each keeps its results for `sync`
            log.debug("MLflow parent run not created", exc_info=True)
            say(f"MLflow not reached at tracking.uri={uri} ({e}); the sweep runs untracked")
            return
        os.environ[tracking.PARENT_ENV] = rid
        # on_multirun_end runs only when the sweep returns: an interrupt or error would leave the
        # parent RUNNING. atexit runs on every exit but kill -9, after the killed job is logged.
        self._open = (sweep_dir, rid, uri, str(t.experiment), float(t.timeout_s))
        atexit.register(self._close_interrupted)

    def _close_interrupted(self) -> None:
        """A parent that never reached on_multirun_end ends KILLED or FAILED (EXIT), in bounded
        time: a server that is down must not hold the exit (a scheduler's grace is short)."""
        open_, self._open = getattr(self, "_open", None), None
        if open_ is None:
            return
        from gpubench import tracking

        sweep_dir, rid, uri, experiment, timeout_s = open_
        code = EXIT.get("code")
        status = "KILLED" if code is None or killed_by_signal(code) else "FAILED"
        failed: list[BaseException] = []

        def close() -> None:
            try:
                with tracking.open_store(uri, experiment, timeout_s) as store:
                    tracking.close_sweep(store, sweep_dir, rid, interrupted=True, status=status)
            except BaseException as e:
                failed.append(e)

        # a daemon thread, not concurrent.futures: its executors refuse work inside atexit
        # ("can't register atexit after shutdown", Python 3.9+) and would hold the exit
        th = threading.Thread(target=close, name="gpubench-close-sweep", daemon=True)
        th.start()
        limit, why = timeout_s + CLOSE_GRACE_S, None
        try:
            th.join(1.0)
            if th.is_alive():
                print(f"gpubench: closing the sweep's MLflow parent run (at most {limit:.0f} s; "
                      "Ctrl-C skips it)", file=sys.stderr, flush=True)
                th.join(limit - 1.0)
            if th.is_alive():
                why = f"no answer from tracking.uri in {limit:.0f} s"
            elif failed:
                why = str(failed[0]) or type(failed[0]).__name__
        except KeyboardInterrupt:
            why = "skipped"
        if why is not None:
            say(f"the sweep's MLflow parent run was not closed ({why}); "
                f"{tracking.runs.sync_command(sweep_dir, uri)}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from gpubench import tracking

        parent_id = os.environ.pop(tracking.PARENT_ENV, None)
        self._open = None  # the sweep returned: closed FINISHED below, not at exit
        sweep_dir = _sweep_dir(config)
        t = config.tracking if _tracked(config) else None
        uri = tracking.resolve_uri(t.uri) if t is not None else None
        # tracked or not, the sweep's runs compared as `python -m gpubench.report` does, unless
        # the gpubench sweeper was told not to (its workers on one study would each report)
        wanted = OmegaConf.select(config, "hydra.sweeper.report", default=True) is not False
        attach = bool(parent_id) and t is not None
        try:
            files = _sweep_report(sweep_dir, attach, _refused(config)) if wanted else []
            if files and attach:
                tracking.log_sweep_files(sweep_dir, parent_id, files, float(t.timeout_s), uri)
        except Exception as e:  # a report that fails must not keep the sweep open
            log.debug("sweep report failed", exc_info=True)
            say(f"sweep report not made ({e})")
        if t is not None:
            tracking.mark_ended(sweep_dir, True)  # a resumed sweep that got here ends FINISHED
        try:
            if attach:
                with tracking.open_store(uri, t.experiment, float(t.timeout_s)) as store:
                    tracking.close_sweep(store, sweep_dir, parent_id, interrupted=False)
                # the sweep's own page (its best run, report), after the jobs' links
                log.info("MLflow sweep %s: %s", parent_id,
                         tracking.store.ui_hint(uri, store.experiment_id, parent_id))
        except Exception as e:  # the jobs are tracked; only the summary is missing
            log.debug("MLflow parent run not closed", exc_info=True)
            say(f"sweep summary not logged to MLflow ({e}); "
                f"{tracking.runs.sync_command(sweep_dir, uri)}")
        _fail_unmeasured(sweep_dir)


def _fail_unmeasured(sweep_dir: Path) -> None:
    """A grid multirun whose jobs since it began (not a reused folder's older runs) were all
    unmeasured (search.jobs.unmeasured): one line, exit 1, after the report and MLflow parent."""
    since = _STARTED.get(str(sweep_dir), float("inf"))
    recs = [r for d in find_runs(sweep_dir) if (d / RESULTS_FILE).stat().st_mtime >= since
            and (r := load(d)) is not None]
    # a job refused as bad input left no record: its line is what this process was told
    last = next((r.error for r in reversed(recs) if r.error), None) or next(
        (r.line for r in reversed(REJECTED)), None)
    outcomes = Counter(r.status for r in recs) + Counter({Status.refused: len(REJECTED)})
    if failed := unmeasured(outcomes, last, sweep_dir):
        say(str(failed), "error")
        # SystemExit: Hydra makes a callback's Exception a warning (the multirun would end 0)
        raise SystemExit(failed.code)


def _refused(config: DictConfig) -> list[Refusal]:
    """This multirun's refused jobs by the overrides setting them apart: the command line's
    common ones left out, unless they are all a job has."""
    task = OmegaConf.select(config, "hydra.overrides.task", default=None)
    common = set(map(str, OmegaConf.to_container(task) if task is not None else ()))
    return [Refusal(tuple(o for o in r.overrides if o not in common) or r.overrides, r.line)
            for r in REJECTED]


def _sweep_report(sweep_dir: Path, attach: bool, refused: list[Refusal]) -> list[Path]:
    """The sweep report's files (the parent's artifacts when `attach`), naming `refused` jobs;
    quiet, and only to attach, where the gpubench sweeper made it since the sweep began."""
    from gpubench.report.write import REPORT_DIR, sweep_report

    made = sweep_dir / REPORT_DIR / "summary.json"
    quiet = made.is_file() and made.stat().st_mtime >= _STARTED.get(str(sweep_dir), float("inf"))
    if quiet and not attach:
        return []
    return [Path(f) for f in sweep_report(sweep_dir, quiet=quiet, refused=refused)
            if Path(f).is_file()]
