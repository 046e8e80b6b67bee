"""The command line: `python -m gpubench` from a fresh directory, in this process (run_cli)
unless the process is the subject (a closed pipe); its error layer through Hydra's own main."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, run_cli, start_process


@pytest.mark.slow
def test_cli_run_prints_verdict_and_writes_results(tmp_path):
    proc = run_cli(*TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "narrowest pipe:" in proc.stdout
    assert "loader" in proc.stdout and "compute" in proc.stdout and "e2e" in proc.stdout
    results = list((tmp_path / "outputs" / "runs").glob("*/*/results.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert data["status"] == "ok" and data["images_per_sec"] > 0
    # Hydra's own record of the run sits beside it
    assert (results[0].parent / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow
def test_cli_full_error_shows_traceback(tmp_path):
    proc = run_cli(*TINY, "loader.batch_size=0", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.slow
def test_cli_oom_single_run_exits_nonzero_and_keeps_results(tmp_path):
    proc = run_cli(*TINY, "fault.oom_above_batch=1", cwd=tmp_path)
    assert proc.returncode == 1
    assert "status: oom" in proc.stdout
    data = json.loads(next(tmp_path.glob("outputs/runs/*/*/results.json")).read_text())
    assert data["status"] == "oom" and "loader" in data["phases"]


# Ctrl-C and SIGTERM: tests/test_reliability.py


# ------------------------------------------------------------------ exit codes a script can trust


def test_mistyped_key_names_the_close_key(compose_cfg):
    from gpubench.cli.messages import describe

    for override, line in (
            ("lodaer.batch_size=3", "lodaer.batch_size=3 is not allowed: it must be a key of the "
             "config (close: loader.batch_size)"),  # Hydra's error names `lodaer` only
            # under gpubench's groups: the declared keys, never a `+key` that is then refused
            ("loader.batchsize=32", "loader.batchsize=32 is not allowed: it must be a key gpubench declares "
             "(close: loader.batch_size); a custom class's own arguments go under model.kwargs "
             "or dataset.kwargs"),
            ("chanels_last=true", "chanels_last=true is not allowed: it must be a key of the config "
             "(close: channels_last)")):
        with pytest.raises(Exception) as err:
            compose_cfg(override)
        assert describe(err.value, [override]) == (line, 2)


@pytest.mark.parametrize("override, line", [
    ("hydra.sweeper.n_trails=2", "hydra.sweeper.n_trails=2 is not allowed: it must be a key of "
     "the config (close: hydra.sweeper.n_trials)"),
    # no `+hydra.sweeper.x=...`: a key the sweeper's schema lacks is read by nothing
    ("hydra.sweeper.bogus_thing=2", "hydra.sweeper.bogus_thing=2 is not allowed: it must be a "
     "key of the config")])
def test_a_mistyped_sweeper_key_names_its_close_sibling(compose_cfg, override, line):
    """`hydra.sweeper.n_trails=2` was pointed at `+hydra.sweeper.n_trails=...`, with no close
    key: Hydra's node was left out of the keys it was matched against."""
    from gpubench.cli.messages import describe

    with pytest.raises(Exception) as err:
        compose_cfg("sweep=throughput", override, hydra=True)
    assert describe(err.value, ["sweep=throughput", override]) == (line, 2)


