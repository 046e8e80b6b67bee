"""The suite's own rules (conftest.py): what makes a test `slow`."""

from __future__ import annotations

import pytest
from conftest import ROOT, run_cli, start_cli, torchrun


@pytest.mark.parametrize("start", [
    lambda: start_cli("--help", cwd=ROOT),
    lambda: run_cli("--help", cwd=ROOT),
    lambda: run_cli("--help", cwd=ROOT, fresh=True),
    lambda: torchrun("--help", cwd=ROOT),
], ids=["start_cli", "run_cli", "fresh", "torchrun"])
def test_a_test_that_starts_a_process_without_the_slow_mark_fails(start):
    """`pytest -m "not slow"` stays in-process: starting a command from a test not marked
    `slow` fails that test before any process starts."""
    with pytest.raises(pytest.fail.Exception, match=r"starts .*mark it @pytest.mark.slow"):
        start()


@pytest.mark.slow
def test_a_slow_test_may_start_one():
    assert run_cli("--help", cwd=ROOT).returncode == 0
