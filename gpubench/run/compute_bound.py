"""A loader-only multirun measures its compute bound itself, once per setup.

`python -m gpubench -m 'bench.phases=[loader]' loader.num_workers=0,1,2,4,8` asks how many
workers out-run compute, so the report needs a compute measurement at the same setup
(gpubench.analysis.workers.compute_setup: model, image size, batch size, precision, ...). The
first loader-only job of each setup to finish in the multirun measures it: after its own loader
run, it takes `<sweep dir>/compute/<setup>.claim` (a file lock: of jobs running in parallel,
exactly one gets it) and measures the compute phase alone, with its own config but
`bench.phases=[compute]`, into `<sweep dir>/compute/<setup>/`. The report pools what it finds
there into the bound (gpubench.report.loader_answer). The claim is held until the job's process
ends; a later job of the setup leaves it while it is held or once the setup is measured, and
takes it over from a claimer that died mid-measurement (the kernel released its lock).

After the loader run, not before: with Hydra's sequential launcher nothing else runs while it
measures (parallel jobs on one device disturb each other anyway). Not under torchrun (the
ranks would all have to measure it), and not outside a Hydra multirun: a single loader-only
run is measured as asked, and `python -m gpubench.report DIR --compute RUN` names a bound.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from gpubench.analysis.workers import COMPUTE_DIR, compute_dir_name, compute_setup
from gpubench.core.files import check_no_links, read_json, try_lock
from gpubench.core.record import BOUNDS_MEASURED_ENV, RESULTS_FILE, RunRecord, Status
from gpubench.core.stats import Est

# the claims this process holds: released when it ends (a job of the basic launcher shares its
# process with the later jobs, which then find the claim held and leave it)
_CLAIMS: list = []


def _sweep_dir() -> Path | None:
    """The multirun's sweep dir; None outside a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig  # hydra's state, read only inside a job
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    return Path(hc.sweep.dir).resolve()


def claim(phases, record: RunRecord, distributed: bool) -> Path | None:
    """The folder where this job measures its setup's compute bound, when it is a loader-only
    job of a multirun that measured, and the first of its setup to claim it; None otherwise."""
    if tuple(phases) != ("loader",) or record.status is not Status.ok or distributed:
        return None
    if os.environ.get(BOUNDS_MEASURED_ENV):  # sweep=pipes measured it in its compute pipe
        return None
    sweep = _sweep_dir()
    return None if sweep is None else claim_in(sweep, record)


def claim_in(sweep: Path, record: RunRecord) -> Path | None:
    """`<sweep>/compute/<setup>` for the first caller of this record's compute setup; None for
    every later one (see the module docstring)."""
    name = compute_dir_name(compute_setup(record.knob, record.env.get("device")))
    root = sweep / COMPUTE_DIR
    root.mkdir(exist_ok=True)
    check_no_links(root, sweep)  # nothing claimed or written through a link out of the sweep
    status = (read_json(root / name / RESULTS_FILE) or {}).get("status", Status.running.value)
    lock = try_lock(root / f"{name}.claim", f"{record.dir}\n") if status == Status.running.value else None
    if lock is None:
        return None  # measured (a resumed sweep), or being measured by another job
    _CLAIMS.append(lock)
    return root / name


def compute_config(cfg: DictConfig) -> DictConfig:
    """The job's config measuring the compute phase alone."""
    c = copy.deepcopy(cfg)
    OmegaConf.set_readonly(c, False)
    with open_dict(c):
        c.bench.phases = ["compute"]
    return c


def line(record: RunRecord) -> str:
    """What the job prints once the bound is measured (or why it is not)."""
    rate = Est.of(record.compute_images_per_sec, record.compute_images_per_sec_ci)
    if record.status is not Status.ok or rate is None:
        return (f"gpubench: the sweep's compute bound was not measured ({record.status}: "
                f"{record.error or 'no compute figure'}); {record.dir}")
    return (f"gpubench: compute bound for this sweep's workers answer: {rate} img/s, "
            f"measured once for this setup: {record.dir}")
