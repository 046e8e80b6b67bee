"""Shared fixtures: compose real configs with Hydra's compose API, shrunk to a tiny CPU run."""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import gc
import io
import json
import logging
import os
import platform
import resource
import runpy
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from gpubench.config.paths import CONFIG_DIR

ROOT = Path(__file__).resolve().parent.parent
SHARED_ENV = "GPUBENCH_TESTS_SHARED"  # shared()'s folder, made by pytest_configure

# One torch thread per process (an explicit setting wins): with one per core, two workers' runs
# spun against each other on 2 cores (a quarter more CPU and wall time).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["PYTHONUNBUFFERED"] = "1"  # tests read what a command prints while it runs
# Bytecode cached even where the environment says not to: else every worker and every command a
# slow test starts compiles gpubench and the test modules anew.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# A run that takes well under a second on a slow 2-core CPU: tiny CNN, 16 px, 2 measured steps.
TINY = [
    "model=tiny",
    "dataset.image_size=16",
    "dataset.num_classes=10",
    "dataset.num_samples=32",
    "loader.batch_size=4",
    "loader.num_workers=0",
    "bench.device=cpu",
    "bench.warmup_steps=1",
    "bench.warmup_max_steps=1",
    "bench.steps=2",
    "bench.monitor_interval_s=0.05",
    "tracking=none",
]

# Every configuration a `gpu` test composes, by name: tests/gpu/test_gpu_configs.py resolves each
# as a CUDA machine would, so a rule that would refuse one fails on the CPU suite, not first on a
# lent GPU. `{tmp}` in a value stands for the test's tmp_path (at()).
GPU_CONFIGS: dict[str, tuple[str, ...]] = {}


def gpu_config(name: str, *overrides: str) -> tuple[str, ...]:
    """Register (under `name`) and return the overrides a `gpu` test composes after TINY."""
    if GPU_CONFIGS.setdefault(name, overrides) != overrides:
        raise ValueError(f"two gpu configurations named {name}")
    return overrides


def at(overrides: tuple[str, ...], tmp: Path) -> tuple[str, ...]:
    """A registered configuration with `{tmp}` replaced by a test's folder."""
    return tuple(o.replace("{tmp}", str(tmp)) for o in overrides)


def _compose(overrides: tuple[str, ...], hydra: bool):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        return compose("bench", overrides=list(overrides), return_hydra_config=hydra)


_BASES: dict = {}  # composed configs of group choices alone, by override list
_WHOLE: dict = {}  # configs composed with their hydra node, by overrides and folder


def _value_overrides(overrides: tuple[str, ...]):
    """(group choices, `key=value` changes), or None for any other override (sweep, +, ~, @)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    groups, values = [], []
    for line, o in zip(overrides, OverridesParser.create().parse_overrides(list(overrides)),
                       strict=True):
        if o.type != OverrideType.CHANGE or o.package is not None or o.is_sweep_override():
            return None
        key = o.key_or_group
        if key.split(".")[0].split("/")[0] == "hydra" or isinstance(o.value(), dict):
            return None  # Hydra reads hydra.* while composing; `model={...}` applies in order
        if "." not in key and (CONFIG_DIR / key).is_dir():
            groups.append(line)  # `model=tiny`: a defaults-list choice
        else:
            values.append(o)
    return tuple(groups), values


def _with_values(groups: tuple[str, ...], values: list):
    """A copy of the group choices' config (composed once) with the value changes applied as
    Hydra applies them (OmegaConf.update with merge: config_loader_impl
    ._apply_overrides_to_config); raises what OmegaConf raises."""
    from omegaconf import OmegaConf

    if groups not in _BASES:
        _BASES[groups] = _compose(groups, False)
    cfg = copy.deepcopy(_BASES[groups])
    for o in values:
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    return cfg


def compose_config(*overrides: str, hydra: bool = False, tiny: bool = True):
    """The config `python -m gpubench OVERRIDES` composes (TINY first unless `tiny=False`).
    Composing costs 0.1 s (a third of the quick suite): value changes take _with_values;
    anything else, or a failing change, composes the whole config, so errors are Hydra's own
    (test_config checks both agree)."""
    full = (*(TINY if tiny else []), *overrides)
    if hydra:
        key = (full, os.getcwd())
        if key not in _WHOLE:
            _WHOLE[key] = _compose(full, True)
        return copy.deepcopy(_WHOLE[key])
    split = _value_overrides(full)
    if split is None:
        return _compose(full, False)
    try:
        return _with_values(*split)
    except Exception:  # Hydra words its own failures: compose, for its exception
        return _compose(full, False)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker more than cores, at most 8 (slow tests mostly wait; 2 cores,
    2026-12-03: 331 s with 2 workers, 286 s with 3, 300 s with 4)."""
    return min(8, (os.cpu_count() or 1) + 1)


