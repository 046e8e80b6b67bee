"""The one error for bad input: a setting, an override, a search space, a sweeper key, a folder
the config names. Raised before any work where it can be; printed as its one line with exit
code 2 (gpubench.cli.errors)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad input: one line naming the key, the bad value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r} is not allowed: {allowed}")
