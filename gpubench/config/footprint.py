"""Rules of `settings.check_resources`: what a run holds in host RAM, where its stores go."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpubench.config.errors import ConfigError
from gpubench.config.schema import BY_NAME
from gpubench.core.pipe import batches_in_flight
from gpubench.core.stats import count

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database


def check_local_store(key: str, path: Path | None, folder: bool = False,
                      value: str | None = None) -> None:
    """A store on this disk (a sqlite file; a folder with `folder`) that can be made: no file
    where a folder must be (it would fail only when opened, after measuring)."""
    if path is None:
        return
    path = Path(os.path.expanduser(str(path))).absolute()
    shown = value or str(path)
    if not folder and path.is_file() and path.stat().st_size:
        # SQLite writes over a file shorter than its header (a 1-byte notes.db was): kept here
        with open(path, "rb") as f:
            if f.read(16) != SQLITE_HEADER:
                raise ConfigError(key, shown, f"a SQLite database or a new file ({path} holds "
                                  "something else)")
    # the nearest that exists must be a folder (/ at worst: the path is absolute, maybe / itself)
    p = next((p for p in ([path] if folder else []) + list(path.parents) if p.exists()), path)
    if not p.is_dir():
        raise ConfigError(key, shown, f"a path whose folders can be made ({p} is a file)")
    # missing folders are made only under the working directory (as Hydra makes outputs/):
    # elsewhere one is likelier a typo (/hoem/...) than a wish
    cwd = Path.cwd()
    if not path.parent.exists() and cwd not in path.parents:
        raise ConfigError(key, shown, f"a path in an existing folder ({path.parent} does not "
                          f"exist; folders are made only under {cwd})")


def source_size(image_size: int) -> int:  # before the random crop (256 for 224, as ImageNet)
    return int(round(image_size * 8 / 7))


# fake_jpeg's JPEGs measured with PIL (largest of 4, 18 to 1024 px): at most 0.41 bytes per raw
# byte at quality <= 90, 0.77 above, plus a ~600-byte header (dominant below 36 px); with margin.
JPEG_RATIO, JPEG_HEADER_BYTES = {90: 0.45, 100: 0.8}, 1024


def check_memory_sizes(ds: Any, ld: Any, free: int) -> None:
    """The in-memory pools (made before measuring: sizes no machine holds ran until killed) and
    the batches in flight (workers' queue, the step's batch, its pinned copy) against half the
    free RAM (the model, workers and OS need the rest)."""
    size, half = ds.image_size, free // 2
    where = f"on this machine (half of the {free / 2**30:.1f} GiB RAM free)"

    def fit(key: str, n: int, each: int, cut: int, why: str, one: str) -> None:
        """`n` items of `each` bytes in `half`; if not one fits, the side at which `cut` would."""
        if n * each <= half:
            return
        if half < each:
            k = BY_NAME["dataset.image_size"]
            most = max(k.bounds[0], int(size * (half / (cut * each)) ** 0.5))
            raise ConfigError(k.name, size, f"{k.within(most)} {one} {where}")
        raise ConfigError(key, n, f"{BY_NAME[key].within(half // each)} {why} {where}")

    stored = 3 * source_size(size) ** 2  # a uint8 image at its stored size
    if ds.name in ("synthetic", "fake_jpeg"):  # the in-memory pools: uint8 images or JPEGs
        per_image = stored if ds.name == "synthetic" else int(
            stored * JPEG_RATIO[90 if ds.jpeg_quality <= 90 else 100]) + JPEG_HEADER_BYTES
        fit("dataset.num_samples", ds.num_samples, per_image, 1,
            f"for dataset={ds.name} at {size} px", f"for one image of dataset={ds.name}'s pool")
    # a batch as the host holds it: float32 after the host transforms, uint8 if the device augments
    per_sample = stored if ds.augment_on == "device" else 4 * 3 * size * size
    held = 1 if ds.name == "device_synthetic" else batches_in_flight(
        ld.num_workers, ld.prefetch_factor) + 2
    # when not one batch fits, the image size is what to lower, for the batch size asked for
    fit("loader.batch_size", ld.batch_size, held * per_sample, ld.batch_size,
        f"at {size} px with {count(held, 'batch', 'batches')} in host memory at once",
        f"with loader.batch_size={ld.batch_size}")
