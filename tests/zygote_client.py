"""`python tests/zygote_client.py MODULE ARGS`: `python -m MODULE ARGS` forked by the test run's
zygote (tests/zygote.py; its socket and pid in GPUBENCH_ZYGOTE, GPUBENCH_ZYGOTE_PID), for a
launcher that starts `python SCRIPT ARGS` per worker itself (torchrun, per rank). It imports
nothing heavy, hands the zygote its environment (torchrun's RANK, WORLD_SIZE, ...), cwd and
streams, passes on every signal the launcher sends, and exits as the child did, so the launcher
sees each rank's real exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zygote import Zygote  # noqa: E402  (the standard library only)


def main() -> None:
    z = Zygote(os.environ["GPUBENCH_ZYGOTE"], int(os.environ["GPUBENCH_ZYGOTE_PID"]))
    child = z.popen(sys.argv[1], sys.argv[2:], cwd=os.getcwd(), env=dict(os.environ))

    def forward(sig, _frame):  # not child.send_signal: that reads the socket wait() is reading
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    rc = child.wait()
    if rc < 0:  # ended by a signal: end this process the same way
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    sys.exit(rc)


if __name__ == "__main__":
    main()
