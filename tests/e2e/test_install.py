"""Installing gpubench into an environment that already has PyTorch keeps that PyTorch: the
tool must benchmark the torch a team trains with, not swap in the newest release and 5 GB of
CUDA libraries (pyproject.toml declares a range, never a pin)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

# an older pair than the newest on any registry: a pin or a too-high floor would replace it
INSTALLED = {"torch": "2.8.0", "torchvision": "0.23.0"}


def _fake_dist(site, name: str, version: str) -> None:
    """An installed distribution as pip sees one: its dist-info (STACK.md, 2026-11-24)."""
    d = site / f"{name}-{version}.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "INSTALLER").write_text("pip\n")
    (d / "RECORD").write_text("")


@pytest.mark.slow  # a venv and pip in subprocesses
def test_install_beside_an_installed_torch_keeps_it(tmp_path):
    from pathlib import Path

    venv = tmp_path / "venv"
    # the venv sees this machine's packages (hydra, mlflow, ...: nothing to download), and its
    # own site-packages, first on the path, holds the team's torch 2.8 / torchvision 0.23
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    for name, version in INSTALLED.items():
        _fake_dist(site, name, version)
    pip = [py, "-m", "pip", "--disable-pip-version-check", "-q"]
    # the build backend (pyproject's build-system) in the venv, so the dry run needs no index
    subprocess.run([*pip, "install", "hatchling>=1.21"], check=True, capture_output=True)
    report = tmp_path / "report.json"
    r = subprocess.run([*pip, "install", "--dry-run", "--no-index", "--no-build-isolation",
                        "--report", str(report), str(ROOT)], capture_output=True, text=True)
    # with `torch==X` pinned the resolver finds no torch it may install (no index) and fails
    assert r.returncode == 0, r.stderr[-2000:]
    would = {i["metadata"]["name"]: i["metadata"]["version"]
             for i in json.loads(report.read_text())["install"]}
    assert set(would) == {"gpubench"}, f"would also install {would}"
    listed = subprocess.run([py, "-m", "pip", "list", "--format=json"], capture_output=True,
                            text=True, check=True).stdout
    seen = {p["name"]: p["version"] for p in json.loads(listed)}
    assert {k: seen.get(k) for k in INSTALLED} == INSTALLED  # the venv's pair is what pip sees
