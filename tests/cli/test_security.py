"""Security: nothing runs that the config's key does not allow (a code reference is checked
before it is called), a model's output is checked before any phase, and neither `tracking sync`
nor `report` reads or writes through a symbolic link out of the folder it was given."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_cli, sqlite_store
from torch import nn
from torch.utils.data import Dataset

from gpubench.cli.callbacks import MlflowSweepCallback
from gpubench.config.errors import ConfigError
from gpubench.core.files import LinkError, check_no_links, write_text
from gpubench.core.record import RunRecord
from gpubench.report import cli as report_cli
from gpubench.run.runner import measure_run
from gpubench.tracking.sync import sync

HERE = "test_security"  # this module, importable by dotted path (tests/ is on sys.path)


# ------------------------------------------------------------------ code the config names


class Images(Dataset):
    """A valid team dataset, for the transform and collate cases."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.zeros(3, 16, 16, dtype=torch.uint8), i % 10


def shell(marker: Path) -> str:
    """A shell command that leaves `marker` behind if it ever runs (quoted for an override)."""
    return f"'echo ran > {marker}'"


CUSTOM_DS = ("dataset=custom", f"dataset._target_={HERE}.Images")


def calls(marker: Path) -> dict[str, tuple[str, ...]]:
    """Every key that names code, each pointing at a standard-library callable that acts at
    once (a shell command, a file copied, created or truncated): on code that calls first and
    checks after, the marker exists by the time the error is raised. Hydra's instantiate
    (transform, collate) refuses os.system and subprocess.* itself, but not these; a model and
    a dataset are built by gpubench, not through instantiate. (subprocess.Popen starts its
    shell in the background: the CLI test below waits for the process to end instead.)"""
    secret = marker.with_name("secret.txt")
    secret.write_text("private")
    return {
        # a class that creates its file when built, and is no nn.Module
        "model": ("model._target_=logging.FileHandler", f"+model.kwargs.filename='{marker}'"),
        "dataset": ("dataset=custom", "dataset._target_=subprocess.run",
                    f"+dataset.kwargs.args={shell(marker)}", "+dataset.kwargs.shell=true"),
        # a private file copied where the attacker reads it
        "transform": (*CUSTOM_DS, "+dataset.transform._target_=shutil.copyfile",
                      f"+dataset.transform.src='{secret}'", f"+dataset.transform.dst='{marker}'"),
        # a standard-library function reached through a module that re-exports `os`: refused
        # by the module that defines it
        "transform_reexport": (*CUSTOM_DS, "+dataset.transform._target_=torch.os.makedirs",
                               f"+dataset.transform.name='{marker}'"),
        # a nested node: Hydra instantiates it before the Compose around it
        "transform_nested": (*CUSTOM_DS, "+dataset.transform._target_=torchvision.transforms.Compose",
                             f"+dataset.transform.transforms=[{{_target_: os.makedirs, "
                             f"name: '{marker}'}}]"),
        # open(file, "w") truncates (here: creates) any file the process may write
        "collate": (*CUSTOM_DS, "+dataset.collate._target_=builtins.open",
                    f"+dataset.collate.file='{marker}'", "+dataset.collate.mode=w"),
    }


KEYS = {"model": "model._target_", "dataset": "dataset._target_",
        "transform": "dataset.transform._target_",
        "transform_reexport": "dataset.transform._target_",
        "transform_nested": "dataset.transform.transforms[0]._target_",
        "collate": "dataset.collate._target_"}


@pytest.mark.parametrize("case", list(KEYS))
def test_a_process_spawning_target_is_refused_before_it_is_called(compose_cfg, tmp_path, case):
    marker = tmp_path / "MARKER"
    cfg = compose_cfg(*calls(marker)[case])
    try:
        measure_run(cfg, tmp_path / "run")
        msg = "no error"
    except Exception as e:  # the marker is looked at first, whatever was raised
        msg = str(e)
    assert not marker.exists(), f"{case}: the command ran before the check"
    assert "\n" not in msg and msg.startswith(KEYS[case] + "=")
    assert "standard library" in msg  # says what is allowed and why this is not
    assert not (tmp_path / "run" / "results.json").exists()  # nothing measured, nothing left


@pytest.mark.slow
def test_the_cli_refuses_the_reported_command_in_one_line_exit_2(tmp_path):
    """The command from the report, `subprocess.Popen` with a shell: exit 2, one line on
    stderr, and the shell never started (the marker is looked for after the command ended)."""
    marker = tmp_path / "MARKER"
    p = run_cli("model=custom", "model._target_=subprocess.Popen",
                f"+model.kwargs.args={shell(marker)}", "+model.kwargs.shell=true",
                "tracking=none", "bench.device=cpu", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "gpubench: error: model._target_='subprocess.Popen' is not allowed: it must be an nn.Module"), p.stderr
    assert not marker.exists()


