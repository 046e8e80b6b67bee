"""Code a config names, checked before it is called.

A config is code, as Hydra's own configs are: `model._target_`, `dataset._target_` and every
`_target_` inside `dataset.transform` and `dataset.collate` name Python objects gpubench calls
with arguments from the config. Each is resolved first (its module imported, nothing called),
checked to be of the kind its key takes, and only then called:

| key | allowed |
|---|---|
| `model._target_` | a subclass of `torch.nn.Module` |
| `dataset._target_` | a subclass of `torch.utils.data.Dataset`, not an `IterableDataset` |
| `_target_` in `dataset.transform` / `dataset.collate` (nested nodes too) | a class or a function |

and for all of them: not defined in Python's standard library (`os.system`, `subprocess.Popen`,
`shutil.rmtree`, `builtins.eval`: the process, shell and file callables live there, and no
model, dataset, transform or collate function does). A path into the standard library is refused
before it is imported; an object reached through a module that re-exports one (`torch.os.system`)
is refused by the module that defines it.

This stops a typo or a wrong kind with one line before anything runs, and keeps a config from
calling the standard library's process and file functions through these keys. It is not a
sandbox: the team's module runs when it is imported and its class when it is built, so run
only configs you trust (docs/guide.md, "Trust").
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn
from torch.utils.data import Dataset, IterableDataset

from gpubench.config.errors import ConfigError
from gpubench.config.settings import Settings, node_set

STDLIB = frozenset(sys.stdlib_module_names) | {"builtins", "__builtin__"}
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
NOT_STDLIB = "not from Python's standard library"
MODEL = f"an nn.Module subclass given as a dotted path (e.g. my_team.models.MyNet), {NOT_STDLIB}"
DATASET = (f"a map-style torch.utils.data.Dataset subclass given as a dotted path (e.g. "
           f"my_team.data.MyDataset), {NOT_STDLIB}")
CALLABLE = f"a class or a function given as a dotted path (e.g. my_team.data.collate), {NOT_STDLIB}"


def _top(module: str | None) -> str:
    return (module or "").split(".")[0]


def _describe(obj: Any) -> str:
    if inspect.isclass(obj):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if inspect.ismodule(obj):
        return f"module {obj.__name__}"
    return f"{type(obj).__name__} from {getattr(obj, '__module__', None) or '?'}"


def locate(key: str, path: Any, allowed: str) -> Any:
    """The object `path` names, imported but not called. Raises ConfigError (key, path and
    `allowed`) when the path is not dotted, points into the standard library, or does not
    import."""
    text = str(path)
    if not isinstance(path, str) or not DOTTED.fullmatch(text):
        raise ConfigError(key, path, allowed)
    parts = text.split(".")
    if parts[0] in STDLIB:  # refused before the import: some stdlib modules act on import
        raise ConfigError(key, text, f"{allowed} ({parts[0]} is in the standard library)")
    try:
        obj = importlib.import_module(parts[0])
        for i in range(1, len(parts)):
            if hasattr(obj, parts[i]):
                obj = getattr(obj, parts[i])
            else:  # a submodule not imported yet
                obj = importlib.import_module(".".join(parts[: i + 1]))
    except Exception as e:  # the team's module failed to import: its error, on one line
        cause = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError(key, text, f"{allowed} ({cause})") from e
    # `torch.os.system` is os.system: judge the object by the module that defines it
    defined_in = getattr(obj, "__name__", None) if inspect.ismodule(obj) \
        else getattr(obj, "__module__", None)
    if _top(defined_in) in STDLIB:
        raise ConfigError(key, text, f"{allowed} (it is {_describe(obj)}, in the standard library)")
    return obj


def model_class(target: Any) -> type:
    key = "model._target_"
    cls = locate(key, target, MODEL)
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise ConfigError(key, target, f"{MODEL} (it is {_describe(cls)})")
    return cls


def dataset_class(target: Any) -> type:
    key = "dataset._target_"
    cls = locate(key, target, DATASET)
    if not (inspect.isclass(cls) and issubclass(cls, Dataset)):
        raise ConfigError(key, target, f"{DATASET} (it is {_describe(cls)})")
    if issubclass(cls, IterableDataset):
        raise ConfigError(key, target, f"{DATASET} (an IterableDataset cannot be shuffled or "
                          "sharded the same way)")
    return cls


def _targets(node: Any, key: str) -> Iterator[tuple[str, Any]]:
    """(key, _target_) of every instantiate node in `node`: Hydra instantiates nested nodes
    (a Compose's list of transforms) before the outer one, so each is checked."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            yield f"{key}._target_", node["_target_"]
        for k, v in node.items():
            if k != "_target_":
                yield from _targets(v, f"{key}.{k}")
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _targets(v, f"{key}[{i}]")


def callable_node(node: Mapping, key: str) -> None:
    """Every `_target_` of an instantiate node (dataset.transform, dataset.collate) is a class
    or a function outside the standard library; raises ConfigError naming the first that is
    not."""
    for k, target in _targets(node, key):
        obj = locate(k, target, CALLABLE)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            raise ConfigError(k, target, f"{CALLABLE} (it is {_describe(obj)})")


def check(s: Settings) -> None:
    """Every code reference of the run, resolved and checked before any of it is called."""
    if s.model._target_:
        model_class(s.model._target_)
    ds = s.dataset
    if ds.name == "custom":
        dataset_class(ds._target_)
        for key, node in (("dataset.transform", ds.transform), ("dataset.collate", ds.collate)):
            if node_set(node):
                callable_node(node, key)
