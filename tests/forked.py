"""`python -m MODULE ARGS` as a process of its own, without paying its imports each time.

A fresh interpreter paid about 3 s of imports on a 2-core machine (torch 1.4 s, torchvision
1.3 s) before each sub-second tiny run. multiprocessing's forkserver, one per test worker,
imports them once (PRELOAD) and forks a child per command, which becomes `python -m MODULE ARGS`:
its own pid, exit status, signals, cwd, environment, sys.path and streams, ending through the
interpreter's exit handlers (MLflow's, logging's). What differs: those modules are already
imported, so a variable read at import is the forkserver's (torch's thread count: the suite pins
one everywhere); a test of what a command imports runs a real `python` (run_cli(fresh=True)).
The forkserver is a fresh interpreter that starts no thread and never touches CUDA, so a child
inherits no held lock and no device context.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import os
import resource
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing import reduction

PRELOAD = ["torch", "torchvision", "torchvision.transforms.v2", "torchvision.models", "hydra",
           "omegaconf", "optuna", "mlflow", "matplotlib.pyplot", "psutil",
           "gpubench.run.runner", "gpubench.report.cli", "gpubench.report.plots",
           "gpubench.tracking.runs", "gpubench.search.loop",
           "hydra_plugins.gpubench_sweeper.sweeper", __name__]  # last: _warm() below
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)
_PATH = list(sys.path)  # in the forkserver: a new interpreter's, '' first (python -c)


def _warm() -> None:
    """In the forkserver, after the imports: fill the caches a process fills on its first run
    and keeps (Hydra's plugin scan; matplotlib's fonts and parsed tick labels, 0.4 s of a first
    picture), then freeze what exists out of the collector's sight, so a child's collections
    walk only what it creates."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from hydra.core.plugins import Plugins

    from gpubench.core.record import load
    from gpubench.report.runplot import plot_run

    Plugins.instance()
    with TemporaryDirectory() as tmp:
        fixture = Path(__file__).parent / "golden" / "fixtures" / "sweep" / "0"
        plot_run(load(fixture), Path(tmp) / "run.png")
    gc.collect()
    gc.freeze()
    if threading.active_count() != 1:  # a thread's held lock would stay held in every child
        raise SystemExit(f"forkserver: {threading.active_count()} threads after the imports")


if "_pytest" not in sys.modules:  # imported by the forkserver, not by a test worker
    _warm()


class _Fd:
    """A file descriptor handed to the child (multiprocessing passes it over the forkserver's
    socket, as Popen's child inherits one)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _Fd._inherited, (reduction.DupFd(self.fd),)

    @staticmethod
    def _inherited(dup) -> _Fd:
        return _Fd(dup.detach())


def _main(module, code, args, cwd, env, out: _Fd, err: _Fd, new_session, affinity, fsize):
    """In the forked child: become `python -m MODULE ARGS` (`python -c CODE ARGS`), then end
    as the interpreter does: its threads joined, its exit handlers run, its status reported."""
    rc = 1
    try:
        if new_session:
            os.setsid()
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        if fsize is not None:  # the largest file it may write (a full disk)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        os.dup2(out.fd, 1)
        os.dup2(err.fd, 2)
        for fd in {out.fd, err.fd} - {1, 2}:
            os.close(fd)
        # as a new interpreter sets it up (unless its parent ignored SIGINT): Ctrl-C raises
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *_PATH[1:]]  # where `python -m` puts each
        import numpy as np

        np.random.seed()  # a new interpreter's numpy draws from the OS; after a fork Python's
        # random reseeds itself, numpy does not
        multiprocessing.set_start_method(None, force=True)  # a new interpreter's default
        # (fork), not the one this child was started by: DataLoader workers use it
        try:
            if code is not None:
                sys.argv = ["-c", *args]
                exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv = ["-m", *args]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            rc = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                rc = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except KeyboardInterrupt:
            traceback.print_exc()
            rc = -signal.SIGINT
        except BaseException:
            traceback.print_exc()
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if rc == -signal.SIGINT:  # as the interpreter ends on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(rc)


class Forked:
    """A forked command, used like `subprocess.Popen`: pid, returncode, poll, wait, kill,
    send_signal, communicate, and `stdout`/`stderr` pipes when asked for."""

    def __init__(self, module, code, args, *, cwd, env: dict, stdout=None, stderr=None,
                 text: bool = False, start_new_session: bool = False,
                 affinity: list[int] | None = None, fsize: int | None = None):
        self.args = ["python", *(["-c", code] if code is not None else ["-m", module]), *args]
        self.returncode, self._text, close = None, text, []

        def fd_for(spec, inherited: int):
            if spec is None:
                return inherited, None
            if spec == subprocess.DEVNULL:
                close.append(os.open(os.devnull, os.O_WRONLY))
                return close[-1], None
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                close.append(w)
                return w, os.fdopen(r, "r" if text else "rb")
            return (spec if isinstance(spec, int) else spec.fileno()), None

        out, self.stdout = fd_for(stdout, 1)
        err, self.stderr = (out, None) if stderr == subprocess.STDOUT else fd_for(stderr, 2)
        self._proc = _CONTEXT.Process(target=_main, args=(
            module, code, [str(a) for a in args], str(cwd), dict(env), _Fd(out), _Fd(err),
            start_new_session, affinity, fsize))
        try:
            self._proc.start()
        finally:
            for fd in close:
                os.close(fd)
        self.pid = self._proc.pid

    def poll(self):
        if self.returncode is None:
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None):
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None):
        """Read both pipes to their end (as Popen does, so a chatty child never blocks)."""
        streams = [s for s in (self.stdout, self.stderr) if s is not None]
        out = {s.fileno(): b"" for s in streams}
        live = list(out)
        deadline = None if timeout is None else time.monotonic() + timeout
        while live:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            for fd in select.select(live, [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    out[fd] += chunk
                else:
                    live.remove(fd)
        self.wait(None if deadline is None else max(0.001, deadline - time.monotonic()))
        got = [None if s is None else out[s.fileno()] for s in (self.stdout, self.stderr)]
        for s in streams:
            s.close()
        if self._text:
            got = [None if d is None else d.decode(errors="replace") for d in got]
        return tuple(got)


def alive(pid: int, proc: subprocess.Popen | None = None) -> bool:
    """A process still runs: its Popen's word when this process holds one (which also reaps
    it), else whether the pid exists and, when it is a child of this process, has not ended
    (a zombie until reaped)."""
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:  # another process's child (another test worker started it)
        return True
