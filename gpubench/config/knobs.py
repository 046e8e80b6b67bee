"""Every list of keys a reader of runs needs, derived from the declarations (a schema field's
`knob=Knob(...)`: adding a knob is that one edit)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpubench.config.keys import ACTIVE, Key, Pipe, Role
from gpubench.config.overrides import format_value
from gpubench.config.schema import BY_NAME

KEYS: dict[str, Key] = BY_NAME

# short name -> its keys, a `_target_` first: a team's own class, when set, names the thing
SHORT: dict[str, tuple[str, ...]] = {}
for _k in KEYS.values():
    if _k.knob.short:
        SHORT[_k.knob.short] = tuple(sorted((*SHORT.get(_k.knob.short, ()), _k.name),
                                            key=lambda n: not n.endswith("._target_")))
# the short names that identify a setup written out (a title, --where's hint)
SETUP_SHORT = tuple(n for n, ks in SHORT.items() if KEYS[ks[0]].knob.role is Role.workload)
# the keys a search may sweep (the knobs), as the command line names them: a group by its name
SEARCHABLE = tuple(n.removesuffix(".name") for n, k in KEYS.items() if k.knob.role is Role.knob)
# the swept keys of the data pipe (the loader's rate depends on them, compute's not)
DATA_KEYS = tuple(n for n, k in KEYS.items()
                  if k.knob.role is Role.knob and k.knob.pipe is Pipe.data)
# the data keys' cost order, cheapest first, with each one's value rank
CHEAP_FIRST: dict[str, Callable[[Any], Any]] = {n: KEYS[n].knob.cheap[1] for n in sorted(
    (n for n in DATA_KEYS if KEYS[n].knob.cheap), key=lambda n: KEYS[n].knob.cheap[0])}
# loader keys that act only through worker processes -> their value with none
WORKER_ONLY: dict[str, Any] = {k.path: k.knob.inert for k in KEYS.values()
                               if k.knob.inert is not ACTIVE}
# worker-only keys that act through worker processes alone: inert with thread workers too
PROCESS_ONLY = tuple(n for n, k in KEYS.items() if k.knob.process_only)
# keys with no effect on a CPU-only run
CUDA_ONLY = tuple(n for n, k in KEYS.items() if k.knob.cuda_only)
# where a run happens, not what it trains (a comparison of devices pools across them)
PLACE = tuple(n for n, k in KEYS.items() if k.knob.place)
# what the compute phase's figure depends on: by short name where a key has one, else the key
COMPUTE = tuple(dict.fromkeys(k.knob.short or n for n, k in KEYS.items()
                              if k.knob.pipe is Pipe.compute))


def declared(key: str) -> Key | None:
    """The declaration a dotted key falls under: its own, its dict-valued parent's
    (`model.kwargs.width`), or a group's `name` (`precision`, a study's param)."""
    k = key.lstrip("+")
    if f"{k}.name" in KEYS:
        return KEYS[f"{k}.name"]
    while k:
        if k in KEYS:
            return KEYS[k]
        k = k.rpartition(".")[0]
    return None


def knob_name(key: str) -> str:
    """A key as every reader shows it: its knob's short name, else the key. Never its last part
    alone: `model.checkpointing` and a `bench.checkpointing` would read as one knob."""
    d, k = declared(key), key.lstrip("+")
    own = d is not None and d.name in (k, f"{k}.name")  # not a part of a dict-valued key
    return d.knob.short if own and d.knob.short else key


def knob_setting(key: str, value: Any) -> str:
    return f"{knob_name(key)}={format_value(value)}"


def role(key: str) -> Role:
    """A key's role; undeclared (a team's `+key`): workload, never changed by a recommendation."""
    d = declared(key)
    return d.knob.role if d else Role.workload


def compared(key: str) -> bool:
    return role(key) in (Role.workload, Role.knob)


def acts(key: str, get: Callable[[str], Any]) -> bool:
    """Whether `key` acts in a run whose values `get` reads (None: not known): a worker-only key
    with workers, a process-only one with process workers, a CUDA-only one off a CPU."""
    if key in WORKER_ONLY and get("loader.num_workers") == 0:
        return False
    if key in CUDA_ONLY and get("bench.device") == "cpu":
        return False
    return not (key in PROCESS_ONLY and get("loader.worker_type") == "thread")
