"""A loader-only multirun (`-m 'bench.phases=[loader]' loader.num_workers=0,1,2,4,8`) measures its
compute bound once per setup (analysis.workers.compute_setup): the first job of a setup to take
`<sweep>/compute/<setup>.claim` (a file lock held until its process ends, taken over from a dead
claimer) measures compute alone into `<sweep>/compute/<setup>/`, for report.loader_answer. Not
under torchrun (every rank would have to), nor outside a multirun (`--compute RUN` there)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gpubench.analysis.workers import COMPUTE_DIR, compute_dir_name, compute_setup
from gpubench.core.files import check_no_links, read_json, try_lock
from gpubench.core.record import BOUNDS_MEASURED_ENV, RESULTS_FILE, RunRecord, Status
from gpubench.core.stats import Est

# the claims this process holds until it ends (the basic launcher's later jobs find them held)
_CLAIMS: list = []


def claim(phases, record: RunRecord, distributed: bool) -> Path | None:
    """Where this job measures its setup's compute bound, if it is the first to claim it."""
    if (tuple(phases) != ("loader",) or record.status is not Status.ok or distributed
            or os.environ.get(BOUNDS_MEASURED_ENV)):  # sweep=pipes measured it in its compute pipe
        return None
    from hydra.core.hydra_config import HydraConfig  # hydra's state, read only inside a job
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return claim_in(Path(HydraConfig.get().sweep.dir).resolve(), record)


def claim_in(sweep: Path, record: RunRecord) -> Path | None:
    """`<sweep>/compute/<setup>` for the first caller of this record's setup, else None."""
    name = compute_dir_name(compute_setup(record.knob, record.env.get("device")))
    root = sweep / COMPUTE_DIR
    root.mkdir(exist_ok=True)
    check_no_links(root, sweep)  # nothing claimed or written through a link out of the sweep
    if Status.read((read_json(root / name / RESULTS_FILE) or {}).get("status"), Status.running
                   ) is not Status.running:
        return None  # measured (a resumed sweep)
    lock = try_lock(root / f"{name}.claim", f"{record.dir}\n")
    if lock is None:
        return None  # being measured by another job
    _CLAIMS.append(lock)
    return root / name


def compute_config(cfg: DictConfig) -> DictConfig:  # the job's, measuring compute alone
    c = copy.deepcopy(cfg)
    OmegaConf.set_readonly(c, False)
    OmegaConf.update(c, "bench.phases", ["compute"])
    return c


def line(record: RunRecord) -> str:
    """What the job prints once the bound is measured (or why it is not)."""
    rate = Est.of(record.compute_images_per_sec, record.compute_images_per_sec_ci)
    if record.status is not Status.ok or rate is None:
        return (f"gpubench: the sweep's compute bound was not measured ({record.status}: "
                f"{record.error or 'no compute figure'}); {record.dir}")
    return (f"gpubench: compute bound for this sweep's workers answer: {rate} img/s, "
            f"measured once for this setup: {record.dir}")
