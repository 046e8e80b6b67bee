"""A loader-only multirun measures its compute bound itself, once per setup.

`python -m gpubench -m 'bench.phases=[loader]' loader.num_workers=0,1,2,4,8` asks how many
workers out-run compute, so the report needs a compute measurement at the same setup
(gpubench.analysis.workers.compute_setup: model, image size, batch size, precision, ...). The
first loader-only job of each setup to finish in the multirun measures it: after its own loader
run, it creates `<sweep dir>/compute/<setup>.claim` (O_EXCL: of jobs running in parallel,
exactly one gets it) and measures the compute phase alone, with its own config but
`bench.phases=[compute]`, into `<sweep dir>/compute/<setup>/`. The report pools what it finds
there into the bound (gpubench.report.loader_answer).

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

from gpubench.analysis.workers import COMPUTE_DIR, Rate, compute_dir_name, compute_setup
from gpubench.core.files import check_no_links
from gpubench.core.record import BOUNDS_MEASURED_ENV, RunRecord, Status


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
    """`<sweep>/compute/<setup>` for the first caller of this record's compute setup (the claim
    file is created with O_EXCL: one winner among parallel jobs); None for every later one."""
    name = compute_dir_name(compute_setup(record.knob, record.env.get("device")))
    root = sweep / COMPUTE_DIR
    root.mkdir(exist_ok=True)
    check_no_links(root, sweep)  # nothing claimed or written through a link out of the sweep
    try:
        fd = os.open(root / f"{name}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another job of this setup measures it, or has
        return None
    with os.fdopen(fd, "w") as f:
        f.write(f"{record.dir}\n")
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
    rate = Rate.of(record.compute_images_per_sec, record.compute_images_per_sec_ci)
    if record.status is not Status.ok or rate is None:
        return (f"gpubench: the sweep's compute bound was not measured ({record.status}: "
                f"{record.error or 'no compute figure'}); {record.dir}")
    return (f"gpubench: compute bound for this sweep's workers answer: {rate.text()} img/s, "
            f"measured once for this setup: {record.dir}")