def pytest_collection_modifyitems(config, items):
    """Tests on the real server are `slow`; slow tests run first (short ones fill the gaps at
    the end); `gpu` tests are skipped without CUDA."""
    import torch

    for item in items:
        if "mlflow_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Frozen: a run's collection (freeing device memory) then walks only what the run made."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def compose_cfg():
    return compose_config


# the test now running: what starts a process checks it is `slow`
_RUNNING: list = []


def pytest_runtest_protocol(item, nextitem):
    _RUNNING.append(item)


def pytest_runtest_logfinish(nodeid, location):
    """After each test: collected, the rest frozen, so a run's own gc.collect() walks that run's
    objects, not the session's (4.2 s of 19.6 s in three run-heavy modules)."""
    _RUNNING.clear()
    gc.collect()
    gc.freeze()


# Process starts as audit events name them (PEP 578): a quick test starting one by any path
# (DataLoader workers, a subprocess, a library's helper) fails.
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                             "os.spawn", "os.system", "os.exec"})
_STARTED: list[str] = []


def _audit(event: str, args) -> None:
    if event in _PROCESS_EVENTS and _RUNNING and _RUNNING[-1].get_closest_marker("slow") is None:
        _STARTED.append(event)


sys.addaudithook(_audit)
# Processes libraries start once, done here so no quick test is blamed: the first read of the
# processor runs `uname -p` (MLflow's telemetry at import); matplotlib's first import on a
# machine builds its font cache with `fc-list` (its plotting tests import it in every worker).
platform.uname().processor  # noqa: B018
import matplotlib.font_manager  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _quick_tests_start_no_process(request):
    _STARTED.clear()
    yield
    if _STARTED and request.node.get_closest_marker("slow") is None:
        pytest.fail(f"{request.node.nodeid} started a process ({_STARTED[0]}): mark it "
                    "@pytest.mark.slow", pytrace=False)


def _must_be_slow(what: str) -> None:
    """Starting a process from a test not marked `slow` fails it, before the process starts."""
    if _RUNNING and _RUNNING[-1].get_closest_marker("slow") is None:
        pytest.fail(f"{_RUNNING[-1].nodeid} starts {what}: mark it @pytest.mark.slow",
                    pytrace=False)


def cli_env(env: dict | None = None) -> dict:
    """The environment a CLI test's command gets: the test's own, less HYDRA_FULL_ERROR."""
    e = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    e.update(env or {})
    return e


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as an interpreter shows it (pytest's own handler records it instead)."""
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


# the warning filters a new interpreter starts with (Python's defaults, no -W)
_DEFAULT_WARNINGS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                     ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                     ("ignore", ResourceWarning, ""))


