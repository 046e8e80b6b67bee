"""dataset=custom: the team's own Dataset (and transform, collate) through the loader, compute and
e2e phases unchanged; the sample contract's one-line errors; the worked examples/team_conf run
through `python -m gpubench --config-dir` as a team keeps it in its own repo."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli
from torch.utils.data import Dataset

from gpubench.config.errors import ConfigError
from gpubench.run.runner import measure_run

TEAM_CONF = ROOT / "examples" / "team_conf"
HERE = "test_custom_data"  # this module, importable by dotted path (tests/ is on sys.path)


class HWCUint8(Dataset):
    """Decoded pixels as numpy HWC uint8 (what PIL/cv2 give), numpy int labels."""

    def __init__(self, n: int = 24, size: int = 20, num_classes: int = 10):
        rng = np.random.default_rng(0)
        self.x = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.y = rng.integers(0, num_classes, n)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class CHWFloat(Dataset):
    def __init__(self, n: int = 16, size: int = 16):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.rand(3, self.size, self.size), torch.tensor(i % 3)


class Broken(Dataset):
    """Breaks the contract the way `kind` says, from sample `from_index` on."""

    def __init__(self, kind: str, from_index: int = 0, n: int = 16):
        self.kind, self.from_index, self.n = kind, from_index, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img, label = torch.zeros(3, 16, 16, dtype=torch.uint8), 1
        if i < self.from_index:
            return img, label
        return {
            "dict": {"image": img, "label": label},
            "triple": (img, label, "extra"),
            "float_label": (img, 0.5),
            "big_label": (img, 99),
            "gray": (torch.zeros(16, 16, dtype=torch.uint8), label),
            "float_hwc": (torch.zeros(16, 16, 3), label),
            "int64_image": (torch.zeros(3, 16, 16, dtype=torch.int64), label),
        }[self.kind]


def scale_only(image):
    """A team transform: a fixed-size float CHW, no augmentation."""
    x = image.float() / 255 if image.dtype == torch.uint8 else image
    return torch.nn.functional.interpolate(x[None], size=(16, 16))[0]


def collate_pairs(batch):
    xs, ys = zip(*batch, strict=True)
    collate_pairs.calls = getattr(collate_pairs, "calls", 0) + 1
    return torch.stack(xs), torch.as_tensor(ys)


def custom(*extra, target=f"{HERE}.HWCUint8"):
    return ("dataset=custom", f"dataset._target_={target}", *extra)


def phases_measured(result) -> dict:
    data = json.loads(result.path.read_text())
    assert data["status"] == "ok", data.get("error")
    return {n: p["images_per_sec"] for n, p in data["phases"].items()}, data


def test_team_dataset_runs_through_all_three_phases(compose_cfg, tmp_path):
    result = measure_run(compose_cfg(*custom("+dataset.kwargs.n=20", "+dataset.kwargs.size=24")),
                         tmp_path)
    ips, data = phases_measured(result)
    assert set(ips) == {"loader", "compute", "e2e"} and all(v > 0 for v in ips.values())
    assert data["data_info"]["target"] == f"{HERE}.HWCUint8"
    assert data["data_info"]["transform"] == "gpubench" and data["data_info"]["samples"] == 20


def test_team_transform_and_collate_replace_gpubench_s(compose_cfg, tmp_path):
    collate_pairs.calls = 0
    cfg = compose_cfg(*custom(f"+dataset.transform._target_={HERE}.scale_only",
                              "+dataset.transform._partial_=true",
                              f"+dataset.collate._target_={HERE}.collate_pairs",
                              "+dataset.collate._partial_=true", target=f"{HERE}.CHWFloat"))
    ips, data = phases_measured(measure_run(cfg, tmp_path))
    assert set(ips) == {"loader", "compute", "e2e"}
    assert data["data_info"]["transform"] == f"{HERE}.scale_only"
    assert collate_pairs.calls > 0  # the loader used the team's collate (workers=0: here)


@pytest.mark.parametrize("knob", ["dataset.preload=true", "dataset.augment_on=device"])
def test_preload_and_device_augment_work_on_the_default_transform(compose_cfg, tmp_path, knob):
    ips, data = phases_measured(measure_run(compose_cfg(*custom(knob)), tmp_path))
    assert set(ips) == {"loader", "compute", "e2e"} and ips["e2e"] > 0
    if "preload" in knob:
        assert data["data_info"]["preload_bytes"] > 0
    else:
        assert data["data_info"]["augment_on"] == "device"


@pytest.mark.parametrize("kind,says", [
    ("dict", "returned dict; expected (image, label)"),
    ("triple", "of length 3"),
    ("float_label", "label is float"),
    ("big_label", "label 99 is outside [0, 10)"),
    ("gray", "image is Tensor (16, 16) torch.uint8"),
    ("float_hwc", "a float image must be CHW"),
    ("int64_image", "torch.int64"),
])
def test_sample_contract_broken_is_one_line_before_work(compose_cfg, tmp_path, kind, says):
    cfg = compose_cfg(*custom(f"+dataset.kwargs.kind={kind}", target=f"{HERE}.Broken"))
    with pytest.raises(ConfigError) as e:
        measure_run(cfg, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"dataset._target_='{HERE}.Broken'")
    assert says in msg and "Broken[0]" in msg
    assert not (tmp_path / "results.json").exists()  # nothing measured, nothing left


@pytest.mark.parametrize("extra,key", [
    ((), "dataset._target_=null"),
    (("dataset._target_=no_such_team.data.X",), "dataset._target_='no_such_team.data.X'"),
    ((f"dataset._target_={HERE}.HWCUint8", "+dataset.kwargs.bogus=1"), "dataset.kwargs="),
    ((f"dataset._target_={HERE}.HWCUint8", "+dataset.transform._target_=nope.tf"),
     "dataset.transform._target_='nope.tf'"),
    ((f"dataset._target_={HERE}.HWCUint8", f"+dataset.transform._target_={HERE}.scale_only",
      "+dataset.transform._partial_=true", "dataset.augment_on=device"),
     "dataset.transform._target_="),
])
def test_bad_custom_config_is_one_line(compose_cfg, tmp_path, extra, key):
    with pytest.raises(ConfigError) as e:
        measure_run(compose_cfg("dataset=custom", *extra), tmp_path)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


@pytest.mark.slow
def test_later_sample_breaking_the_contract_in_a_worker_fails_the_run_in_one_line(
        compose_cfg, tmp_path):
    cfg = compose_cfg(*custom("+dataset.kwargs.kind=big_label", "+dataset.kwargs.from_index=1",
                              "loader.num_workers=1", target=f"{HERE}.Broken"))
    result = measure_run(cfg, tmp_path)
    data = json.loads(result.path.read_text())
    assert data["status"] == "failed"
    err = data["error"]
    assert "\n" not in err and "label 99 is outside [0, 10)" in err
    assert "dataset=custom sample contract" in err


@pytest.mark.slow
def test_team_example_runs_through_config_dir(tmp_path):
    """As a team keeps it: its configs and its package in its own repo, gpubench installed."""
    sys.path.insert(0, str(TEAM_CONF))
    try:
        from my_team.data import write_shards
    finally:
        sys.path.remove(str(TEAM_CONF))
    shards = write_shards(tmp_path / "shards", shards=2, per_shard=24, size=40)
    env = {"PYTHONPATH": os.pathsep.join(
        p for p in (str(TEAM_CONF), os.environ.get("PYTHONPATH")) if p)}
    common = ("--config-dir", str(TEAM_CONF), "experiment=team_smoke",
              f"dataset.kwargs.root={shards}", "bench.device=cpu", "tracking=none",
              "bench.monitor_interval_s=0.05")
    p = run_cli(*common, "hydra.run.dir=run", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((tmp_path / "run" / "results.json").read_text())
    assert data["status"] == "ok"
    assert data["config"]["model"]["_target_"] == "my_team.models.SmallConvNet"
    assert data["data_info"]["target"] == "my_team.data.ShardDataset"
    assert data["data_info"]["transform"] == "my_team.data.CenterCropNormalize"
    assert all(data["phases"][n]["images_per_sec"] > 0 for n in ("loader", "compute", "e2e"))

    # the team's sweep preset, cut to two trials
    p = run_cli(*common, "sweep=team_loader", "hydra.sweeper.n_trials=2", "hydra.sweeper.confirm.top=0",
                "hydra.sweeper.screen.steps=null", "hydra.sweep.dir=sweep", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    done = [json.loads(f.read_text()) for f in (tmp_path / "sweep").rglob("results.json")]
    assert len(done) == 2 and all(d["status"] == "ok" for d in done)
    assert {d["config"]["dataset"]["_target_"] for d in done} == {"my_team.data.ShardDataset"}


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["dataset._target_=no_such_team.data.X",
                                 f"dataset._target_={HERE}.Broken"])
def test_cli_bad_custom_dataset_is_one_line_on_stderr(tmp_path, bad):
    from conftest import TINY

    env = {"PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p)}
    p = run_cli(*TINY, "dataset=custom", bad, "+dataset.kwargs.kind=float_label"
                if "Broken" in bad else "+dataset.kwargs.unused=1", "hydra.run.dir=run",
                cwd=tmp_path, env=env)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: dataset._target_="), p.stderr
    assert not (tmp_path / "run" / "results.json").exists()
