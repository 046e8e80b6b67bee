"""One clear line for bad input that Hydra rejects before gpubench's own checks run.

Hydra reports a composition error (an unknown group option, a value of the wrong type or
outside an Enum) over several lines plus a hint about HYDRA_FULL_ERROR. While the config is
being composed we hold stderr back; if composition fails, we print one line naming the key,
the value and what is allowed. With HYDRA_FULL_ERROR=1 nothing is held back.
"""

from __future__ import annotations

import io
import os
import re
import sys
from contextlib import contextmanager


def one_line(report: str) -> str:
    """Condense Hydra's multi-line composition error into one line."""
    m = re.search(r"Could not find '([^']+)/([^']+)'", report)
    if m:
        group, value = m.groups()
        opts = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", report)
        allowed = ", ".join(o.strip() for o in opts.group(1).splitlines()) if opts else "?"
        return f"{group}={value} is not allowed: one of {allowed}"
    key = re.search(r"full_key: (\S+)", report)
    lines = [
        ln.strip()
        for ln in report.splitlines()
        if ln.strip()
        and not ln.startswith((" ", "\t"))
        and not ln.startswith(("Set the environment", "Config search path", "Error merging"))
    ]
    msg = lines[0] if lines else report.strip()
    m = re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", report)
    if m and key:
        return f"{key.group(1)}={m.group(1)} is not allowed: one of {m.group(2)}"
    return f"{key.group(1)}: {msg}" if key else msg


class _Held(io.StringIO):
    pass


@contextmanager
def compact_compose_errors():
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    real = sys.stderr
    held = _Held()
    sys.stderr = held
    try:
        yield
    except SystemExit as e:
        if sys.stderr is held and e.code not in (0, None):  # failed while composing: Hydra wrote its report into `held`
            sys.stderr = real
            print(f"gpubench: error: {one_line(held.getvalue())}", file=real)
            raise SystemExit(2) from None
        raise
    finally:
        if sys.stderr is held:
            sys.stderr = real
            real.write(held.getvalue())


def release_stderr() -> None:
    """Called once the task starts: composition succeeded, stop holding stderr back."""
    held = sys.stderr
    if isinstance(held, _Held):
        sys.stderr = sys.__stderr__
        sys.stderr.write(held.getvalue())
