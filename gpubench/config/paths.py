"""Where gpubench's own Hydra configs are: an absolute folder, found once at import."""

from __future__ import annotations

from pathlib import Path


def _config_dir() -> Path:
    # Absolute: under `python -m` a relative config_path resolves as `pkg://conf` and fails.
    # A checkout has ../../conf, a wheel gpubench/conf.
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "bench.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"gpubench configs not found next to {here}")


CONFIG_DIR = _config_dir()
