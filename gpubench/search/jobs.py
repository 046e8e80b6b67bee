"""A sweep's jobs, launched through Hydra's configured launcher, and the records they left."""

from __future__ import annotations

import errno
import logging
import math
import os
from collections import Counter
from pathlib import Path

from gpubench.core import record
from gpubench.core.exits import REJECTED, ExitCode
from gpubench.core.files import damaged
from gpubench.core.record import RunRecord, Status
from gpubench.core.secrets import error_text
from gpubench.core.stats import count
from gpubench.search.manifest import Manifest, reserve_job_dir

log = logging.getLogger("gpubench.sweep")
# a job that failed on these failed for its disk, not its configuration
DISK_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO)
NO_RESULTS = "no results.json"  # a job that left no record, and said nothing of why


class SweepFailed(RuntimeError):
    """A sweep that ends without a measurement to show: one line, passwords masked; `code`: its
    exit status (every job refused as bad input: BAD_INPUT, as one run refused)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(error_text(message))
        self.code = code


def unmeasured(outcomes: Counter, last_error: str | None, where: Path) -> SweepFailed | None:
    """An invocation whose jobs all ran without measuring (out of memory included, or refused
    as bad input) has failed; one that ran none has not (docs/sweeps.md, "When a sweep fails"):
    a gpubench sweep's rule and a grid multirun's (gpubench.cli.callbacks)."""
    if not outcomes or any(s.measured for s in outcomes):
        return None
    counts = ", ".join(f"{n} {'refused as bad input' if s is Status.refused else s}"
                       for s, n in outcomes.items())
    code = ExitCode.BAD_INPUT if set(outcomes) == {Status.refused} else ExitCode.FAILED
    return SweepFailed(f"no job of this sweep measured ({counts}); last error: {last_error}; "
                       f"{where}", code)


def read_job(out_dir: Path, job_error: BaseException | None, rung: record.Rung) -> RunRecord:
    """The record a job left. Failed: a job that raised after measuring, a non-finite
    throughput. Still `running` once the job returned: measured when every phase was saved (it
    died writing its final status), killed when its process is gone, failed otherwise."""
    rec = record.load(out_dir, rung=rung)
    err = f"{type(job_error).__name__}: {job_error}" if job_error else None
    if rec is None:
        if damaged(path := Path(out_dir) / record.RESULTS_FILE):
            log.warning("%s is damaged (not valid JSON): the job counts as failed", path)
        return record.missing(out_dir, err or NO_RESULTS, rung=rung)
    running = rec.status is Status.running
    if running and rec.complete:
        rec.recover(f"its final status was not written ({err or 'the job ended'})")
    elif running and rec.stale:
        rec.mark_dead()
    elif running:
        rec.status = Status.failed
        rec.error = rec.error or "the job ended without finishing its record" + (
            f" ({err})" if err else "")
        if isinstance(job_error, OSError) and job_error.errno in DISK_ERRORS:
            rec.extra["requeue"] = True  # measured again by the next invocation
    elif err and rec.status is Status.ok:
        rec.status, rec.error = Status.failed, err
    if rec.status is Status.ok and not (math.isfinite(rec.throughput) and rec.throughput > 0):
        rec.status, rec.error = Status.failed, rec.error or "measured no throughput"
    return rec


def mark_stale_runs(sweep_dir: Path, told: dict[str, tuple] | None = None) -> int:
    """Settle the records left `running` by a process that no longer exists (mark_dead); one it
    calls killed takes the outcome the study was told for its folder (`told`: dir -> status,
    error: a job that failed writing its record on a full disk). How many stay killed."""
    killed = 0
    for d in record.find_runs(sweep_dir):
        rec = record.load(d)
        if rec is None or not rec.stale:
            continue
        rec.mark_dead()
        if rec.status is Status.killed and str(d) in (told or {}):
            status, error = told[str(d)]
            rec.status, rec.error = Status(status), error or rec.error
        rec.save()
        if rec.status is Status.killed:
            killed += 1
        else:
            log.info("%s: %s", rec.path, rec.extra.get("recovered"))
    if killed:
        log.info("%s left running by a process that died: recorded as killed",
                 count(killed, "run"))
    return killed


class Jobs:
    def __init__(self, launcher, manifest: Manifest, max_failures: int) -> None:
        self.launcher, self.manifest = launcher, manifest
        self.max_failures, self.failures = int(max_failures), 0
        self.returns: list = []
        self.unsaved: OSError | None = None
        self.outcomes: Counter[Status] = Counter()  # this invocation's jobs, by status
        self.last_error: str | None = None

    def launch(self, batch: list[list[str]], labels: list[dict]) -> list[RunRecord]:
        self.raise_unsaved()  # no job is started after sweep.json failed
        rung = record.Rung.of(labels[0].get("rung"))  # one rung per batch (its callers')
        first = reserve_job_dir(self.manifest.sweep_dir, len(batch))
        seen = len(REJECTED)  # jobs run in this process that refuse their config say why here
        # the jobs record their rung (record.RUNG_ENV): the launchers' processes inherit it
        before = os.environ.get(record.RUNG_ENV)
        os.environ[record.RUNG_ENV] = rung.value
        try:
            rets = self.launcher.launch(batch, initial_job_idx=first)
        except Exception as e:  # the launcher itself broke: every job of the batch failed
            log.error("launcher failed: %s", e)
            return self._count([record.missing(self.manifest.sweep_dir / str(first + i),
                                               f"launcher: {type(e).__name__}: {e}", rung=rung)
                                for i in range(len(batch))])
        finally:
            if before is None:
                os.environ.pop(record.RUNG_ENV, None)
            else:
                os.environ[record.RUNG_ENV] = before
        self.returns.append(rets)
        from hydra.core.utils import JobStatus  # Hydra's, loaded: the launcher ran

        out, refused = [], iter(REJECTED[seen:])
        for i, r in enumerate(rets):
            error = r._return_value if r.status == JobStatus.FAILED else None
            out.append(read_job(Path(str(r.hydra_cfg.hydra.runtime.output_dir)), error, rung))
            if out[-1].error == NO_RESULTS and (why := next(refused, None)):
                # its bad input, as it printed it, not "no results.json"
                out[-1].status, out[-1].error = Status.refused, why.line
            self.manifest.jobs.append({"num": first + i, "dir": str(out[-1].dir), **labels[i],
                                       "status": str(out[-1].status)})
        try:
            self.manifest.save()
        except OSError as e:  # a full disk: the caller tells what was measured, then raises
            self.unsaved = e
        return self._count(out)

    def _count(self, recs: list[RunRecord]) -> list[RunRecord]:
        self.outcomes.update(rec.status for rec in recs)
        self.last_error = next((r.error for r in reversed(recs) if r.error), self.last_error)
        return recs

    def check_measured(self) -> None:
        if failed := unmeasured(self.outcomes, self.last_error, self.manifest.path):
            raise failed

    def raise_unsaved(self) -> None:
        """A failed sweep.json write, raised once the study was told what was measured."""
        e, self.unsaved = self.unsaved, None
        if e is not None:
            raise e

    def count_failure(self, what: str, rec: RunRecord) -> None:
        """A crashed job's failure, against max_failures; one refused as bad input is its
        config, not the machine: said, never counted (a max-batch probe past the dataset's size
        alike)."""
        if rec.status is Status.refused:
            log.warning("%s: refused as bad input: %s", what, rec.error)
            return
        self.failures += 1
        log.warning("%s failed (%d of at most %d): %s", what, self.failures, self.max_failures,
                    rec.error)
        if self.failures > self.max_failures:
            self.manifest.update(aborted=f"more than {self.max_failures} failed trials")
            raise SweepFailed(f"{self.failures} failed trials (hydra.sweeper.max_failures="
                              f"{self.max_failures}); last error: {rec.error}")