def run_cli(*args: str, cwd: Path, env: dict | None = None,
            module: str = "gpubench") -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` run in this process by runpy from `cwd`: its exit status and what
    reached fds 1 and 2 (C code and forked workers too). What it sets for its process (env,
    folder, argv, sys.path, signal handlers, logging, warning filters, Hydra's config) is put
    back, the modules it imported from its folders forgotten."""
    from hydra.core.hydra_config import HydraConfig

    rc, env = 0, cli_env(env)
    paths = [os.path.join(cwd, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [os.path.abspath(cwd), *map(os.path.abspath, paths)]
    environ, folder, argv, path = dict(os.environ), os.getcwd(), sys.argv, list(sys.path)
    modules, factory = set(sys.modules), logging.getLogRecordFactory()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    kept = [(lg, list(lg.handlers), lg.level, lg.disabled)
            for lg in loggers if isinstance(lg, logging.Logger)]
    streams, fds = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            warnings.catch_warnings():
        for stream in streams:
            stream.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = (  # unbuffered, as PYTHONUNBUFFERED makes them
            io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), write_through=True,
                             errors=errors) for fd, errors in ((1, "strict"), (2, "backslashreplace")))
        warnings.resetwarnings()
        for action, category, where in reversed(_DEFAULT_WARNINGS):
            warnings.filterwarnings(action, category=category, module=where)
        warnings.showwarning = _print_warning
        # a test imported MODULE.__main__ for a part of it: runpy warns that it runs it again
        warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv, sys.path[:0] = [module, *map(str, args)], paths
        logging.getLogger().handlers[:] = []  # as a new interpreter starts (pytest's are on it)
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:  # as the interpreter reports it
            rc = e.code if e.code is None or isinstance(e.code, int) else 1
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = streams
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(folder)
            sys.argv, sys.path[:] = argv, path
            for name in set(sys.modules) - modules:  # imported from the command's own folders
                if any(str(getattr(sys.modules[name], "__file__", None)).startswith(p + os.sep)
                       for p in paths):
                    del sys.modules[name]
            logging.setLogRecordFactory(factory)
            for s, h in handlers.items():
                signal.signal(s, h)
            for lg, hs, level, disabled in kept:
                for h in set(lg.handlers) - set(hs):
                    h.close()  # a run's log file
                lg.handlers[:], lg.level, lg.disabled = hs, level, disabled
            HydraConfig.instance().cfg = None  # set by --help and --cfg, which run no job
        out.seek(0)
        err.seek(0)
        text = [f.read().decode(errors="replace") for f in (out, err)]
    return subprocess.CompletedProcess(["python", "-m", module, *args], rc or 0, *text)


def start_process(*args: str, cwd: Path, env: dict | None = None,
                  module: str | None = "gpubench", code: str | None = None,
                  affinity: list[int] | None = None, fsize: int | None = None,
                  **popen) -> subprocess.Popen:
    """`python -m MODULE ARGS` (`-c CODE` given `code`) in a new interpreter, for a test whose
    subject is the process; `affinity`: its cores, `fsize`: the largest file it may write."""
    _must_be_slow(f"`python -m {module}`")

    def limits() -> None:
        # SIGINT as a terminal's shell leaves it, so the interpreter makes it KeyboardInterrupt
        # (a shell running the suite in the background ignores it, and a child inherits that)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        if fsize is not None:  # writes past it fail (EFBIG), as on a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    how = ["-c", code] if code is not None else ["-m", module]
    return subprocess.Popen([sys.executable, *how, *map(str, args)], cwd=cwd,
                            env=cli_env(env), preexec_fn=limits, **popen)


def run_process(*args: str, cwd: Path, timeout: float = 300, **how) -> subprocess.CompletedProcess:
    """start_process's command run to its end: its status and what it printed."""
    proc = start_process(*args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, **how)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def torchrun(*args: str, cwd: Path, nproc: int = 2, timeout: float = 300):
    """`torchrun --standalone --nproc_per_node=N -m gpubench ARGS`."""
    return run_process("--standalone", f"--nproc_per_node={nproc}", "-m", "gpubench", *args,
                       module="torch.distributed.run", cwd=cwd, timeout=timeout)


def alive(pid: int, proc: subprocess.Popen | None = None) -> bool:
    """A process still runs: its Popen's word (which reaps it), else /proc, where a zombie has
    ended (a server whose parent worker exited is nobody's to reap here)."""
    if proc is not None:
        return proc.poll() is None
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def _template_store() -> Path:
    """This process' MLflow sqlite store, migrated, without its default experiment."""
    from mlflow.tracking import MlflowClient

    t = Path(tempfile.mkdtemp(prefix="store-", dir=os.environ.get(SHARED_ENV))) / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{t}").search_experiments()
    with contextlib.closing(sqlite3.connect(t)) as db, db:  # closed, after its commit
        db.execute("DELETE FROM experiments WHERE experiment_id = 0")
    return t


def sqlite_store(path: Path) -> str:
    """The URI of an MLflow sqlite store at `path`: a copy of one migrated per process (1.2 s of
    migrations a store); MLflow then creates the default experiment itself."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template_store(), path)
    return f"sqlite:///{path}"


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 (sqlite, artifacts proxied into its folder); `url`
    waits for /health (10-20 s); `attach`: the one another worker started (shared())."""

    def __init__(self, root: Path, args: tuple[str, ...] = (), env: dict | None = None,
                 attach: dict | None = None):
        self.artifacts = root / "artifacts"
        self.log = root / "server.log"
        self._up = False
        if attach is not None:
            self.port, self.pid, self.proc = attach["port"], attach["pid"], None
            return
        self.port = free_port()
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1",
                 "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                 "--artifacts-destination", str(self.artifacts), *args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        self.pid = self.proc.pid

    @property
    def url(self) -> str:
        import urllib.request

        base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while not self._up:
            if not alive(self.pid, self.proc) or time.monotonic() > deadline:
                log = self.log.read_text()[-3000:]
                raise RuntimeError(f"mlflow server did not come up:\n{log}")
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).close()
                self._up = True
            except OSError:
                time.sleep(0.3)
        return base


@pytest.fixture(scope="session")
def mlflow_server():
    """One server for the whole test run, whichever worker asks first (shared())."""
    def start(root: Path) -> dict:
        root.mkdir()
        srv = MlflowServer(root)
        return {"root": str(root), "port": srv.port, "pid": srv.pid}

    info = shared("mlflow_server", start)
    return MlflowServer(Path(info["root"]), attach=info)


# -------------------------------------------------- what every test worker of one run shares


def pytest_configure(config):
    """A worker registers _end_quickly before its libraries' exit handlers; the session's own
    process makes the folder of shared() resources, which workers inherit."""
    if hasattr(config, "workerinput"):
        atexit.register(_end_quickly)
    elif SHARED_ENV not in os.environ:
        # a Unix socket's path holds at most 107 bytes: a long TMPDIR gives way to /tmp
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) < 60 else "/tmp"
        os.environ[SHARED_ENV] = config._gpubench_shared = tempfile.mkdtemp(
            prefix="gpubench-tests-", dir=base)


_DONE: list = []  # set once a worker has finished its session (pytest_unconfigure)


def _end_quickly() -> None:
    """A finished worker's last exit handler (run after torch's, MLflow's, matplotlib's): skips
    freeing every module (3 s of the quick suite); its results already went to the session."""
    if _DONE and "coverage" not in sys.modules:  # coverage.py saves its data at exit
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def pytest_unconfigure(config):
    """A worker: one collection, then freeze (pytest's end collects five times over, 3 s).
    The session's process, after every worker: stop what shared() started, drop the folder."""
    if hasattr(config, "workerinput"):
        gc.collect()
        gc.freeze()
        _DONE.append(True)
    folder = getattr(config, "_gpubench_shared", None)
    if folder is None:
        return
    pids = []
    for info in Path(folder).glob("*.json"):
        try:
            pids.append(int(json.loads(info.read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)  # each runs in a session of its own: its children too
        deadline = time.monotonic() + 20
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(
                alive(p) for p in pids):
            time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(SHARED_ENV, None)


def shared(name: str, start) -> dict:
    """A resource the whole run shares, started once by whichever worker asks first:
    `start(folder)` starts it in a session of its own and returns a dict with its `pid`."""
    from filelock import FileLock

    folder = Path(os.environ[SHARED_ENV])
    info = folder / f"{name}.json"
    with FileLock(folder / f"{name}.lock"):  # one starts it, the others wait, then read
        if not info.exists():
            info.write_text(json.dumps(start(folder / name)))
        return json.loads(info.read_text())


def start_two_job_sweep(tmp: Path, *overrides: str):
    """`python -m gpubench -m` of two jobs (batch 4, 8) of 1 s phases in its own process group;
    returns (process, the second job's results.json) once that job measured a phase."""
    proc = start_process(
        "-m", *[o for o in TINY if o != "tracking=none"],
        *overrides, "loader.batch_size=4,8", "bench.steps=1000000", "bench.max_seconds=1",
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        for f in tmp.glob("outputs/multirun/*/*/1/results.json"):
            with contextlib.suppress(ValueError):
                if "loader" in json.loads(f.read_text())["phases"]:
                    return proc, f
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the second job never wrote its first phase: {proc.communicate()}")