@pytest.fixture
def sigterm_kept():
    """one_line_errors installs gpubench's SIGTERM handler, and Hydra's main configures
    logging (a handler on the root logger writing to this test's captured stderr, closed once
    it ends): this process gets its own back."""
    before = signal.getsignal(signal.SIGTERM)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    signal.signal(signal.SIGTERM, before)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("argv, line", [
    (["loader.batchsize=32"], "loader.batchsize=32 is not allowed: it must be a key gpubench declares (close: "
     "loader.batch_size); a custom class's own arguments go under model.kwargs or dataset.kwargs"),
    # and its `+` form runs nothing: a near-miss of a root key is no key of one's own
    (["+precison=amp_bf16"], "precison='amp_bf16' is not allowed: it must be a key gpubench declares "
     "(close: precision); a top-level key of your own needs a name apart"),
    (["precision=fp64"],
     "precision=fp64 is not allowed: it must be one of amp_bf16, amp_fp16, fp32, tf32, torch_default"),
    (["--bogus"], "unrecognized arguments: --bogus (see gpubench --help)"),
    # Hydra's parser takes the overrides in one run: the multirun flag between them ends it
    (["-m", "loader.batch_size=4,8"], "unrecognized arguments: loader.batch_size=4,8; the flags "
     "(-m, -cd DIR, ...) go before or after all the overrides, not between them (see gpubench "
     "--help)"),
    # a key given twice (TINY sets loader.batch_size first): the value refused is named
    (["loader.batch_size=abc"],
     "loader.batch_size=abc is not allowed: it must be null or an integer in [1, 65536]"),
    (["bench.device=tpu"], "bench.device=tpu is not allowed: it must be one of auto, cuda, cpu"),
    # refused when the settings are resolved, still before anything is written
    (["model.name=resnet51"], "model.name='resnet51' is not allowed: it must be a torchvision "
     "classification model or 'tiny' (close: resnet101, resnet152, resnet18, resnet34, "
     "resnet50, resnext101_32x8d)"),
    (["loader.batch_size=0"],
     "loader.batch_size=0 is not allowed: it must be null or an integer in [1, 65536]"),
    (["loader.num_workers=-2"],
     "loader.num_workers=-2 is not allowed: it must be an integer in [0, 1024]"),
    (["dataset=imagefolder"], "dataset.root=null is not allowed: it must be a folder path "
     "(imagefolder reads local files)"),
    (["+dataset.transform._target_=os.system"], "dataset.transform._target_='os.system' is not "
     "allowed: it must be unset with dataset=synthetic (dataset=custom reads it)"),
    # a mapping given to the parent: the key it adds and its value, not the group's `dataset=`
    (["dataset=custom", "dataset.collate={_target_:numpy.save}"],
     "dataset.collate._target_='numpy.save' is not allowed: it must be a key of the config "
     "(close: dataset._target_, dataset.collate, step._target_)"),
])
def test_hydras_main_fails_in_one_line(monkeypatch, tmp_path, capsys, sigterm_kept, argv, line):
    """Hydra's own main, in this process: it raises what it caught (HYDRA_FULL_ERROR=1 inside
    the error layer only), argparse's error is raised too, and stderr holds the one line."""
    from gpubench.__main__ import main
    from gpubench.cli.errors import one_line_errors

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", ["gpubench", *TINY, *argv])
    with pytest.raises(SystemExit) as done, one_line_errors():
        main()
    assert done.value.code == 2 and capsys.readouterr().err == f"gpubench: error: {line}\n"
    assert "HYDRA_FULL_ERROR" not in os.environ and not list(tmp_path.iterdir())


