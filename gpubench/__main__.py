"""`python -m gpubench` / `gpubench`: the only @hydra.main, kept thin.

It hands the composed config to `run_benchmark` and returns the e2e images/sec as a finite
float, so any Hydra sweeper can maximize it.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from gpubench.config import CONFIG_DIR, ConfigError
from gpubench.errors import compact_compose_errors, release_stderr


def _multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="bench")
def main(cfg: DictConfig) -> float:
    release_stderr()
    from gpubench.runner import run_benchmark

    try:
        result = run_benchmark(cfg)
    except ConfigError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"gpubench: error: {e}", file=sys.stderr)
        if _multirun():  # one bad job must not end a sweep
            return 0.0
        sys.exit(2)
    if result.status in ("oom", "failed") and not _multirun():
        sys.exit(1)
    if result.tracked is False and not _multirun():  # measured and kept, but not in MLflow
        sys.exit(3)
    return result.objective


def cli() -> None:
    with compact_compose_errors():
        main()


if __name__ == "__main__":
    cli()
