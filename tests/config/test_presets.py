"""Presets and examples are sized so that their own windows are valid: a loader window holds
more batches than the workers keep in flight under every worker count the sweep it is sold with
tries (else the loader phase times the prefetch queue, and the run flags itself)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from gpubench.config.paths import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "examples" / "team_conf"


def _choices(sweep_yaml: Path, key: str) -> list[int]:
    params = yaml.safe_load(sweep_yaml.read_text())["hydra"]["sweeper"]["params"]
    m = re.fullmatch(r"choice\((.*)\)", str(params.get(key, "")))
    return [int(v) for v in m.group(1).split(",")] if m else []


@pytest.mark.parametrize("search_path, experiment, sweep", [
    ([], "cpu_smoke", CONFIG_DIR / "sweep" / "throughput.yaml"),
    ([f"hydra.searchpath=[file://{TEAM}]"], "team_smoke", TEAM / "sweep" / "team_loader.yaml"),
])
def test_a_presets_loader_windows_outlast_the_batches_in_flight(search_path, experiment, sweep):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose("bench", overrides=[*search_path, f"experiment={experiment}"])
    workers = _choices(sweep, "loader.num_workers") or [cfg.loader.num_workers]
    prefetch = _choices(sweep, "loader.prefetch_factor") or [cfg.loader.prefetch_factor or 2]
    in_flight = max(workers) * max(prefetch)
    per_window = math.ceil(cfg.bench.steps / cfg.bench.repeats)
    assert per_window >= in_flight, (
        f"{experiment}: {per_window} steps per window < {in_flight} batches in flight "
        f"({max(workers)} workers x {max(prefetch)} prefetched)")


def test_gpubench_s_own_files_leave_no_value_to_set():
    """prechecks.check_team_files reads a team's files only: a `???` in gpubench's own would run
    at the schema's default unseen."""
    marked = [str(f.relative_to(CONFIG_DIR)) for f in CONFIG_DIR.rglob("*.yaml")
              if "???" in f.read_text()]
    assert marked == []
