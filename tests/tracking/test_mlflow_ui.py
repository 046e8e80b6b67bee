"""The MLflow UI, rendered by a real headless Chromium against a real `mlflow server` at
1440x900: the link gpubench gives opens the training runs (not the GenAI view) in the
experiment's saved view, whose columns show each run's throughput and verdict beside a name
that leads with the setup; a run's description starts with them, then its picture. Skipped
where Chromium is not installed (`apt-get install chromium`)."""

from __future__ import annotations

import html
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from gpubench.core.record import RunRecord
from gpubench.tracking import open_store, upload
from gpubench.tracking.translate import page as ui_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)"),
]
PNG = b"\x89PNG\r\n\x1a\n"


def chromium(tmp: Path, url: str, *args: str) -> str:
    """Headless Chromium on `url`; the page's scripts get 15 s of virtual time to render."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=15000",
         "--window-size=1440,900", *args, url],
        capture_output=True, text=True, timeout=120)
    return proc.stdout


def record(uid: str, bs: int, ips: float, bottleneck: str) -> RunRecord:
    return RunRecord.from_dict({
        "run_uid": uid, "status": "ok", "images_per_sec": ips, "bottleneck": bottleneck,
        "verdict_leaning": "compute",  # read only when inconclusive
        "reason": "constructed for the UI check",
        "phases": {"e2e": {"phase": "e2e", "batch_size": bs, "images_per_sec": ips}},
        "config": {"model": {"name": "resnet50"}, "dataset": {"name": "imagenet"},
                   "loader": {"batch_size": bs, "num_workers": 8}, "precision": {"name": "fp16"}},
    })


def picture(path: Path, ips: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2))
    ax.barh(["e2e"], [ips])
    fig.savefig(path)
    plt.close(fig)


def test_runs_table_and_run_page(mlflow_server, tmp_path):
    url = mlflow_server.url
    ids = {}
    with open_store(url, "ui-check") as store:
        for uid, bs, ips, b in (("a", 64, 1234.0, "data"), ("b", 128, 2345.0, "inconclusive")):
            run_dir = tmp_path / uid
            run_dir.mkdir()
            rec = record(uid, bs, ips, b)
            rec.dir = run_dir
            rec.save()
            picture(run_dir / "run.png", ips)
            ids[uid] = upload(store, rec, run_dir)
        exp = store.experiment_id

    table = html.unescape(chromium(tmp_path, f"{url}/{ui_page(exp)}", "--dump-dom"))
    assert "Evaluation runs" not in table  # the training runs' page, not the GenAI one
    assert "resnet50-bs64-w8-fp16 1234img/s" in table
    assert "resnet50-bs128-w8-fp16 2345img/s" in table  # an inconclusive run: no verdict word
    for column, cell in (("metrics.`images_per_sec`", "1234"), ("tags.`verdict`", "inconclusive")):
        assert f'col-id="{column}"' in table  # the saved view's columns, rendered at 1440 px
        assert f">{cell}<" in table

    page = html.unescape(chromium(tmp_path, f"{url}/{ui_page(exp, ids['a'])}", "--dump-dom"))
    src = f"get-artifact?path=run.png&run_uuid={ids['a']}"
    assert "data-bound</strong> · 1234.0 img/s end-to-end" in page  # the headline first
    assert f'src="{src}"' in page  # then the run's picture
    with urllib.request.urlopen(f"{url}/{src}", timeout=30) as r:  # and the server serves it
        assert r.read().startswith(PNG)

    shot = tmp_path / "runs.png"
    chromium(tmp_path, f"{url}/{ui_page(exp)}", f"--screenshot={shot}")
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 20_000
