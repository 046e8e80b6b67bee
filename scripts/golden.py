"""Golden outputs: what gpubench shows for fixed inputs, written to a folder so two versions of
the code can be compared byte for byte (`diff -r`). tests/test_golden.py compares the in-process
part with tests/golden/expected/ on every test run.

    python scripts/golden.py OUT            # in-process outputs (fast)
    python scripts/golden.py OUT --cli      # and the one-line errors of the CLI (subprocesses)

What it writes:
- console.txt: a fixed run record (tests/golden/fixtures/run.json) rendered by the console;
- mlflow.json: that record's MLflow params, metrics, tags, run name and description;
- config.json: results.json's `config` for several override sets (resolved settings);
- errors.txt: the one line and exit code of bad inputs, composed and resolved in-process;
- report/: the report written from a fixed sweep folder (text files; pictures by name only);
- cli_errors.txt (--cli): the same bad inputs and some sweeper ones through `python -m gpubench`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "golden" / "fixtures"
FIXED_MTIME_NS = 1_764_000_000 * 10**9  # the fixtures' files, as copied for the report

TINY = ["model=tiny", "dataset.image_size=16", "dataset.num_classes=10",
        "dataset.num_samples=32", "loader.batch_size=4", "loader.num_workers=0",
        "bench.device=cpu", "bench.warmup_steps=1", "bench.warmup_max_steps=1", "bench.steps=2",
        "bench.monitor_interval_s=0.05", "tracking=none"]

CONFIGS = [
    [],
    ["precision=amp_bf16", "channels_last=true", "loader.num_workers=2"],
    ["model=resnet18", "dataset.image_size=32", "loader.batch_size=16", "bench.repeats=3"],
    ["dataset=fake_jpeg", "loader.pin_memory=false", "loader.prefetch_factor=4",
     "loader.num_workers=1"],
    ["memory.ceiling=0.5", "bench.phases=[loader,e2e]"],
    ["tracking=mlflow", "tracking.uri=http://user:secret@127.0.0.1:5000"],
]

BAD = [
    ["loader.batch_size=0"],
    ["loader.batch_size=-3"],
    ["loader.batch_size=abc"],
    ["loader.num_workers=-1"],
    ["loader.prefetch_factor=0", "loader.num_workers=2"],
    ["loader.pin_memory=maybe"],
    ["dataset.image_size=0"],
    ["dataset.image_size=1.5"],
    ["dataset.num_classes=0"],
    ["dataset.num_samples=-5"],
    ["dataset=nosuch"],
    ["model=nosuch"],
    ["precision=fp8"],
    ["bench.steps=0"],
    ["bench.repeats=0"],
    ["bench.warmup_steps=-1"],
    ["bench.device=tpu"],
    ["bench.device=cuda"],
    ["bench.phases=[loader,nosuch]"],
    ["bench.phases=[]"],
    ["memory.ceiling=1.5"],
    ["memory.ceiling=0"],
    ["compile=maybe"],
    ["channels_last=yes please"],
    ["tracking.uri=ftp://x"],
    ["tracking.uri=http://"],
    ["tracking=nosuch"],
    ["loader.batchsize=32"],
    ["+loader.nosuch=1"],
    ["dataset=imagefolder", "dataset.root=/nonexistent/folder"],
    ["bench.optimizer=adamw_nope"],
    ["loader.num_workers=100000"],
]

SWEEP_BAD = [
    ["loader.batch_size=0,4"],
    ["loader.batchsize=4,8"],
    ["sweep=throughput", "hydra.sweeper.n_trials=0"],
    ["sweep=throughput", "hydra.sweeper.seed=-1"],
]


def _imp(*names: str):
    """The first of `names` that imports (module paths moved once; the outputs did not)."""
    import importlib

    for n in names:
        try:
            return importlib.import_module(n)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names[-1])


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    cfgmod = _imp("gpubench.config.paths", "gpubench.config.schema")
    with initialize_config_dir(version_base="1.3", config_dir=str(cfgmod.CONFIG_DIR)):
        return compose("bench", overrides=[*TINY, *overrides])


def _fixture_record():
    record = _imp("gpubench.core.record")
    return record.RunRecord.from_dict(json.loads((FIXTURES / "run.json").read_text()),
                                      run_dir=Path("RUN"))


def console_text() -> str:
    from rich.console import Console

    console = _imp("gpubench.report.console")
    buf = io.StringIO()
    con = Console(file=buf, width=160, highlight=False, color_system=None)
    console.print_result(_fixture_record(), console=con)
    return buf.getvalue()


def mlflow_json() -> str:
    T = _imp("gpubench.tracking.translate")
    rec = _fixture_record()
    out = {
        "params": T.run_params(rec),
        "metrics": [list(m[:3]) for m in T.run_metrics(rec, now_ms=1)],
        "tags": T.run_tags(rec, overrides="model=tiny loader.batch_size=4", user="someone"),
        "name": T.run_name(rec),
        "description": T.describe(rec, run_id="0123456789abcdef", picture=True),
    }
    return json.dumps(out, indent=1, sort_keys=True, default=str)


def config_json() -> str:
    settings = _imp("gpubench.config.settings")
    out = []
    for ov in CONFIGS:
        s = settings.resolve(_compose(ov))
        out.append({"overrides": ov, "config": json.loads(json.dumps(settings.plain(s.config),
                                                                     default=str))})
    return json.dumps(out, indent=1)


def errors_text() -> str:
    settings = _imp("gpubench.config.settings")
    errors = _imp("gpubench.cli.messages", "gpubench.cli.errors")
    lines = []
    for ov in BAD:
        try:
            s = settings.resolve(_compose(ov))
            settings.check_resources(s)
            lines.append(f"{' '.join(ov)}\n  -> accepted")
        except Exception as e:  # noqa: BLE001 - every error is a golden line
            msg, code = errors.describe(e, ov)
            lines.append(f"{' '.join(ov)}\n  -> {int(code)} {msg}")
    return "\n".join(lines) + "\n"


def report_dir(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "sweep"
        shutil.copytree(FIXTURES / "sweep", src)
        for f in src.rglob("*"):  # a checkout's own times would reach the report's fingerprint
            os.utime(f, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
        rep = Path(tmp) / "rep"
        p = subprocess.run([sys.executable, "-m", "gpubench.report", str(src), "--out", str(rep)],
                           capture_output=True, text=True, cwd=tmp,
                           env={**os.environ, "COLUMNS": "160"})
        out.mkdir(parents=True, exist_ok=True)
        text = (p.stdout + "\n--- stderr\n" + p.stderr + f"\n--- exit {p.returncode}\n")
        (out / "stdout.txt").write_text(text.replace(tmp, "TMP"))
        for f in sorted(rep.rglob("*")):
            if f.is_file():
                rel = f.relative_to(rep)
                dst = out / "files" / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                if f.suffix == ".png":
                    dst.with_suffix(".png.txt").write_text("a picture\n")
                else:
                    dst.write_text(f.read_text().replace(tmp, "TMP"))


def _cli(ov: list[str], multirun: bool) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
        p = subprocess.run([sys.executable, "-m", "gpubench", *(["-m"] if multirun else []),
                            *TINY, *ov], capture_output=True, text=True, cwd=tmp, env=env,
                           timeout=300)
        last = [ln for ln in p.stderr.splitlines() if ln.strip()][-1:] or ["(no stderr)"]
        return f"{'-m ' if multirun else ''}{' '.join(ov)}\n  -> {p.returncode} {last[0]}"


def cli_errors() -> str:
    jobs = [(ov, False) for ov in BAD] + [(ov, True) for ov in SWEEP_BAD]
    with ThreadPoolExecutor(2) as pool:
        lines = list(pool.map(lambda j: _cli(*j), jobs))
    return "\n".join(lines) + "\n"


def write(out: Path, cli: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "console.txt").write_text(console_text())
    (out / "mlflow.json").write_text(mlflow_json())
    (out / "config.json").write_text(config_json())
    (out / "errors.txt").write_text(errors_text())
    report_dir(out / "report")
    if cli:
        (out / "cli_errors.txt").write_text(cli_errors())


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):  # `golden.py --cli` wrote a folder --cli/
        sys.exit("usage: python scripts/golden.py OUT [--cli]")
    write(Path(sys.argv[1]), cli="--cli" in sys.argv[2:])