@pytest.mark.parametrize("overrides,says", [
    (("model._target_=torch.utils.data.Dataset",), "it is class torch.utils.data.dataset.Dataset"),
    (("dataset=custom", f"dataset._target_={HERE}.TupleNet"), "it is class test_security.TupleNet"),
    (("dataset=custom", "dataset._target_=torch.utils.data.IterableDataset"), "IterableDataset"),
    ((*CUSTOM_DS, "+dataset.collate._target_=torch.nn"), "it is module torch.nn"),
    (("model._target_=no_such_team.Net",), "ModuleNotFoundError"),
    (("model._target_=Net",), "a dotted path"),
])
def test_a_target_of_the_wrong_kind_is_one_line_before_it_is_called(compose_cfg, tmp_path,
                                                                      overrides, says):
    with pytest.raises(ConfigError) as e:
        measure_run(compose_cfg(*overrides), tmp_path)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_team_transform_class_and_collate_function_still_run(compose_cfg, tmp_path):
    """The rule admits what docs/data.md promises: a class (built with its keys) and a plain
    function (_partial_), from the team's module or a library."""
    cfg = compose_cfg(*CUSTOM_DS, "+dataset.transform._target_=torchvision.transforms.Compose",
                      f"+dataset.transform.transforms=[{{_target_: {HERE}.ToFloat}}]",
                      f"+dataset.collate._target_={HERE}.stack", "+dataset.collate._partial_=true",
                      "bench.phases=[loader]")
    data = json.loads(measure_run(cfg, tmp_path).path.read_text())
    assert data["status"] == "ok", data.get("error")


class ToFloat:
    def __call__(self, image):
        return image.float() / 255


def stack(batch):
    xs, ys = zip(*batch, strict=True)
    return torch.stack(xs), torch.as_tensor(ys)


# ------------------------------------------------------------------ the model's output


