"""Flags of the small commands (`sync --timeout S`) that stand for a config key: checked by its
declaration, so a flag and its key take the same values and refuse them with the same words."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpubench.config.keys import FLOAT, INT
from gpubench.config.schema import BY_NAME


def flag(key: str, name: str) -> Callable[[str], Any]:
    k = BY_NAME[key]

    def convert(text: str) -> Any:
        try:
            value = int(text) if k.kind == INT else float(text) if k.kind == FLOAT else text
            k.check(value)
        except ValueError:  # ConfigError is a ValueError too: its allowed text
            raise argparse.ArgumentTypeError(
                f"{name}={text!r} is not allowed: it must be {k.allowed} (as {key})") from None
        return value

    return convert
