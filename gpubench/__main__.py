"""`gpubench`, the only Hydra entry point: returns the run's objective (a finite float any sweeper
can maximize); errors and signals end it with one line (gpubench.cli.errors)."""

from __future__ import annotations

import atexit
import gc
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import gpubench.cli
from gpubench.cli.errors import Exit, JobFailed, one_line_errors
from gpubench.config.errors import ConfigError
from gpubench.config.keys import Role
from gpubench.config.paths import CONFIG_DIR
from gpubench.config.schema import KEYS
from gpubench.core.exits import REJECTED, ExitCode, Refusal, quiet_broken_pipe
from gpubench.core.record import Status
from gpubench.core.secrets import say


def _multirun() -> bool:
    return HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="bench")
def main(cfg: DictConfig) -> float:
    try:
        return _job(cfg)
    except Exception as e:
        if _multirun():  # the sweeper counts a failed job (gpubench.search.jobs)
            raise
        raise JobFailed from e  # one line, from gpubench.cli.errors


def _job(cfg: DictConfig) -> float:
    from gpubench.run.runner import run_benchmark

    try:
        result = run_benchmark(cfg)
    except KeyboardInterrupt as e:  # a signal: the entry's one line names the run dir
        e.run_dir = HydraConfig.get().runtime.output_dir  # type: ignore[attr-defined]
        raise
    except ConfigError as e:
        if not _multirun():  # gpubench.cli.errors prints it as one line, BAD_INPUT
            raise
        say(str(e), "error")  # one bad job must not end a sweep
        REJECTED.append(Refusal(tuple(HydraConfig.get().overrides.task), str(e)))
        return 0.0
    _settle()
    code = {Status.oom: ExitCode.FAILED, Status.failed: ExitCode.FAILED,
            Status.over_ceiling: ExitCode.OVER_CEILING}.get(result.status)
    if code is None and result.tracked is False:  # measured and kept, but not in MLflow
        code = ExitCode.NOT_TRACKED
    if code is not None and not _multirun():  # a sweep's trial: finished
        raise Exit(code)
    return result.objective


def _settle() -> None:
    """After a job, free the run and freeze what survives: later collections skip torch's objects
    (0.17 s a pass on 2 cores). Never mid-run: frozen stays."""
    gc.collect()
    gc.freeze()


def help_config(*, _root_: DictConfig) -> str:
    """`--help`'s config (bench.yaml's hydra.help.template) without the test keys (Role.fault);
    `$` doubled: the template is a string.Template."""
    hidden = {"hydra"} | {k.name.partition(".")[0] for k in KEYS if k.knob.role is Role.fault}
    shown = OmegaConf.masked_copy(_root_, [k for k in _root_ if k not in hidden])
    return OmegaConf.to_yaml(shown).replace("$", "$$")


OmegaConf.register_new_resolver("gpubench_help_config", help_config, replace=True)


def team_first(argv: list[str]) -> list[str]:
    """`-cd DIR` made `--config-path DIR`, so DIR's files come before gpubench's (Hydra searches a
    --config-dir after them); not with an explicit --config-path. Sets TEAM_DIR either way: a
    second command in one process keeps no folder from the first."""
    out = list(argv)
    gpubench.cli.TEAM_DIR = None
    if any(a.partition("=")[0] in ("-cp", "--config-path") for a in out):
        return out
    for i, a in enumerate(out):
        flag, eq, folder = a.partition("=")
        if flag == "-cd" or ("--config-dir".startswith(flag) and flag.startswith("--config-d")):
            folder = folder if eq else (out[i + 1] if i + 1 < len(out) else "")
            if not os.path.isdir(folder):
                raise ConfigError("--config-dir", folder, "a folder of config files")
            gpubench.cli.TEAM_DIR = os.path.abspath(folder)
            out[i:i + (1 if eq else 2)] = ["--config-path", gpubench.cli.TEAM_DIR]
            break
    return out


def cli() -> None:
    # the collection at exit walks every object torch made (0.8 s on 2 cores; 0.15 s frozen): frozen
    # after every later handler (MLflow's, a sweep parent's), once however many commands run
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    from gpubench.cli.callbacks import EXIT

    EXIT.clear()  # this command's code only
    try:
        with quiet_broken_pipe(), one_line_errors():
            sys.argv[1:] = team_first(sys.argv[1:])
            main()
    except SystemExit as e:  # a sweep's parent run still open at exit ends by this code
        EXIT["code"] = e.code if isinstance(e.code, int) else ExitCode.FAILED
        raise
    finally:  # the jobs this command refused end with it (a later one in this process has its own)
        REJECTED.clear()


if __name__ == "__main__":
    cli()
