"""`python tests/zygote_client.py MODULE ARGS`: `python -m MODULE ARGS` forked from the test
run's zygote (tests/zygote.py; its socket and pid in GPUBENCH_ZYGOTE and GPUBENCH_ZYGOTE_PID),
for a launcher that starts its worker processes itself (torchrun starts `python SCRIPT ARGS`
per rank).

This process imports nothing heavy: it hands the zygote its environment (torchrun's RANK,
WORLD_SIZE, MASTER_ADDR, ... included), cwd and streams, passes on every signal the launcher
sends it (SIGTERM when another rank failed, SIGINT, SIGHUP), and exits as the child did, so
the launcher sees each rank's real exit status. The rank itself is its own process as with a
fresh interpreter (see tests/zygote.py for what differs).
"""

from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zygote import Zygote  # noqa: E402  (the standard library only)


def main() -> None:
    z = Zygote(os.environ["GPUBENCH_ZYGOTE"], int(os.environ["GPUBENCH_ZYGOTE_PID"]))
    child = z.popen(sys.argv[1], sys.argv[2:], cwd=os.getcwd(), env=dict(os.environ))

    def forward(sig, _frame):  # os.kill, not child.send_signal: that reads the socket the
        try:  # interrupted wait below is reading
            os.kill(child.pid, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    rc = child.wait()
    if rc < 0:  # ended by a signal: end this process the same way
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    sys.exit(rc)


if __name__ == "__main__":
    main()
