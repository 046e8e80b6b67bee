"""One declaration per config key: a schema dataclass's field, its type the annotation (an Enum:
its choices; `None` in it: null allowed), the rest `setting(...)`; `keys(cls)` reads them back.
Free of Hydra and OmegaConf: the sweeper's config module imports it during Hydra's plugin scan."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from gpubench.config.errors import ConfigError

INT, FLOAT = "an integer", "a number"


class Role(str, Enum):
    """What a key is to a comparison of runs (gpubench.config.knobs)."""
    # what is trained (the default): runs differing here are other setups, never ranked together,
    # never changed by a recommendation
    workload = "workload"
    knob = "knob"  # a setting of the same training: searched, ranked, recommended
    measure = "measure"  # how a run was measured and tracked: a report pools runs differing here
    fault = "fault"  # fault injection, for tests: a run with any is never pooled with others


class Pipe(str, Enum):
    """Which phase's figure a key changes: compute (the step on a device-held batch; the data
    side's too) or data (the loader's alone: loader-only trials search it)."""
    compute = "compute"
    data = "data"


ACTIVE = "active"  # Knob.inert of a key that acts without loader workers too


@dataclasses.dataclass(frozen=True)
class Knob:
    role: Role = Role.workload
    pipe: Pipe | None = None
    short: str | None = None  # its name where shown: report columns, MLflow params, run names
    # a data knob's cost order (rank among keys, the value's rank): a setting is cheaper when
    # lower on the first ranked key where they differ
    cheap: tuple[int, Any] | None = None
    inert: Any = ACTIVE  # a key that acts only through loader workers: its value with none
    cuda_only: bool = False  # no effect on a CPU-only run
    process_only: bool = False  # acts through worker processes alone (inert with threads)
    # where a run happens (device, data folder), not what it trains: `--compare` pools across it
    place: bool = False


def setting(default: Any = dataclasses.MISSING, help: str = "",
            bounds: tuple[float, float | None] | None = None, *,
            factory: Any = dataclasses.MISSING, allowed: str | None = None,
            knob: Knob | None = None, rule: Callable[[Key, Any], None] | None = None) -> Any:
    """A schema field under Key's field names: `bounds` (low, high; high None: open), `allowed`:
    the docs' wording of a rule checked in code, `rule(key, value)`: a check beyond type, range
    and choices."""
    meta = {"help": help, "bounds": bounds, "wording": allowed, "knob": knob, "rule": rule}
    return dataclasses.field(default=default, default_factory=factory,
                             metadata={k: v for k, v in meta.items() if v is not None})


def name_rule(most: int) -> Callable[[Key, Any], None]:
    """A name MLflow (or Optuna) keeps: MLflow refuses an empty one only when logging, after the
    measurement; blanks and control characters it stores, showing broken rows."""
    def check(key: Key, value: Any) -> None:
        if not isinstance(value, str) or not value.strip() or len(value) > most or any(
                unicodedata.category(c).startswith("C") for c in value):
            raise ConfigError(key.name, value, key.allowed)  # check.allowed, `null or ` first

    check.allowed = (f"a name that is not blank, at most {most} characters, without control "
                     "characters")
    return check


_TYPE_TEXT = {bool: "true or false", str: "a string", list: "a list", dict: "a mapping"}


@dataclasses.dataclass(frozen=True)
class Key:
    name: str  # dotted, as on the command line (with the schema's prefix: hydra.sweeper.seed)
    path: str  # dotted, inside the schema's own node
    type: Any  # int, float, bool, str, list, dict or an Enum class (None taken out)
    nullable: bool
    default: Any  # (a factory's product for lists and dicts)
    help: str = ""
    bounds: tuple[float, float | None] | None = None
    item: Any = None  # a list's item type (bench.phases: Phase)
    wording: str | None = None  # setting(allowed=...): the docs' text of a rule checked in code
    knob: Knob = Knob()  # setting(knob=...), else its section's ROLE
    rule: Callable[[Key, Any], None] | None = None  # setting(rule=...)

    @property
    def kind(self) -> str | None:
        return INT if self.type is int else FLOAT if self.type is float else None

    @property
    def choices(self) -> type[Enum] | None:
        return next((tp for tp in (self.type, self.item)
                     if isinstance(tp, type) and issubclass(tp, Enum)), None)

    @property
    def allowed(self) -> str:
        null = "null or " if self.nullable else ""
        if self.bounds is not None:
            return null + self.within(self.bounds[1])
        if self.wording is not None:
            return self.wording
        if hasattr(self.rule, "allowed"):  # a rule that says what it takes (name_rule)
            return null + self.rule.allowed
        if (enum := self.choices) is not None:
            names = ", ".join(enum.__members__)
            return f"a list of {names}" if self.type is list else f"{null}one of {names}"
        return null + (self.kind or _TYPE_TEXT.get(self.type, "any value"))

    def within(self, high: float | None) -> str:
        """Its declared range up to `high` (this machine's, where lower), null not named."""
        low, high = (v if v is None else str(int(v)) if self.type is int else f"{v:g}"
                     for v in (self.bounds[0], high))
        kind = self.kind or FLOAT  # every bound declared has a low end
        return f"{kind} in [{low}, {high}]" if high else f"{kind} >= {low}"

    def check_type(self, value: Any) -> None:
        """A boolean key takes true or false as written (OmegaConf 2.3's BooleanNode takes 2,
        'yes', '0' too): overrides and YAML files are checked as read; an interpolation later."""
        interpolation = isinstance(value, str) and "${" in value
        if self.type is bool and not (isinstance(value, bool) or interpolation
                                      or (value is None and self.nullable)):
            raise ConfigError(self.name, value, self.allowed)

    def check(self, value: Any) -> None:
        self.check_type(value)
        if value is None and self.nullable:
            return
        if self.bounds is not None:
            low, high = self.bounds
            number = not isinstance(value, bool) and isinstance(value, (int, float))
            whole = number and (self.kind != INT or (math.isfinite(value)
                                                     and float(value) == int(value)))
            # written as "not inside" so NaN (which compares False to everything) is rejected too
            if not (whole and value >= low and (high is None or value <= high)):
                raise ConfigError(self.name, value, self.allowed)
        enum, names = self.choices, ", ".join(getattr(self.choices, "__members__", ()))
        if enum is not None and self.type is list:
            if not isinstance(value, Iterable) or isinstance(value, (str, bytes, Mapping)):
                raise ConfigError(self.name, value, self.allowed)
            bad = next((i for i, v in enumerate(value) if not _is_member(enum, v)), None)
            if bad is not None:
                raise ConfigError(f"{self.name}[{bad}]", value[bad], f"one of {names}")
        elif enum is not None and not _is_member(enum, value):
            raise ConfigError(self.name, value, self.allowed)
        if self.rule is not None:
            self.rule(self, value)


def _is_member(enum: type[Enum], value: Any) -> bool:
    # by name: a typed config holds the member (Hydra's plugin scan may load a second copy of the
    # sweeper's Enums), an untyped one (or a swept value) its name
    name = value.name if isinstance(value, Enum) else value
    return isinstance(name, str) and name in enum.__members__


def _unwrap(tp: Any) -> tuple[Any, bool, Any]:
    """(type, nullable, item type) of an annotation: `int | None` -> (int, True, None)."""
    nullable = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(tp))
        tp = args[0] if len(args) == 1 else Any
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return list, nullable, (*typing.get_args(tp), None)[0]
    if origin in (dict, Mapping):
        return dict, nullable, None
    return tp, nullable, None


def keys(schema: type, prefix: str = "") -> list[Key]:
    """A schema dataclass's keys, in order; a section's ROLE is its keys' default role."""
    out: list[Key] = []
    hints = typing.get_type_hints(schema)
    section = Knob(getattr(schema, "ROLE", Role.workload))
    for f in dataclasses.fields(schema):
        tp, nullable, item = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(tp):
            out += [dataclasses.replace(k, path=f"{f.name}.{k.path}")
                    for k in keys(tp, f"{prefix}{f.name}.")]
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append(Key(name=f"{prefix}{f.name}", path=f.name, type=tp, nullable=nullable,
                       default=default, item=item, **{"knob": section, **f.metadata}))
    return out


def lookup(node: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(node, Mapping) or hasattr(node, "keys"):
            node = node[part] if part in node else None
        else:
            node = getattr(node, part, None)
    return node


def check_keys(node: Any, declared: Iterable[Key], only: tuple[str, ...] | None = None) -> None:
    for k in declared:
        ruled = k.bounds is not None or k.choices is not None or k.type is bool or k.rule
        if ruled and (only is None or k.name in only):
            k.check(lookup(node, k.path))
