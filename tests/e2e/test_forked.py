"""The CLI tests' forkserver (tests/forked.py) gives each command a process of its own, as a new
interpreter would: its own pid, exit status, signals, cwd, environment, PYTHONPATH and
streams. A command that depends on any of these is tested through it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import run_cli, start_cli

pytestmark = pytest.mark.slow

PROBE = "forked_probe"  # a module written into the test's own folder (PYTHONPATH)
CODE = """
import json, os, sys
print(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                  "env": os.environ.get("PROBE_VALUE"), "main": __name__}))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["sleep"]:
    import time
    time.sleep(300)
raise SystemExit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture
def probe(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{PROBE}.py").write_text(CODE)
    return {"PYTHONPATH": str(lib), "PROBE_VALUE": "seen"}


def test_a_command_runs_as_its_own_process_in_its_own_folder(tmp_path, probe):
    import json

    work = tmp_path / "work"
    work.mkdir()
    p = run_cli("7", "x", module=PROBE, cwd=work, env=probe)
    assert p.returncode == 7, p.stderr
    seen = json.loads(p.stdout)
    assert seen["pid"] != os.getpid() and seen["cwd"] == str(work)
    assert seen["argv"] == ["7", "x"] and seen["env"] == "seen" and seen["main"] == "__main__"
    assert p.stderr == "to stderr\n"


def test_signals_reach_the_command_and_its_status_says_so(tmp_path, probe):
    proc = start_cli("sleep", module=PROBE, cwd=tmp_path, env=probe, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout.readline()  # it runs
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)  # its own process group, as start_new_session asks
    assert proc.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # reaped: the pid is gone, not a zombie
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"pid {proc.pid} still exists after its exit was reported")
