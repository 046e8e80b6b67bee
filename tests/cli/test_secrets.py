"""No password on disk or in a message: a real sweep tracked at a URI with a password leaves it
in no file of its sweep folder (sweep.json's best overrides, job records, Hydra's copies, the
report); the report's MLflow source says a store that fails in one masked line, every wait
bounded."""

from __future__ import annotations

import socket
import threading

import pytest
from conftest import TINY, run_cli

PASSWORD = "pw-4a7c1e"  # noqa: S105 - a marker to search for, not a credential


@pytest.mark.slow
def test_a_sweep_writes_no_password_anywhere(tmp_path):
    sweep = tmp_path / "sweep"
    # port 9 (discard) on loopback refuses at once: tracking warns and the runs go on, while
    # the URI rides along in every job's overrides, the best trial's among them
    p = run_cli("-m", "hydra/sweeper=gpubench", *[o for o in TINY if not o.startswith("tracking=")],
                "tracking=mlflow", f"tracking.uri=http://bob:{PASSWORD}@127.0.0.1:9",
                "tracking.timeout_s=1", "loader.batch_size=choice(2,4)",
                "hydra.sweeper.n_trials=2", "hydra.sweeper.seed=0", "hydra.sweeper.confirm.top=0",
                f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}",
                f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (sweep / "sweep.json").is_file() and (sweep / "report" / "summary.json").is_file()
    assert "bob:***@" in (sweep / "sweep.json").read_text()  # the URI is there, masked
    leaks = [str(f.relative_to(sweep)) for f in sorted(sweep.rglob("*"))
             if f.is_file() and PASSWORD.encode() in f.read_bytes()]
    assert not leaks, leaks
    assert PASSWORD not in p.stdout + p.stderr


# ------------------------------------------------------------------ the report's MLflow source


def _silent_socket() -> socket.socket:
    """A server that accepts and never answers: a listening socket nobody reads (the kernel
    completes the handshakes)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def _refusing_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _report(argv: list[str]) -> tuple[object, bool]:
    """report's main in a thread: (its exit code, whether it ended). The join's limit is a
    guard so an unbounded wait fails the test instead of hanging it, not a timing claim."""
    from gpubench.report.cli import main

    done: list = []
    th = threading.Thread(target=lambda: done.append(main(argv)), daemon=True)
    th.start()
    th.join(120)
    return (done[0] if done else None), not th.is_alive()


@pytest.mark.parametrize("server", ["silent", "refused"])
def test_report_against_an_unreachable_store_is_one_masked_line(tmp_path, monkeypatch, capsys,
                                                                 server):
    """`report --tracking-uri http://user:pw@host` against a port that refuses and a server
    that never answers: it ran minutes, printed the password in its tracebacks (or hung).
    Now: one line, the password masked, exit 1, every wait bounded by --timeout."""
    monkeypatch.chdir(tmp_path)
    silent = _silent_socket()
    port = silent.getsockname()[1] if server == "silent" else _refusing_port()
    try:
        code, ended = _report(["gpubench", "--tracking-uri",
                               f"http://bob:{PASSWORD}@127.0.0.1:{port}", "--timeout", "1"])
    finally:
        silent.close()
    out, err = capsys.readouterr()
    assert ended and code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert PASSWORD not in out + err and f"http://bob:***@127.0.0.1:{port}" in err
    assert ("timed out" if server == "silent" else "refused") in err
    assert not (tmp_path / "outputs").exists()


def test_report_refuses_a_tracking_uri_before_connecting(tmp_path, monkeypatch, capsys):
    """A URI MLflow would refuse (its file store) is refused by the tracking.uri rule, exit 2;
    the default store is never created by a report (it reads), nor a flag for an MLflow source
    ignored on a folder."""
    from gpubench.report.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for argv, says in (
            (["x", "--tracking-uri", f"file:///u:{PASSWORD}@h/mlruns"], "refuses file stores"),
            (["./", "--tracking-uri", "sqlite:///x.db"], "--tracking-uri: for an MLflow"),
            (["x", "--prices", "p.yaml"], "--prices: only with --compare")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and err.count("\n") == 1, err
        assert PASSWORD not in err
    assert main(["gpubench"]) == 1
    assert "no MLflow store at" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()


def test_an_error_is_one_masked_line_never_cut():
    from gpubench.core.secrets import error_text

    long = "x" * 500
    e = RuntimeError(f"cannot reach\n  http://bob:{PASSWORD}@db:5432/m\n{long} end.")
    assert error_text(e) == f"cannot reach http://bob:***@db:5432/m {long} end."
    assert error_text(KeyError()) == "KeyError"
