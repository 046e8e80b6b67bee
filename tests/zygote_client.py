"""`python tests/zygote_client.py MODULE ARGS`: `python -m MODULE ARGS` forked from the test
run's zygote (tests/zygote.py, its socket in GPUBENCH_ZYGOTE), for a launcher that starts its
worker processes itself (torchrun starts `python SCRIPT ARGS` per rank).

This process imports nothing heavy: it hands the zygote its environment (torchrun's RANK,
WORLD_SIZE, MASTER_ADDR, ... included), cwd and streams, passes on every signal the launcher
sends it (SIGTERM when another rank failed, SIGINT, SIGHUP), and exits as the child did, so
the launcher sees each rank's real exit status. The rank itself is its own process as with a
fresh interpreter (see tests/zygote.py for what differs).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys


def main() -> None:
    module, args = sys.argv[1], sys.argv[2:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.environ["GPUBENCH_ZYGOTE"])
    req = {"module": module, "code": None, "args": args, "cwd": os.getcwd(),
           "env": dict(os.environ)}
    socket.send_fds(conn, [json.dumps(req).encode()], [0, 1, 2])
    f = conn.makefile("r")
    pid = int(f.readline())

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    line = f.readline()  # the child's exit status, once it has ended
    rc = int(line) if line.strip() else 1
    if rc < 0:  # ended by a signal: end this process the same way
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    sys.exit(rc)


if __name__ == "__main__":
    main()
