"""Under torchrun: 2 processes (gloo on CPU), DistributedDataParallel, a sharded loader; one
results.json from rank 0 with the run's throughput summed over ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import TINY

pytestmark = pytest.mark.slow


def test_torchrun_two_ranks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "gpubench", *TINY, "bench.steps=4", "hydra.run.dir=outputs/ddp"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("narrowest pipe:") == 1  # only rank 0 reports
    data = json.loads((tmp_path / "outputs" / "ddp" / "results.json").read_text())
    assert data["status"] == "ok" and data["world_size"] == 2
    for name in ("loader", "compute", "e2e"):
        ph = data["phases"][name]
        ranks = ph["ranks_images_per_sec"]
        assert len(ranks) == 2 and all(r > 0 for r in ranks)
        # all images over the slowest rank's window: at most the sum of the ranks' own rates
        assert ph["images"] == 2 * 4 * 4
        assert 0 < ph["images_per_sec"] <= sum(ranks) * 1.0001
        assert ph["images_per_sec"] >= 2 * min(ranks) * 0.9999
