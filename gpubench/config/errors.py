"""The one error for bad input, raised before any work where it can be; printed as its one line
with exit code 2 (gpubench.cli.errors)."""

from __future__ import annotations

from typing import Any

from gpubench.config.overrides import format_value

SHOWN = 200  # the most characters of a value a line shows (its start, an ellipsis, its end)
NOTHING = object()  # the value of a key refused whatever it holds (`~key`): the line names the key


def cut(text: str, most: int = SHOWN) -> str:
    return text if len(text) <= most else f"{text[:most * 3 // 4]}…{text[-(most // 4):]}"


class ConfigError(ValueError):
    """Bad input: one line naming the key, the bad value and what is allowed; `typed`: the
    value as the command line wrote it, shown instead of its repr."""

    def __init__(self, key: str, value: Any, allowed: str, typed: str | None = None):
        self.key, self.value, self.allowed = key, value, allowed
        # as YAML and the command line spell it (`null`, `true`); a text quoted
        written = format_value(value) if value is None or isinstance(value, bool) else repr(value)
        shown = "" if value is NOTHING else f"={cut(written if typed is None else typed)}"
        super().__init__(f"{cut(key)}{shown} is not allowed: it must be {allowed}")
