"""Code a config names, checked before it is called.

A config is code, as Hydra's own configs are: `model._target_`, `dataset._target_` and every
`_target_` inside `dataset.transform` and `dataset.collate`, and `step._target_`, name Python objects gpubench calls
with arguments from the config. Each is resolved first (its module imported, nothing called),
checked to be of the kind its key takes, and only then called:

| key | allowed |
|---|---|
| `model._target_` | a subclass of `torch.nn.Module` |
| `dataset._target_` | a subclass of `torch.utils.data.Dataset`, not an `IterableDataset` |
| `step._target_` | a function of the team's own code or a subclass of `torch.nn.Module` |
| `_target_` in `dataset.transform` / `dataset.collate` (nested nodes too) | a class or a function of `torchvision.transforms` or torch's collate functions (`torch.utils.data.default_collate`); a subclass of `torch.nn.Module` (a transform as a module, any library's); or a class or a function of the team's own code |

The team's own code is a module whose file lies outside the folders installed libraries live in
(site-packages, dist-packages, the standard library's) and outside gpubench: a repository on
PYTHONPATH, the working folder, an editable install. Any other library's function is refused
(`mlflow.utils.process._exec_cmd`, `numpy.save`, `torch.save`): each can act on its arguments
(run a command, write a file) the moment Hydra calls it, and none is a transform; wrapping one
in a function of the team's own code is the way to use it on purpose.

For all of them: not defined in Python's standard library (`os.system`, `subprocess.Popen`,
`shutil.rmtree`, `builtins.eval`: the process, shell and file callables live there, and no
model, dataset, transform or collate function does). A path into the standard library is refused
before it is imported; every object is judged by the module that defines it, so a module that
re-exports one (`torch.os.system`, a team module's `from mlflow... import _exec_cmd`) does not
change its verdict.

This stops a typo or a wrong kind with one line before anything runs, and keeps a config from
calling library functions through these keys. It is not a sandbox: the team's module runs when
it is imported and its class when it is built, so run only configs you trust (docs/guide.md,
"Trust").
"""

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


def locate(key: str, path: Any, allowed: str) -> Any:
    """The object `path` names, imported but not called. Raises ConfigError (key, path and
    `allowed`) when the path is not dotted, points into the standard library, or does not
    import."""
    text = str(path)
    if not isinstance(path, str) or not DOTTED.fullmatch(text):
        raise ConfigError(key, path, allowed)
    parts = text.split(".")
    # imported here rather than by hydra.utils.get_object, which logs an ERROR (3 lines on
    # stderr) for a path that does not import before it raises
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
        if isinstance(e, ModuleNotFoundError) and e.name == parts[0]:  # the team's package
            cause += " (is its folder on PYTHONPATH? e.g. PYTHONPATH=. python -m gpubench ...)"
        raise ConfigError(key, text, f"{allowed} ({cause})") from e
    # `torch.os.system` is os.system: judge the object by the module that defines it
    if _top(_defined_in(obj)) in STDLIB:
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
    elif isinstance(node, Sequence) and not isinstance(node, (str, bytes)):  # a ListConfig too
        for i, v in enumerate(node):
            yield from _targets(v, f"{key}[{i}]")


def _defined_in(obj: Any) -> str:
    return (getattr(obj, "__name__", None) if inspect.ismodule(obj)
            else getattr(obj, "__module__", None)) or ""


def team_code(module_name: str) -> bool:
    """Whether a module is the team's own code: loaded from a file outside every installed
    library folder (LIBRARY_DIRS, or any site-packages / dist-packages on the path), and not
    gpubench's (an editable install of it lies outside them too). A module with no file (built
    into the interpreter or an extension's namespace) is not."""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file or _top(module_name) in GPUBENCH_PACKAGES:
        return False
    return not any(d in LIBRARY_DIRS or d.name in LIBRARY_DIR_NAMES
                   for d in Path(file).resolve().parents)


def transform_kind(obj: Any) -> str | None:
    """Why `obj` may not be a transform or collate `_target_` (None when it may): see the
    module's table."""
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


def callable_node(node: Mapping, key: str) -> None:
    """Every `_target_` of an instantiate node (dataset.transform, dataset.collate) is of the
    kind transform_kind allows; raises ConfigError naming the first that is not."""
    for k, target in _targets(node, key):
        why = transform_kind(locate(k, target, CALLABLE))
        if why:
            raise ConfigError(k, target, f"{CALLABLE} ({why})")


def loss_function(target: Any) -> Any:
    """step._target_ (step=custom): the team's own function or an nn.Module class."""
    fn = locate("step._target_", target, LOSS)
    why = transform_kind(fn)
    if why or not callable(fn):
        raise ConfigError("step._target_", target, f"{LOSS} ({why or 'not callable'})")
    return fn


def check(s: Settings) -> None:
    """Every code reference of the run, resolved and checked before any of it is called."""
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
