"""The suite's own rules (conftest.py): what makes a test `slow`, and what its in-process
command (run_cli) gives a test and puts back."""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest
from conftest import ROOT, run_cli, run_process, start_process, torchrun

PROBE = "suite_probe"  # a module in the test's own folder, found through PYTHONPATH
CODE = """
import json, logging, os, signal, sys, warnings
import beside  # a module in the command's folder: first on sys.path, as `python -m` puts it
print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "env": os.environ.get("PROBE_VALUE"),
                  "main": __name__}))
print("to stderr", file=sys.stderr)
warnings.warn("shown as an interpreter shows it")
os.write(2, b"past sys.stderr\\n")  # as C code or a forked worker writes
os.environ["PROBE_SET"] = "1"  # what a command sets for its process
signal.signal(signal.SIGTERM, signal.SIG_IGN)
logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))
raise SystemExit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


@pytest.mark.parametrize("start", [
    lambda: start_process("--help", cwd=ROOT),
    lambda: run_process("--help", cwd=ROOT),
    lambda: torchrun("--help", cwd=ROOT),
], ids=["start_process", "run_process", "torchrun"])
def test_a_test_that_starts_a_process_without_the_slow_mark_fails(start):
    """`pytest -m "not slow"` stays in-process: starting a command from a test not marked
    `slow` fails that test before any process starts."""
    with pytest.raises(pytest.fail.Exception, match=r"starts .*mark it @pytest.mark.slow"):
        start()


@pytest.mark.slow
def test_a_slow_test_may_start_one():
    assert run_process("--help", cwd=ROOT).returncode == 0


def test_an_in_process_command_runs_as_main_in_its_folder_and_leaves_this_process_as_it_was(
        tmp_path):
    """run_cli, the CLI tests' command: the module runs as `__main__` with the arguments, the
    folder, the environment and the import path `python -m` gives it; its status and all that
    reached stdout and stderr come back (a warning, a write past sys.stderr), and what it set
    for its process (a variable, a signal handler, a log handler, its modules) is put back."""
    import json

    lib, work = tmp_path / "lib", tmp_path / "work"
    lib.mkdir()
    work.mkdir()
    (lib / f"{PROBE}.py").write_text(CODE)
    (work / "beside.py").write_text("")
    before = (os.getcwd(), list(sys.argv), list(sys.path), signal.getsignal(signal.SIGTERM),
              list(logging.getLogger().handlers))
    p = run_cli("7", "x", module=PROBE, cwd=work, env={"PROBE_VALUE": "seen",
                                                        "PYTHONPATH": str(lib)})
    assert p.returncode == 7, p.stderr
    assert json.loads(p.stdout) == {"cwd": str(work), "argv": ["7", "x"], "env": "seen",
                                    "main": "__main__"}
    assert p.stderr.startswith("to stderr\n") and p.stderr.endswith("past sys.stderr\n")
    assert "UserWarning: shown as an interpreter shows it" in p.stderr
    assert "PROBE_SET" not in os.environ and "PROBE_VALUE" not in os.environ
    assert (os.getcwd(), sys.argv, sys.path, signal.getsignal(signal.SIGTERM),
            logging.getLogger().handlers) == before
    assert PROBE not in sys.modules and "beside" not in sys.modules
