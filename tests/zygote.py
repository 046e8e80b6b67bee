"""`python -m MODULE ARGS` as a real process of its own, without paying its imports each time.

A fresh interpreter paid about 3 s of imports on a 2-core machine (torch 1.4 s, torchvision
1.3 s) before each sub-second tiny run. The zygote, one process per test run, imports torch,
torchvision, Hydra, Optuna, MLflow, matplotlib and gpubench once, then forks a child per command.
A child is still its own process (pid, exit status, signals, cwd, environment, streams handed
over as file descriptors), runs the module's `__main__` as `python -m` does (runpy) and ends
through the interpreter's atexit handlers (MLflow's, logging's) before its status is reported.
What differs: those modules are already imported, so an environment variable read at import is
the zygote's (torch's thread count: the suite pins one everywhere); a test of what a command
imports or of an interpreter's start-up runs a real `python` (`run_cli(..., fresh=True)`).

Fork is safe: the zygote starts no thread (checked before it serves) and never touches CUDA, so
a child inherits no held lock and no device context (DataLoader workers are forked the same way).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import resource
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRELOAD = ("torch", "torchvision", "torchvision.transforms.v2", "torchvision.models",
           "hydra", "omegaconf", "optuna", "mlflow", "matplotlib.pyplot", "psutil",
           "gpubench.run.runner", "gpubench.report.cli", "gpubench.report.plots",
           "gpubench.tracking.runs", "gpubench.search.loop",
           "hydra_plugins.gpubench_sweeper.sweeper")  # no __main__ module: importing runs it


# ---------------------------------------------------------------------------- the zygote itself


def _child(conn: socket.socket, listener: socket.socket, req: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m MODULE ARGS`, then exit as the interpreter does."""
    code = 1
    try:
        listener.close()
        conn.close()
        if req["new_session"]:
            os.setsid()
        if req["affinity"] is not None:
            os.sched_setaffinity(0, set(req["affinity"]))
        if req["fsize"] is not None:  # the largest file it may write (a full disk)
            resource.setrlimit(resource.RLIMIT_FSIZE, (req["fsize"], req["fsize"]))
        for target, fd in enumerate(fds):  # stdin, stdout, stderr
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # as a new interpreter sets it up (unless its parent ignored SIGINT): Ctrl-C raises
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[1:1] = [os.path.abspath(p) for p in extra]  # where python puts PYTHONPATH
        import numpy as np

        np.random.seed()  # a fresh interpreter's numpy draws from the OS; Python's random
        # reseeds itself after a fork, numpy does not
        try:
            if req["code"] is not None:  # python -c CODE ARGS
                sys.argv = ["-c", *req["args"]]
                exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv = ["-m", *req["args"]]
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def serve(path: str) -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    with contextlib.suppress(Exception):
        from hydra.core.plugins import Plugins

        Plugins.instance()  # the plugin scan, once
    # Caches a process fills on its first run and keeps (matplotlib's fonts and parsed tick
    # labels: 0.4 s of a first picture), filled once here; then what exists so far is frozen out
    # of the collector's sight, so a child's collections walk only what it creates.
    try:
        from gpubench.core.record import load
        from gpubench.report.runplot import plot_run

        with tempfile.TemporaryDirectory() as tmp:
            plot_run(load(ROOT / "tests" / "golden" / "fixtures" / "sweep" / "0"),
                     Path(tmp) / "run.png")
    except Exception as e:  # a cache left cold costs time only
        print(f"zygote: warm-up skipped: {e!r}", file=sys.stderr)
    gc.collect()
    gc.freeze()
    if threading.active_count() != 1:  # a thread's held lock would stay held in every child
        raise SystemExit(f"zygote: {threading.active_count()} threads after the imports")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the client waits for this name: ready
    running: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener], [], [], 0.05)
        if readable:
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            req = json.loads(msg.decode())
            if req.get("stop"):
                return
            pid = os.fork()
            if pid == 0:
                _child(conn, listener, req, fds)
            for fd in set(fds):
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            running[pid] = conn
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):  # the test went away
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()


# ----------------------------------------------------------------------------- the test's side


