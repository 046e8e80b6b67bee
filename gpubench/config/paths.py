"""Where gpubench's own Hydra configs are: an absolute folder, found once at import."""

from __future__ import annotations

from pathlib import Path


def _config_dir() -> Path:
    # Absolute, so `python -m gpubench` works from any directory (a relative config_path is
    # resolved as `pkg://conf` under `python -m` and fails). In a checkout the YAMLs are
    # ../../conf; in a wheel they are packaged as gpubench/conf.
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "bench.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"gpubench configs not found next to {here}")


CONFIG_DIR = _config_dir()
