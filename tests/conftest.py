"""Shared fixtures: compose real configs with Hydra's compose API, shrunk to a tiny CPU run."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from gpubench.config.paths import CONFIG_DIR

ROOT = Path(__file__).resolve().parent.parent

# `from tests.conftest import ...` would load a second copy of this module, whose record of
# the running test (_RUNNING) is empty: both names are this one module
sys.modules.setdefault("tests.conftest", sys.modules[__name__])

# One torch thread per process (set before any test imports torch; workers and subprocesses
# inherit it): the suite runs two workers, each starting `python -m gpubench` runs, and torch's
# default of one thread per core made them spin against each other for the same two cores
# (on the 2-core box: about a quarter more CPU and wall time). An explicit setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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


# Every configuration a `gpu` test composes, declared at its module's top through gpu_config:
# the CPU suite resolves each one as a CUDA machine would (tests/test_gpu_configs.py), so a
# rule change that would refuse one fails here rather than first on a lent GPU. `{tmp}` in a
# value stands for the test's tmp_path (at(); the CPU check fills such a folder with images).
GPU_CONFIGS: dict[str, tuple[str, ...]] = {}


def gpu_config(name: str, *overrides: str) -> tuple[str, ...]:
    """Register the overrides a `gpu` test composes (TINY comes first, as compose_config adds
    it) under `name`, and return them."""
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
    """Split Hydra overrides into group choices and the `key=value` changes applied after the
    defaults are composed; None where any is something else (a sweep, +, ~, a package)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    groups, values = [], []
    for line, o in zip(overrides, OverridesParser.create().parse_overrides(list(overrides)),
                       strict=True):
        if o.type != OverrideType.CHANGE or o.package is not None or o.is_sweep_override():
            return None
        key = o.key_or_group
        if key.split(".")[0].split("/")[0] == "hydra" or isinstance(o.value(), dict):
            return None  # Hydra reads some while composing (hydra.searchpath); `model={...}`
            # on a group is a value Hydra applies in command-line order
        if "." not in key and (CONFIG_DIR / key).is_dir():
            groups.append(line)  # `model=tiny`: a choice in the defaults list
        else:
            values.append(o)
    return tuple(groups), values


def _with_values(groups: tuple[str, ...], values: list):
    """The composed group choices (composed once, a copy each time) with the value changes
    applied as Hydra applies them; raises what OmegaConf raises."""
    import copy

    from omegaconf import OmegaConf

    if groups not in _BASES:
        _BASES[groups] = _compose(groups, False)
    cfg = copy.deepcopy(_BASES[groups])
    for o in values:
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    return cfg


def compose_config(*overrides: str, hydra: bool = False, tiny: bool = True):
    """The config `python -m gpubench OVERRIDES` composes (TINY first unless `tiny=False`).

    Composing from the YAML files costs 0.1 s, a third of the quick suite's time over some
    360 calls. So the group choices are composed once and kept, and value changes applied to
    a copy the way Hydra's compose applies them after its defaults (its override grammar,
    then OmegaConf.update with merge: hydra/_internal/config_loader_impl.py
    _apply_overrides_to_config). Anything else, or a value that fails to apply, composes the
    whole config, so errors are Hydra's own. test_config checks both give the same config.
    With its hydra node (`hydra=True`) a config is composed once per override list and
    folder, and each call gets a copy."""
    import copy

    full = (*(TINY if tiny else []), *overrides)
    if hydra:  # the hydra node names the overrides and the folder: kept whole, by both
        key = (full, os.getcwd())
        if key not in _WHOLE:
            _WHOLE[key] = _compose(full, True)
        return copy.deepcopy(_WHOLE[key])
    split = _value_overrides(full)
    if split is None:
        return _compose(full, hydra)
    try:
        return _with_values(*split)
    except Exception:  # Hydra words its own failures: compose, for its exception
        return _compose(full, False)


def pytest_xdist_auto_num_workers(config) -> int:
    """Workers for `-n auto` (the default, pyproject's addopts): one per core, at least 2 (the
    slow tests mostly wait on subprocesses and servers), at most 8 (each worker may start a
    server and `python -m gpubench` runs of its own)."""
    return min(8, max(2, os.cpu_count() or 1))


# fixtures that start a real server: a test using one is `slow` whether or not it says so
SERVER_FIXTURES = {"mlflow_server"}