class Forked:
    """A child of the zygote, used like `subprocess.Popen`: pid, poll, wait, kill,
    send_signal, communicate, and `stdout`/`stderr` pipes when asked for."""

    def __init__(self, args, conn: socket.socket, stdout, stderr, text: bool):
        self.args, self._conn, self.returncode, self._buf = args, conn, None, b""
        self.pid = int(self._line(None))
        self.stdout, self.stderr, self._text = stdout, stderr, text

    def _line(self, timeout: float | None) -> str:
        """The zygote's next line; what arrived before a timeout is kept for the next call."""
        self._conn.settimeout(timeout)
        while b"\n" not in self._buf:
            chunk = self._conn.recv(64)
            if not chunk:
                raise RuntimeError("the zygote went away")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().strip()

    def poll(self):
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(0.001)
        return self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            try:
                self.returncode = int(self._line(timeout))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._conn.close()
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


class Zygote:
    """The test's handle on a zygote: its socket and pid. `launch` starts one."""

    def __init__(self, path: str, pid: int, proc: subprocess.Popen | None = None):
        self.path, self.pid, self.proc = path, pid, proc

    @staticmethod
    def launch(folder: Path) -> dict:
        """Start a zygote serving on a socket in `folder`, in a session of its own (whoever
        stops it stops its running children too); what a test needs to reach it."""
        folder.mkdir(parents=True, exist_ok=True)
        path = str(folder / "sock")
        proc = subprocess.Popen([sys.executable, "-u", __file__, path],
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                stdin=subprocess.DEVNULL, cwd=folder, start_new_session=True)
        return {"path": path, "pid": proc.pid, "proc": proc}

    def alive(self) -> bool:
        return alive(self.pid, self.proc)

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + 300
        while not os.path.exists(self.path):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError("the zygote did not start")
            time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.path)
        return s

    def popen(self, module: str | None, args, *, cwd, env: dict, stdout=None, stderr=None,
              text: bool = False, start_new_session: bool = False,
              affinity: list[int] | None = None, fsize: int | None = None,
              code: str | None = None) -> Forked:
        """Start `python -m MODULE ARGS` (`python -c CODE ARGS` given `code`), stdout/stderr
        as Popen takes them; `affinity`: the cores it may run on, `fsize`: the largest file
        it may write."""
        close: list[int] = []
        devnull = os.open(os.devnull, os.O_RDWR)
        close.append(devnull)

        def fd_for(spec, default: int):
            if spec is None:
                return default, None
            if spec == subprocess.DEVNULL:
                return devnull, None
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                close.append(w)
                return w, os.fdopen(r, "r" if text else "rb")
            return (spec if isinstance(spec, int) else spec.fileno()), None

        out_fd, out_pipe = fd_for(stdout, 1)
        if stderr == subprocess.STDOUT:
            err_fd, err_pipe = out_fd, None
        else:
            err_fd, err_pipe = fd_for(stderr, 2)
        req = {"module": module, "code": code, "args": [str(a) for a in args], "cwd": str(cwd),
               "env": dict(env), "new_session": start_new_session,
               "affinity": affinity, "fsize": fsize}
        conn = self._connect()
        try:
            socket.send_fds(conn, [json.dumps(req).encode()], [devnull, out_fd, err_fd])
        finally:
            for fd in close:
                os.close(fd)
        head = ["-c", code] if code is not None else ["-m", module]
        return Forked(["python", *head, *req["args"]], conn, out_pipe, err_pipe, text)

    def stop(self) -> None:
        if self.alive():
            try:
                s = self._connect()
                socket.send_fds(s, [json.dumps({"stop": True}).encode()], [])
                s.close()
                if self.proc is not None:
                    self.proc.wait(timeout=10)
            except Exception:
                os.killpg(self.pid, signal.SIGKILL)


_ZYGOTE: Zygote | None = None


def zygote() -> Zygote:
    """The test run's zygote, started on first use (a few seconds, once): one for every test
    worker of the run (tests/conftest.py shared(), which stops it when the run ends), or this
    process's own when run outside pytest's session."""
    global _ZYGOTE
    if _ZYGOTE is None or not _ZYGOTE.alive():
        if "GPUBENCH_TESTS_SHARED" in os.environ:
            from conftest import shared

            started: dict = {}

            def launch(folder: Path) -> dict:
                started.update(Zygote.launch(folder))
                return {k: v for k, v in started.items() if k != "proc"}

            info = shared("zygote", launch)
            _ZYGOTE = Zygote(info["path"], info["pid"], started.get("proc"))
        else:
            info = Zygote.launch(Path(tempfile.mkdtemp(prefix="gpubench-zygote-")))
            _ZYGOTE = Zygote(info["path"], info["pid"], info["proc"])
            atexit.register(_ZYGOTE.stop)
    return _ZYGOTE


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    serve(sys.argv[1])