def test_a_team_folder_given_with_cd_is_found_first(monkeypatch, tmp_path, capsys, sigterm_kept):
    """`-cd DIR` becomes the primary config folder, gpubench's own after it
    (hydra_plugins.gpubench_searchpath): the team's model/tiny.yaml is read, and a bad value in
    it is one line naming the file. Before, gpubench's tiny.yaml was found first and the
    team's never read."""
    import gpubench.cli
    from gpubench.__main__ import main, team_first
    from gpubench.cli.errors import one_line_errors
    from gpubench.config.errors import ConfigError

    team = tmp_path / "team"
    (team / "model").mkdir(parents=True)
    (team / "model" / "tiny.yaml").write_text("name: tiny\ncheckpointing: 2\n")
    monkeypatch.setattr("gpubench.cli.TEAM_DIR", None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    argv = team_first(["-cd", "team", *TINY])
    assert argv == ["--config-path", str(team), *TINY]
    monkeypatch.setattr(sys, "argv", ["gpubench", *argv])
    with pytest.raises(SystemExit) as done, one_line_errors():
        main()
    assert done.value.code == 2 and capsys.readouterr().err == (
        f"gpubench: error: model.checkpointing=2 is not allowed: it must be true or false (in "
        f"{team / 'model' / 'tiny.yaml'})\n")
    assert team_first(["--config-dir=team", "-m"]) == ["--config-path", str(team), "-m"]
    assert team_first(["-cp", "own", "-cd", "team"]) == ["-cp", "own", "-cd", "team"]
    assert gpubench.cli.TEAM_DIR is None  # the next command in this process names no folder
    with pytest.raises(ConfigError, match="^--config-dir='nope' is not allowed: it must be a folder"):
        team_first(["-cd", "nope"])


def test_help_leaves_out_the_keys_for_tests(compose_cfg):
    """`--help` printed the fault group, keys for tests a user never sets: bench.yaml's help
    template prints the config through gpubench's resolver, which leaves them out."""
    import string

    import gpubench.__main__  # noqa: F401 - registers the resolver

    cfg = compose_cfg(hydra=True)
    cfg.hydra.help.template = "${gpubench_help_config:}"
    shown = string.Template(cfg.hydra.help.template).substitute()  # as Hydra's get_help does
    assert "\nloader:\n" in shown and "${dataset.num_classes}" in shown
    assert "fault" not in [line.partition(":")[0] for line in shown.splitlines()]


def test_every_help_fits_80_columns(compose_cfg, monkeypatch, capsys):
    """`--help` of gpubench, its report, tracking and check commands: no line over 80 columns in
    a terminal of 80 (argparse wraps to it; Hydra's and the check's are printed as written)."""
    import string

    import gpubench.__main__  # noqa: F401 - registers the resolver the help template calls
    from gpubench.check.suite import main as check_main
    from gpubench.report.cli import main as report_main
    from gpubench.tracking.__main__ import main as tracking_main

    monkeypatch.setenv("COLUMNS", "80")  # what argparse reads the terminal's width from
    shown = []
    for main, argv in ((report_main, ["--help"]), (tracking_main, ["--help"]),
                       (tracking_main, ["sync", "--help"])):
        with pytest.raises(SystemExit):
            main(argv)
        shown.append(capsys.readouterr().out)
    check_main(["--help"], emit=shown.append)
    template = compose_cfg(hydra=True).hydra.help.template  # as Hydra's get_help fills it
    shown.append(string.Template(template).safe_substitute())
    lines = [line for text in shown for line in text.splitlines()]
    assert len(lines) > 100 and [x for x in lines if len(x) > 80] == []


def test_a_tracked_sweep_ends_with_its_own_mlflow_link(compose_cfg, tmp_path, monkeypatch,
                                                       caplog):
    """After the jobs' links, the sweep's own (its parent run: the best run, the report), on
    the server's host."""
    import contextlib

    from gpubench import tracking
    from gpubench.cli import callbacks

    class Store:
        experiment_id = "7"

    @contextlib.contextmanager
    def open_store(*args):
        yield Store()

    closed = []
    monkeypatch.setattr(tracking, "open_store", open_store)
    monkeypatch.setattr(tracking, "close_sweep", lambda *a, **kw: closed.append(a[2]))
    monkeypatch.setattr(tracking, "mark_ended", lambda *a: None)
    monkeypatch.setattr(callbacks, "_sweep_report", lambda *a: None)
    monkeypatch.setenv(tracking.PARENT_ENV, "a1b2")
    cfg = compose_cfg("tracking=mlflow", "tracking.uri=http://mlflow.example:5000",
                      f"hydra.sweep.dir={tmp_path}", hydra=True)
    with caplog.at_level(logging.INFO, logger="gpubench"):
        callbacks.MlflowSweepCallback().on_multirun_end(cfg)
    assert closed == ["a1b2"]
    assert "MLflow sweep a1b2: http://mlflow.example:5000/#/experiments/7/runs/a1b2?" in caplog.text


def test_the_error_layer_unwraps_a_job_and_passes_exits_through(monkeypatch, capsys,
                                                                sigterm_kept):
    from gpubench.cli.errors import JobFailed, arguments, one_line_errors
    from gpubench.config.errors import ConfigError

    monkeypatch.setattr(sys, "argv", ["gpubench"])  # the layer reads the command line

    def ended(raise_it) -> tuple[object, str]:
        with pytest.raises(BaseException) as done, one_line_errors():
            raise_it()
        return getattr(done.value, "code", done.value), capsys.readouterr().err

    def job():  # a single run's bad input, carried past Hydra's run_job
        raise JobFailed from ConfigError("loader.batch_size", 0, "an integer in [1, 65536]")

    def explained():  # raise ... from None after printing: the line is printed already
        print("gpubench: error: range(8,4,1) is empty", file=sys.stderr)
        raise SystemExit(2) from None

    def reader_gone():
        raise JobFailed from BrokenPipeError()

    assert ended(job) == (2, "gpubench: error: loader.batch_size=0 is not allowed: it must be an integer "
                             "in [1, 65536]\n")
    assert ended(explained) == (2, "gpubench: error: range(8,4,1) is empty\n")
    code, err = ended(reader_gone)  # quiet_broken_pipe's to end: no line
    assert isinstance(code, BrokenPipeError) and err == ""
    args = arguments(["-m", "a=1", "b=2"])
    assert args.overrides == ["a=1", "b=2"] and args.multirun
    with pytest.raises(argparse.ArgumentError, match="unrecognized arguments: --x"):
        arguments(["--x"])


@pytest.mark.slow
def test_cli_over_ceiling_exits_5_with_advice_and_a_sweep_goes_on(tmp_path):
    from gpubench.core.exits import ExitCode

    proc = run_cli(*TINY, "memory.ceiling=0.0001", cwd=tmp_path)
    assert proc.returncode == ExitCode.OVER_CEILING == 5, proc.stderr[-2000:]
    out = proc.stdout
    assert "status: over_ceiling" in out and "to fit under memory.ceiling:" in out
    assert "loader.batch_size=2: a smaller batch" in out  # TINY's batch is 4
    assert "model.checkpointing=true" in out and "precision=amp_bf16" in out
    # in a multirun the job is a finished trial: the sweep goes on, the command ends 0
    proc = run_cli("-m", *TINY, "memory.ceiling=0.0001", "loader.batch_size=2,4",
                   "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    statuses = [json.loads(p.read_text())["status"]
                for p in sorted((tmp_path / "sweep").glob("*/results.json"))]
    assert statuses == ["over_ceiling", "over_ceiling"]
    # untracked, the sweep still ends with its report (as python -m gpubench.report prints it)
    assert "no feasible full-length measurement" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "sweep" / "report" / "summary.json").is_file()


