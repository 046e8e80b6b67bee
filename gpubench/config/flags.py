"""Flags of the small commands (`python -m gpubench.tracking sync --timeout S`) that stand for a
config key: parsed and checked by that key's declaration, so a flag and the key it stands for
take the same values and refuse them with the same words."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpubench.config.errors import ConfigError
from gpubench.config.keys import FLOAT, INT
from gpubench.config.schema import KEYS
from gpubench.config.settings import EXPERIMENT_NAME_MAX, RUN_NAME_MAX, check_name

# the rules on a key's value that its declaration alone does not carry
NAMES = {"tracking.experiment": EXPERIMENT_NAME_MAX, "tracking.run_name": RUN_NAME_MAX}


def flag(key: str, name: str) -> Callable[[str], Any]:
    """An argparse `type` for flag `name` standing for config key `key`: the text converted to
    the key's type and checked by its range or choices (and, for a name MLflow keeps, by
    check_name); refused as `--flag=value is not allowed: ... (key)`."""
    k = next(k for k in KEYS if k.name == key)

    def convert(text: str) -> Any:
        try:
            value = int(text) if k.kind == INT else float(text) if k.kind == FLOAT else text
            k.check(value)
            if key in NAMES:
                check_name(key, value, NAMES[key])
        except (ValueError, ConfigError):  # ConfigError is a ValueError too: its allowed text
            raise argparse.ArgumentTypeError(
                f"{name}={text!r} is not allowed: it must be {k.allowed} (as {key})") from None
        return value

    return convert