def pytest_collection_modifyitems(config, items):
    """Tests on a real server are `slow` (this runs before `-m` selects), and the slow tests
    run first: the long ones start at once on every worker and the many short ones fill the
    gaps at the end, rather than one long test left running alone. `gpu` tests need CUDA:
    skipped (not failed) on machines without it, like CI."""
    import torch

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # stable: file order kept within each part
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """What collection imported (torch, torchvision, Hydra, every test module) is frozen out of
    the collector's sight: each run a test makes in this process collects once to free device
    memory, and that pass then walks what the run created, not all of torch (gpubench's entry
    freezes the same way after a job). Nothing frozen is ever freed; nothing here needs to be."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture
def compose_cfg():
    return compose_config


# the test now running (pytest_runtest_protocol): what starts a process checks it is `slow`
_RUNNING: list = []


def pytest_runtest_protocol(item, nextitem):
    _RUNNING.append(item)


def pytest_runtest_logfinish(nodeid, location):
    _RUNNING.clear()


# what starts a process, as the interpreter's audit events name it (PEP 578): a quick test
# that starts one by any path (DataLoader workers, a subprocess, a library's helper) fails, not
# only one that goes through the helpers below
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                             "os.spawn", "os.system", "os.exec"})
_STARTED: list[str] = []


def _audit(event: str, args) -> None:
    if event in _PROCESS_EVENTS and _RUNNING and _RUNNING[-1].get_closest_marker("slow") is None:
        _STARTED.append(event)


sys.addaudithook(_audit)
# Python asks `uname -p` (a process) the first time anything reads the processor, as MLflow's
# telemetry module does at import: asked once here, before any test, so no quick test is
# blamed for a library's first import
platform.uname().processor  # noqa: B018


@pytest.fixture(autouse=True)
def _quick_tests_start_no_process(request):
    _STARTED.clear()
    yield
    if _STARTED and request.node.get_closest_marker("slow") is None:
        pytest.fail(f"{request.node.nodeid} started a process ({_STARTED[0]}): mark it "
                    "@pytest.mark.slow", pytrace=False)


def _must_be_slow(what: str) -> None:
    """Starting a process, a server or the zygote makes a test `slow` (README: `pytest -m
    "not slow"` is the quick, in-process part): one that is not marked fails here, naming it."""
    if _RUNNING and _RUNNING[-1].get_closest_marker("slow") is None:
        pytest.fail(f"{_RUNNING[-1].nodeid} starts {what}: mark it @pytest.mark.slow",
                    pytrace=False)


def cli_env(env: dict | None = None) -> dict:
    """The environment a CLI test's command gets: the test's own, less HYDRA_FULL_ERROR."""
    e = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    e.update(PYTHONUNBUFFERED="1", **(env or {}))
    return e


def start_cli(*args: str, cwd: Path, env: dict | None = None, module: str = "gpubench",
              **popen):
    """`python -m MODULE ARGS` started as its own process by the test run's zygote
    (tests/zygote.py: a forked child of a process that imported torch once), used like
    `subprocess.Popen` (stdout/stderr as Popen takes them); `code=CODE`: `python -c CODE
    ARGS`."""
    from tests.zygote import zygote

    _must_be_slow(f"`python -m {module}`")
    return zygote().popen(module, args, cwd=cwd, env=cli_env(env), **popen)


def torchrun(*args: str, cwd: Path, nproc: int = 2, timeout: float = 300):
    """`torchrun --standalone --nproc_per_node=N -m gpubench ARGS`: torchrun itself forked
    from the zygote, and each rank it starts a `tests/zygote_client.py` that has the zygote
    fork the rank (torchrun still starts, watches, signals and ends every rank process)."""
    from tests.zygote import zygote

    _must_be_slow("torchrun")
    z = zygote()
    return run_cli("--standalone", f"--nproc_per_node={nproc}",
                   str(ROOT / "tests" / "zygote_client.py"), "gpubench", *args,
                   module="torch.distributed.run", cwd=cwd, timeout=timeout,
                   env={"GPUBENCH_ZYGOTE": z.path, "GPUBENCH_ZYGOTE_PID": str(z.pid)})


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300,
            module: str = "gpubench", fresh: bool = False,
            **limits) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` as a process of its own, from `cwd` (outputs land under it).
    `fresh`: a new interpreter rather than the zygote's fork, for a test of what the command
    imports or how a new interpreter starts. `limits`: start_cli's affinity and fsize."""
    if fresh:
        _must_be_slow(f"a fresh `python -m {module}`")
        return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=cli_env(env),
                              capture_output=True, text=True, timeout=timeout)
    proc = start_cli(*args, cwd=cwd, env=env, module=module, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True, **limits)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ------------------------------------------------------------------ MLflow (tests/test_tracking.py)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def _template_store() -> Path:
    """This process' MLflow sqlite store, migrated, without its default experiment."""
    import contextlib
    import sqlite3
    import tempfile

    from mlflow.tracking import MlflowClient

    t = Path(tempfile.mkdtemp(prefix="store-", dir=os.environ.get(SHARED_ENV))) / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{t}").search_experiments()
    with contextlib.closing(sqlite3.connect(t)) as db, db:  # closed, after its commit
        db.execute("DELETE FROM experiments WHERE experiment_id = 0")
    return t


