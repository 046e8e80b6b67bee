"""Golden outputs: a fixed record rendered by the console, its MLflow params/metrics/tags, the
resolved config of several override sets, the one-line errors of bad inputs, and the report of a
fixed sweep folder are what they were when tests/golden/expected/ was written
(`python scripts/golden.py tests/golden/expected --cli` rewrites it; review the diff)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ROOT / "tests" / "golden" / "expected"

spec = importlib.util.spec_from_file_location("golden", ROOT / "scripts" / "golden.py")
golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden)


@pytest.mark.parametrize("name, make", [
    ("console.txt", golden.console_text),
    ("mlflow.json", golden.mlflow_json),
    ("config.json", golden.config_json),
    ("errors.txt", golden.errors_text),
])
def test_golden_output_unchanged(name, make):
    assert make() == (EXPECTED / name).read_text()


@pytest.mark.slow
def test_golden_report_unchanged(tmp_path):
    golden.report_dir(tmp_path)
    want = sorted(p.relative_to(EXPECTED / "report") for p in (EXPECTED / "report").rglob("*")
                  if p.is_file())
    got = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert got == want
    for rel in want:
        assert (tmp_path / rel).read_text() == (EXPECTED / "report" / rel).read_text(), rel
