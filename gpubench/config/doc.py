"""docs/configuration.md's key tables, written by scripts/config_table.py between the markers."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

from gpubench.config.keys import ACTIVE, Key
from gpubench.config.overrides import format_value

BEGIN = "<!-- key tables: written by scripts/config_table.py from the schema; edit the schema -->"
END = "<!-- end of the key tables -->"


def shown(v: Any) -> str:
    """A default as a command line or YAML writes it (scalars: gpubench.config.overrides)."""
    if isinstance(v, Enum):
        return v.name
    if isinstance(v, (list, tuple)):
        return f"[{', '.join(shown(x) for x in v)}]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {shown(x)}" for k, x in v.items()) + "}"
    return format_value(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def role(k: Key) -> str:
    parts = [k.knob.role.value] + ([k.knob.pipe.value] if k.knob.pipe else [])
    parts += ["0 workers: " + shown(k.knob.inert)] if k.knob.inert != ACTIVE else []
    parts += ["process workers only"] if k.knob.process_only else []
    return ", ".join(parts + (["CUDA only"] if k.knob.cuda_only else []))


def table(declared: Iterable[Key], roles: bool = False) -> str:
    rows = [f"| `{k.name}` | `{_cell(shown(k.default))}` | {_cell(k.allowed)} | "
            + (f"{role(k)} | " if roles else "") + f"{_cell(k.help)} |" for k in declared]
    return "\n".join(["| key | default | allowed | " + ("role | " if roles else "") + "meaning |",
                      "|---|---|---|---|" + ("---|" if roles else ""), *rows])


def section(declared: Iterable[Key], roles: bool = False) -> str:
    """One table per group (the keys' dotted prefix, or "top level"), in declaration order."""
    groups: dict[str, list[Key]] = {}
    for k in declared:
        groups.setdefault(k.name.rpartition(".")[0], []).append(k)
    return "\n\n".join(f"### {f'`{g}`' if g else 'top level'}\n\n{table(ks, roles)}"
                       for g, ks in groups.items())


def rewrite(doc: str, generated: str) -> str:
    head, found, rest = doc.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"the doc lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n\n{generated}\n\n{END}{tail}"