def _into_closed_pipe(module: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS | head` where head has already gone: every write to stdout
    fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = start_process(*args, module=module, cwd=cwd, stdout=write, stderr=subprocess.PIPE,
                         text=True)
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    from gpubench.core.exits import ExitCode

    proc = _into_closed_pipe("gpubench", "--help", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (ExitCode.BROKEN_PIPE, "")
    assert ExitCode.BROKEN_PIPE == 141  # as a shell reports a writer that SIGPIPE ended
    shutil.copytree(Path(__file__).resolve().parents[1] / "golden" / "fixtures" / "sweep", tmp_path / "sweep")
    proc = _into_closed_pipe("gpubench.report", "sweep", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (ExitCode.BROKEN_PIPE, "")


def test_a_multiruns_overrides_are_read_as_written(compose_cfg, monkeypatch):
    """The refused jobs' overrides (and the MLflow parent's) iterated hydra.overrides.task,
    which resolves an override's ${oc.env:...}: unset, it raised; set, a secret was stored
    resolved. They read the list as written."""
    from gpubench.cli.callbacks import _refused
    from gpubench.core.exits import REJECTED, Refusal

    monkeypatch.delenv("GPUBENCH_TEST_UNSET", raising=False)
    cfg = compose_cfg(hydra=True)
    written = "tracking.run_name=${oc.env:GPUBENCH_TEST_UNSET}"
    cfg.hydra.overrides.task.append(written)
    monkeypatch.setattr("gpubench.cli.callbacks.REJECTED", [Refusal((written, "x=1"), "bad")])
    assert _refused(cfg) == [Refusal(("x=1",), "bad")]
    assert REJECTED == []  # the module's own list untouched


def test_a_command_keeps_no_exit_code_from_an_earlier_one_in_its_process(tmp_path):
    """The exit code a sweep's parent run is closed by at exit (callbacks.EXIT) is the last
    command's: a second command in one process that ends normally leaves none from the first."""
    from gpubench.cli.callbacks import EXIT

    assert run_cli(*TINY, "loader.batch_size=0", cwd=tmp_path).returncode == 2
    assert EXIT == {"code": 2}
    p = run_cli(*TINY, "--cfg", "job", cwd=tmp_path)
    assert p.returncode == 0 and "batch_size: 4" in p.stdout, p.stderr
    assert EXIT == {}