def sqlite_store(path: Path) -> str:
    """The URI of an MLflow sqlite store at `path`, as MLflow makes one on first use, without
    its 1.2 s of schema migrations each time (11 stores: 13 s of the quick suite): a store is
    migrated once per test process, its default experiment deleted, and copied; MLflow then
    finds its schema current and creates the default experiment itself (its artifacts under
    the folder the store is opened from, as a new store's). Where creating the store is what
    a test checks, it lets gpubench make it."""
    import shutil

    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template_store(), path)
    return f"sqlite:///{path}"


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1: sqlite backend, artifacts proxied into its own
    folder. It is started at once; `url` waits for /health (10-20 s here), so tests that do
    not need it run while it boots."""

    def __init__(self, root: Path, args: tuple[str, ...] = (), env: dict | None = None,
                 attach: dict | None = None):
        self.root = root
        self.artifacts = root / "artifacts"
        self.log = root / "server.log"
        self._up = False
        if attach is not None:  # one another test worker started (shared())
            self.port, self.pid, self.proc = attach["port"], attach["pid"], None
            return
        self.port = free_port()
        # no job workers; `args`/`env` for variants such as the basic-auth app
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

    def _alive(self) -> bool:
        from tests.zygote import alive

        return alive(self.pid, self.proc)

    @property
    def url(self) -> str:
        import time
        import urllib.request

        base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while not self._up:
            if not self._alive() or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not come up:\n{self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).close()
                self._up = True
            except OSError:
                time.sleep(0.3)
        return base

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its worker processes share its (new) session
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


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

SHARED_ENV = "GPUBENCH_TESTS_SHARED"  # the folder; set by the run's first process


def pytest_configure(config):
    """The process that runs the session (xdist's controller, or the only process with -n 0)
    makes the folder every worker's shared() resources live in: workers inherit it. A worker
    registers its quick end (_end_quickly) before the libraries the tests import register
    theirs."""
    if hasattr(config, "workerinput"):
        import atexit

        atexit.register(_end_quickly)
    if not hasattr(config, "workerinput") and SHARED_ENV not in os.environ:
        import tempfile

        # a Unix socket's path holds at most 107 bytes: a long TMPDIR gives way to /tmp
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) < 60 else "/tmp"
        os.environ[SHARED_ENV] = config._gpubench_shared = tempfile.mkdtemp(
            prefix="gpubench-tests-", dir=base)


_DONE: list = []  # set once a worker has finished its session (pytest_unconfigure)


def _end_quickly() -> None:
    """An xdist worker's exit handler, registered as it is configured: it runs after those
    of everything imported later (torch, MLflow, matplotlib: exit handlers run last-registered
    first) and skips the few registered before it (logging's flush, done here by hand). Once
    the worker has finished, it ends without freeing every module, which took about 3 s of
    the quick suite's ~70, time the session waits for. Its status is not read: its results
    went over its channel before, and a worker that fails before finishing exits as usual."""
    if _DONE and "coverage" not in sys.modules:  # coverage.py saves its data at exit
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _finish_worker() -> None:
    """pytest's own end of a process collects five times over (its check for exceptions
    raised in __del__): 3 s in a worker, over everything its runs left behind. One collection
    still reports those exceptions (the hook is pytest's until after it); what is left is then
    frozen, and pytest's five go quickly."""
    import gc

    gc.collect()
    gc.freeze()
    _DONE.append(True)


def pytest_unconfigure(config):
    """After every worker has finished: stop what shared() started, then drop the folder. A
    worker ends quickly (_finish_worker, _end_quickly)."""
    import json
    import shutil
    import signal
    import time

    from tests.zygote import alive

    if hasattr(config, "workerinput"):
        _finish_worker()
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
            try:
                os.killpg(pid, sig)  # each runs in a session of its own: its children too
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 20
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(
                alive(p) for p in pids):
            time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(SHARED_ENV, None)


def shared(name: str, start) -> dict:
    """A resource the whole test run shares (a server, the zygote), started once by whichever
    worker asks first: `start(folder)` starts it in a session of its own and returns what
    others need to reach it (a dict with its `pid`); the others read that back. The session's
    own process stops it when every worker is done (pytest_unconfigure)."""
    import fcntl
    import json

    folder = Path(os.environ[SHARED_ENV])
    info = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starts it, the others wait, then read
        if not info.exists():
            tmp = info.with_suffix(".tmp")
            tmp.write_text(json.dumps(start(folder / name)))
            tmp.rename(info)
        return json.loads(info.read_text())


def start_two_job_sweep(tmp: Path, *overrides: str):
    """`python -m gpubench -m` of two jobs (batch 4, then 8) whose phases last their 2 s cap,
    in its own process group (as under a scheduler); returns (process, the second job's
    results.json) once that job has measured its first phase: a moment inside the sweep
    for a signal or a fault."""
    import json
    import time

    proc = start_cli(
        "-m", *[o for o in TINY if o != "tracking=none"],
        *overrides, "loader.batch_size=4,8", "bench.steps=1000000", "bench.max_seconds=2",
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        for f in tmp.glob("outputs/multirun/*/*/1/results.json"):
            try:
                if "loader" in json.loads(f.read_text())["phases"]:
                    return proc, f
            except ValueError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the second job never wrote its first phase: {proc.communicate()}")
