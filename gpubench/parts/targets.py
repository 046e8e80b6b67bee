"""Code a config names (every `_target_`): imported, checked to be of its key's kind and not from
the standard library (transforms: nor another library's) before it is called, a wrong one a line.
Not a sandbox: run only configs you trust (docs/guide.md, "Trust")."""

from __future__ import annotations

import importlib
import inspect
import re
import site
import sys
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
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
LOSS = ("a loss function of your own code as a dotted path (e.g. my_team.train.loss) or an "
        "nn.Module loss class, returning a scalar tensor")
CALLABLE = ("a class or function of torchvision.transforms, torch.utils.data.default_collate, "
            "an nn.Module subclass, or a class or function of your own code, as a dotted path "
            "(e.g. my_team.data.collate)")
# the libraries whose transforms and collate functions a config may name directly
TRANSFORM_LIBRARIES = ("torchvision.transforms", "torch.utils.data._utils.collate")
# where installed libraries live (this interpreter's, and any site-packages on the path)
LIBRARY_DIRS = frozenset(Path(p).resolve() for p in (
    *site.getsitepackages(), site.getusersitepackages(),
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))))
LIBRARY_DIR_NAMES = ("site-packages", "dist-packages")
GPUBENCH_PACKAGES = ("gpubench", "hydra_plugins")  # gpubench's distribution: a library here


def _top(module: str | None) -> str:
    return (module or "").split(".")[0]


def _describe(obj: Any) -> str:
    if inspect.isclass(obj):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if inspect.ismodule(obj):
        return f"module {obj.__name__}"
    return f"{type(obj).__name__} from {getattr(obj, '__module__', None) or '?'}"


def cause(e: BaseException, typed: bool = True, limit: int = 200) -> str:
    """An error as one short line (its type's name first, if `typed`), for a ConfigError."""
    return " ".join((f"{type(e).__name__}: {e}" if typed else str(e)).split())[:limit]


def locate(key: str, path: Any, allowed: str) -> Any:
    """The object `path` names, imported but not called; else a ConfigError naming `key`."""
    if not isinstance(path, str) or not DOTTED.fullmatch(path):
        raise ConfigError(key, path, allowed)
    parts = path.split(".")
    # not hydra.utils.get_object: it logs an ERROR (3 lines on stderr) before it raises
    if parts[0] in STDLIB:  # refused before the import: some stdlib modules act on import
        raise ConfigError(key, path, f"{allowed} ({parts[0]} is in the standard library)")
    obj, why, i = None, None, 0
    try:
        obj = importlib.import_module(parts[0])
        for i in range(1, len(parts)):  # an attribute, else a submodule not imported yet
            if hasattr(obj, parts[i]):
                obj = getattr(obj, parts[i])
            elif inspect.ismodule(obj) and not hasattr(obj, "__path__"):  # a module, no package:
                # Python would say "'my_co.models' is not a package", of a misspelt class
                why = f"module {obj.__name__} has no {parts[i]}"
                break
            else:
                obj = importlib.import_module(".".join(parts[: i + 1]))
    except Exception as e:  # the team's module failed to import: its error, on one line
        why = cause(e)
        if isinstance(e, ModuleNotFoundError) and e.name == parts[0]:  # the team's package
            why += " (is its folder on PYTHONPATH? e.g. PYTHONPATH=. python -m gpubench ...)"
        elif isinstance(e, ModuleNotFoundError) and i and e.name == ".".join(parts[: i + 1]):
            why = f"package {'.'.join(parts[:i])} has no {parts[i]}, as a name or a submodule"
        raise ConfigError(key, path, f"{allowed} ({why})") from e
    if why is not None:
        raise ConfigError(key, path, f"{allowed} ({why})")
    # `torch.os.system` is os.system: judge the object by the module that defines it
    if _top(_defined_in(obj)) in STDLIB:
        raise ConfigError(key, path, f"{allowed} (it is {_describe(obj)}, in the standard library)")
    return obj


def _subclass(key: str, target: Any, allowed: str, base: type) -> type:
    cls = locate(key, target, allowed)
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ConfigError(key, target, f"{allowed} (it is {_describe(cls)})")
    return cls


def model_class(target: Any) -> type:
    return _subclass("model._target_", target, MODEL, nn.Module)


def dataset_class(target: Any) -> type:
    cls = _subclass("dataset._target_", target, DATASET, Dataset)
    if issubclass(cls, IterableDataset):
        raise ConfigError("dataset._target_", target, f"{DATASET} (an IterableDataset cannot "
                          "be shuffled or sharded the same way)")
    return cls


def _targets(node: Any, key: str) -> Iterator[tuple[str, Any]]:
    """(key, _target_) of every instantiate node, nested ones too (Hydra calls them first)."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            yield f"{key}._target_", node["_target_"]
        for k, v in node.items():
            if k != "_target_":
                yield from _targets(v, f"{key}.{k}")
    elif isinstance(node, Sequence) and not isinstance(node, (str, bytes)):  # a ListConfig too
        for i, v in enumerate(node):
            yield from _targets(v, f"{key}[{i}]")


def _defined_in(obj: Any) -> str:
    return (getattr(obj, "__name__", None) if inspect.ismodule(obj)
            else getattr(obj, "__module__", None)) or ""


def team_code(module_name: str) -> bool:
    """A module from a file outside every library folder, not gpubench's (an editable install
    lies outside them too); one with no file (built in) is not."""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file or _top(module_name) in GPUBENCH_PACKAGES:
        return False
    return not any(d in LIBRARY_DIRS or d.name in LIBRARY_DIR_NAMES
                   for d in Path(file).resolve().parents)


def transform_kind(obj: Any) -> str | None:
    """Why `obj` may not be a transform or collate `_target_` (None when it may)."""
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        return None
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return f"it is {_describe(obj)}"
    module = _defined_in(obj)
    if any(module == lib or module.startswith(lib + ".") for lib in TRANSFORM_LIBRARIES) \
            or team_code(module):
        return None
    return (f"it is {_describe(obj)}, an installed library: call it from a function of your "
            "own code")


def callable_node(node: Mapping, key: str) -> None:  # the first `_target_` transform_kind refuses
    for k, target in _targets(node, key):
        why = transform_kind(locate(k, target, CALLABLE))
        if why:
            raise ConfigError(k, target, f"{CALLABLE} ({why})")


def loss_function(target: Any) -> Any:  # step._target_: the team's function or an nn.Module class
    fn = locate("step._target_", target, LOSS)
    why = transform_kind(fn)
    if why or not callable(fn):
        raise ConfigError("step._target_", target, f"{LOSS} ({why or 'not callable'})")
    return fn


def check(s: Settings) -> None:  # every code reference of the run, before any of it is called
    if s.model._target_:
        model_class(s.model._target_)
    if s.step.name == "custom":
        loss_function(s.step._target_)
    ds = s.dataset
    if ds.name == "custom":
        dataset_class(ds._target_)
        for key, node in (("dataset.transform", ds.transform), ("dataset.collate", ds.collate)):
            if node_set(node):
                callable_node(node, key)
