"""`python -m gpubench.check [overrides]`: whether gpubench's numbers hold on this machine."""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from gpubench.check import rules
from gpubench.check.rules import Judgement, Outcome
from gpubench.config.paths import CONFIG_DIR
from gpubench.config.settings import Settings, resolve
from gpubench.core.exits import ExitCode, quiet_broken_pipe
from gpubench.core.secrets import mask_secrets

USAGE = """usage: python -m gpubench.check [key=value ...]

Checks gpubench's figures on this machine, with the overrides a run takes
(model=resnet18 loader.batch_size=64 precision=amp_bf16 ...): compute and loader
phases against plain loops, the verdict on two cases with a known answer, and on
CUDA the NVML readings, the peak table and the window timing. Exit status 0 only
when every check that ran passed."""


def checks(cfg: DictConfig, s: Settings, out: Path) -> Iterator[Judgement]:
    import torch

    from gpubench.check.cases import compare, verdict_checks
    from gpubench.check.cuda import NAMES, cuda_checks

    seconds = []  # the plain loops' step and batch times
    for phase in ("compute", "loader"):
        j = compare(cfg, out, s, phase)
        yield j
        reference = j.figures.get("reference")
        seconds.append(s.loader.batch_size / reference if reference else None)
    yield from verdict_checks(cfg, s, out, *seconds)
    if s.device == "cuda":
        yield from cuda_checks(torch.cuda.current_device())
    else:
        yield from (rules.skipped(n, "no CUDA device") for n in NAMES)


def show(line: str) -> None:
    """A line folded at the terminal's width under the details' column (piped: whole)."""
    from rich.console import Console
    from rich.text import Text

    from gpubench.report.console import fold

    con = Console(highlight=False)
    if "\n" in line:  # the usage text: prose, its lines as written (not a check's columns)
        con.print(Text(line), soft_wrap=True)
        return
    for piece in fold(Text(line), con, rules.DETAIL_AT) if con.is_terminal else [Text(line)]:
        con.print(piece, soft_wrap=True)


def run_checks(cfg: DictConfig, emit: Callable[[str], None] = show,
               s: Settings | None = None) -> list[Judgement]:
    """All checks, each line to `emit` as judged (`s`: cfg resolved); ConfigError for bad input."""
    s = s or resolve(cfg)
    out: list[Judgement] = []
    with tempfile.TemporaryDirectory(prefix="gpubench-check-") as tmp:
        for j in checks(cfg, s, Path(tmp)):
            out.append(j)
            emit(rules.line(j))
    return out


def _error(line: str, code: int) -> int:
    # masked: Hydra's line quotes the override as typed, a tracking.uri's password with it
    print(f"gpubench check: error: {mask_secrets(line)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None, emit: Callable[[str], None] = show) -> int:
    from gpubench.cli.messages import describe
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        emit(USAGE)
        return ExitCode.OK
    if any(a in ("-m", "--multirun") for a in args):
        return _error("-m is not allowed: the check runs one configuration (no sweep)",
                      ExitCode.BAD_INPUT)
    t0 = time.perf_counter()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
            cfg = compose("bench", overrides=args)
        s = resolve(cfg)
        emit(f"gpubench check: {s.model._target_ or s.model.name} on {s.dataset.name} "
             f"{s.dataset.image_size}px, batch {s.loader.batch_size}, "
             f"{s.loader.num_workers} workers, {s.precision} | {s.device}")
        judged = run_checks(cfg, emit, s)
    except KeyboardInterrupt:
        return _error("interrupted", ExitCode.SIGINT)
    except Exception as e:  # bad input (ours, Hydra's, OmegaConf's): one line, as the CLI's
        line, code = describe(e, args)
        if code != ExitCode.BAD_INPUT:
            raise
        return _error(line, code)
    n = Counter(j.status for j in judged)
    open_ = f"{n[Outcome.inconclusive]} inconclusive, " if n[Outcome.inconclusive] else ""
    emit(f"{n[Outcome.passed]} passed, {n[Outcome.failed]} failed, {open_}"
         f"{n[Outcome.skipped]} skipped in {time.perf_counter() - t0:.0f} s")
    return rules.exit_code(judged)


def cli() -> None:
    with quiet_broken_pipe():
        code = main()
    sys.exit(code)