class TupleNet(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.fc = nn.Linear(3, num_classes)

    def forward(self, x):
        return self.fc(x.mean((2, 3))), x


class Unpooled(nn.Module):
    """Forgot to pool: (N, classes, H, W), which the loss rejects only at the first step."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, num_classes, 1)

    def forward(self, x):
        return self.conv(x)


class GrayOnly(nn.Module):
    """Expects one channel: the dataset's RGB images do not go through."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(1, num_classes, 1)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


@pytest.mark.parametrize("overrides,key,says", [
    ((f"model._target_={HERE}.TupleNet",), "model._target_", "it returned tuple of 2"),
    ((f"model._target_={HERE}.Unpooled",), "model._target_", "it returned shape (2, 10, 16, 16)"),
    ((f"model._target_={HERE}.GrayOnly",), "model._target_", "RuntimeError"),
    # torchvision's own assert ("Input shape indivisible by patch size!") named no key
    (("model=vit_b_16", "dataset.image_size=40"), "dataset.image_size", "a multiple of 16"),
])
def test_a_model_that_cannot_train_on_the_batches_stops_before_any_phase(
        compose_cfg, tmp_path, overrides, key, says):
    with pytest.raises(ConfigError) as e:
        measure_run(compose_cfg(*overrides), tmp_path)
    msg = str(e.value)
    assert msg.startswith(key + "=") and says in msg and "\n" not in msg
    assert not (tmp_path / "results.json").exists()  # no phase ran


# ------------------------------------------------------------------ links out of a folder


def finished_run(run_dir: Path) -> None:
    rec = RunRecord.from_dict({
        "run_uid": "links1", "status": "ok", "images_per_sec": 100.0,
        "phases": {"loader": {"phase": "loader", "batch_size": 4, "images_per_sec": 250.0}},
        "config": {"model": {"name": "tiny"}, "tracking": {"backend": "mlflow"}},
        "host": socket.gethostname()}, run_dir)
    run_dir.mkdir(parents=True)
    rec.save()


def uploaded(uri: str, dest: Path) -> dict[str, str]:
    """Every artifact of the store's only run, downloaded: {relative path: text}."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    (run,) = c.search_runs([c.get_experiment_by_name("links").experiment_id])
    root = Path(c.download_artifacts(run.info.run_id, "", str(dest)))
    return {p.relative_to(root).as_posix(): p.read_text(errors="replace")
            for p in root.rglob("*") if p.is_file()}


def test_sync_uploads_nothing_a_link_leads_to_outside_the_run(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "private.json").write_text('{"token": "PRIVATE-1"}')
    (elsewhere / "trace.json").write_text("PRIVATE-2")
    run = tmp_path / "outputs" / "run"
    finished_run(run)
    (run / "traces").symlink_to(elsewhere)
    (run / "leak.log").symlink_to(elsewhere / "private.json")
    (run / "profiler").mkdir()  # a link that stays inside the run is followed as before
    (run / "profiler" / "step.json").write_text("OWN-TRACE")
    (run / "own.log").symlink_to(run / "profiler" / "step.json")
    uri = sqlite_store(tmp_path / "mlflow.db")
    assert sync(tmp_path / "outputs", uri=uri, experiment="links")["uploaded"] == 1
    files = uploaded(uri, tmp_path / "download")
    assert not any("PRIVATE" in text for text in files.values()), sorted(files)
    assert not any(f.startswith("traces") or f == "leak.log" for f in files)
    assert files["own.log"] == "OWN-TRACE" and files["profiler/step.json"] == "OWN-TRACE"
    err = capsys.readouterr().err
    assert f"not uploaded: {run / 'leak.log'} is a link out of {run}" in err
    assert f"not uploaded: {run / 'traces'} is a link out of {run}" in err


def test_sync_does_not_read_a_results_file_linked_from_outside(tmp_path):
    finished_run(tmp_path / "elsewhere")
    run = tmp_path / "outputs" / "run"
    run.mkdir(parents=True)
    (run / "results.json").symlink_to(tmp_path / "elsewhere" / "results.json")
    counts = sync(tmp_path / "outputs", uri=sqlite_store(tmp_path / "mlflow.db"))
    assert counts == {"uploaded": 0, "present": 0, "skipped": 1, "failed": 0}


def sweep(tmp_path: Path) -> Path:
    d = tmp_path / "sweep"
    for num, batch, ips in ((0, 4, 40.0), (1, 8, 60.0)):
        (d / str(num)).mkdir(parents=True)
        (d / str(num) / "results.json").write_text(json.dumps({
            "status": "ok", "images_per_sec": ips, "peak_memory_fraction": 0.1,
            "memory_ceiling": 0.8, "config": {"loader": {"batch_size": batch}}}))
    return d


def report(d: Path, capsys) -> tuple[int, list[str]]:
    rc = report_cli.main([str(d)])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_report_does_not_write_through_a_linked_report_folder(tmp_path, capsys):
    d, outside = sweep(tmp_path), tmp_path / "outside"
    outside.mkdir()
    (outside / "summary.json").write_text("precious")
    (d / "report").symlink_to(outside)
    rc, err = report(d, capsys)
    assert rc == 1 and len(err) == 1 and f"{d / 'report'}: a symbolic link out of {d}" in err[0]
    assert [p.name for p in outside.iterdir()] == ["summary.json"]
    assert (outside / "summary.json").read_text() == "precious"


def test_report_does_not_overwrite_a_file_a_link_in_its_folder_points_to(tmp_path, capsys):
    d, victim = sweep(tmp_path), tmp_path / "victim.csv"
    victim.write_text("precious")
    (d / "report").mkdir()
    (d / "report" / "ranking.csv").symlink_to(victim)
    rc, err = report(d, capsys)
    assert rc == 1 and len(err) == 1 and "ranking.csv: a symbolic link" in err[0]
    assert victim.read_text() == "precious"
    assert (d / "report" / "ranking.csv").is_symlink()  # the link itself is left as it was


def test_report_folder_linked_inside_the_sweep_is_written(tmp_path, capsys):
    """The rule is about leaving the folder, not about links: one that stays inside works."""
    d = sweep(tmp_path)
    (d / "reports" / "v1").mkdir(parents=True)
    (d / "report").symlink_to(d / "reports" / "v1")
    rc, err = report(d, capsys)
    assert rc == 0, err
    assert (d / "reports" / "v1" / "ranking.csv").is_file()


def test_write_text_replaces_gpubench_s_own_file_and_refuses_a_link(tmp_path):
    own = write_text(tmp_path / "a.txt", "one")
    write_text(own, "two")
    assert own.read_text() == "two"
    (tmp_path / "b.txt").symlink_to(own)
    with pytest.raises(LinkError):
        write_text(tmp_path / "b.txt", "three")
    assert own.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # no temp file left
    with pytest.raises(LinkError):
        check_no_links(tmp_path)


# ------------------------------------------------------------------ links in a run's own folder
# What gpubench or Hydra writes for a run or a sweep: the run folder is refused before anything is
# written (the callback runs before Hydra's run_job), and gpubench's writers refuse a link each.
RUN_FILES = ("gpu_metrics.csv", "gpubench.log", "run.png", "results.json", "resolved_config.yaml",
             "mlflow.json", "mlflow.claim", "sweep.json", "multirun.yaml")
RUN_DIRS = (".hydra", "report", "traces", "compute")


def victims(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "victim").write_text("precious")
    return outside / "victim", outside / "folder"


def refused(call, config) -> str:
    with pytest.raises(SystemExit) as e:
        call(config)
    assert isinstance(e.value.code, ConfigError), e.value.code
    return str(e.value.code)


@pytest.mark.parametrize("name", RUN_FILES + RUN_DIRS)
def test_a_run_folder_holding_a_link_is_refused_before_anything_is_written(compose_cfg, tmp_path,
                                                                           name):
    victim, folder = victims(tmp_path)
    run = tmp_path / "outputs" / "run"
    run.mkdir(parents=True)
    (run / name).symlink_to(folder if name in RUN_DIRS else victim)
    cfg = compose_cfg(f"hydra.run.dir={run}", hydra=True)
    msg = refused(MlflowSweepCallback().on_run_start, cfg)
    assert msg.startswith(f"hydra.run.dir='{run}' is not allowed: it must be a folder holding no symbolic link")
    assert f"{run / name}: a symbolic link (to {victim if name not in RUN_DIRS else folder})" in msg
    assert "\n" not in msg
    assert victim.read_text() == "precious" and not any(folder.iterdir())


def test_a_sweep_folder_is_refused_for_a_link_in_any_job_s_folder(compose_cfg, tmp_path):
    victim, folder = victims(tmp_path)
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    cfg = compose_cfg(f"hydra.sweep.dir={sweep}", hydra=True)
    MlflowSweepCallback().on_multirun_start(cfg)  # a folder of its own: the sweep starts
    (sweep / "0" / "gpubench.log").symlink_to(victim)  # a resumed sweep's job
    assert f"{sweep / '0' / 'gpubench.log'}: a symbolic link" in refused(
        MlflowSweepCallback().on_multirun_start, cfg)
    (sweep / "0" / "gpubench.log").unlink()
    (sweep / "1").symlink_to(folder)  # where the next job's folder goes
    assert f"{sweep / '1'}: a symbolic link" in refused(MlflowSweepCallback().on_multirun_start, cfg)
    assert victim.read_text() == "precious" and not any(folder.iterdir())


def test_a_run_folder_reached_through_a_link_is_the_user_s_choice(compose_cfg, tmp_path):
    """The rule is about links inside the folder: `outputs -> /big/disk` is where the user
    keeps runs."""
    (tmp_path / "disk" / "run").mkdir(parents=True)
    (tmp_path / "outputs").symlink_to(tmp_path / "disk")
    MlflowSweepCallback().on_run_start(compose_cfg(f"hydra.run.dir={tmp_path / 'outputs' / 'run'}",
                                                   hydra=True))


def test_the_gpu_log_and_the_run_picture_refuse_a_link(tmp_path):
    """Written in place while the run goes (the csv) or by the report (run.png): each refuses a
    link put in its place after the folder was checked."""
    from gpubench.report.runplot import plot_run
    from gpubench.telemetry.gpulog import GpuLog

    victim, _ = victims(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "gpu_metrics.csv").symlink_to(victim)
    with pytest.raises(LinkError):
        GpuLog("cpu", run).start()
    (run / "run.png").symlink_to(victim)
    rec = RunRecord.from_dict({"status": "ok", "phases": {"loader": {
        "phase": "loader", "batch_size": 4, "images_per_sec": 250.0}}}, run)
    with pytest.raises(LinkError):
        plot_run(rec, run)
    assert victim.read_text() == "precious"
    assert plot_run(rec, tmp_path / "own").stat().st_size > 0  # a folder of its own: drawn


def test_sync_does_not_claim_a_run_through_a_linked_claim_file(tmp_path):
    from gpubench.tracking.runs import upload_claim

    victim, _ = victims(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "mlflow.claim").symlink_to(victim)
    with pytest.raises(LinkError), upload_claim(run):  # sync says `not uploaded` for an OSError
        pass
    assert victim.read_text() == "precious"


@pytest.mark.slow  # the whole command: Hydra's own writes come before the task
def test_the_cli_writes_nothing_through_links_in_its_run_or_sweep_folder(tmp_path):
    victim, folder = victims(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "gpu_metrics.csv").symlink_to(victim)
    (run / "gpubench.log").symlink_to(victim)
    (run / ".hydra").symlink_to(folder)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "0").symlink_to(folder)
    for args, key, where in ((("bench.steps=2",), "hydra.run.dir", run),
                             (("-m", "bench.steps=2,3"), "hydra.sweep.dir", sweep)):
        p = run_cli(*args, "tracking=none", "bench.device=cpu", f"{key}={where}", cwd=tmp_path)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr
        assert lines[0].startswith(f"gpubench: error: {key}='{where}' is not allowed"), lines
        assert victim.read_text() == "precious" and not any(folder.iterdir())


if sys.platform == "win32":  # symbolic links need privileges there
    pytestmark = pytest.mark.skip(reason="POSIX symbolic links")
