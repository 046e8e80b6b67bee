"""One line and an exit status for the exception that ended a command.

Hydra and OmegaConf raise typed exceptions whose attributes carry what the line needs: a config
group that has no such option (MissingConfigException: `missing_cfg_file`, `options`), a value
of the wrong type (ValidationError: `full_key`, `value`, and the node it was meant for), an
override the parser refused (OverrideParseException: `override`). Those are read, not their
message text; a message is printed only where no attribute says more (its first line). The
command's own overrides name the value of a key the config lacks (Hydra's exception does not).
"""

from __future__ import annotations

import argparse
import difflib
import typing
from collections.abc import Sequence
from enum import Enum

from antlr4.error.Errors import LexerNoViableAltException
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import BooleanNode, EnumNode, FloatNode, IntegerNode
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from gpubench.config.errors import ConfigError
from gpubench.config.prechecks import UNQUOTED, _keys
from gpubench.config.schema import KEYS
from gpubench.config.settings import known_models
from gpubench.core.exits import ExitCode
from gpubench.core.files import WriteError

# what a value must be, by the type it was meant for
_KINDS: dict[type, str] = {int: "an integer", float: "a number", bool: "true or false"}
_NODE_TYPES: dict[type, type] = {IntegerNode: int, FloatNode: float, BooleanNode: bool}


def root_cause(ex: BaseException) -> BaseException:
    """The error under Hydra's wrappers: instantiating the sweeper or a callback wraps whatever
    its constructor raised in an InstantiationException whose text is 'Error in call to target'."""
    seen = set()
    while isinstance(ex, InstantiationException) and ex.__cause__ is not None and id(ex) not in seen:
        seen.add(id(ex))
        ex = ex.__cause__
    return ex


def flat(text: str) -> str:
    """A message of several lines as one."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def first_line(ex: BaseException) -> str:
    """An exception's reason: the first line of its message (OmegaConf's next lines are the key
    and the node's type; Hydra's, the search path)."""
    return next((ln.strip() for ln in str(ex).splitlines() if ln.strip()), type(ex).__name__)


def _expected_type(bad: ValidationError) -> type | None:
    """The type the refused value was meant to have: the node's (an Enum, int, float, bool), or
    a list's element type for an element (`bench.phases[1]`)."""
    node = bad.child_node
    if isinstance(node, EnumNode):
        return node.enum_type
    for node_type, t in _NODE_TYPES.items():
        if isinstance(node, node_type):
            return t
    if node is None and typing.get_origin(bad.ref_type) is list:
        (element,) = typing.get_args(bad.ref_type) or (None,)
        return element
    return None


def _allowed(t: type | None) -> str | None:
    if isinstance(t, type) and issubclass(t, Enum):
        # the names, as OmegaConf accepts them on the command line
        return "one of " + ", ".join(t.__members__)
    return _KINDS.get(t) if t is not None else None


def missing_key_line(ex: ConfigCompositionException, overrides: Sequence[str] = ()) -> str | None:
    """An override of a key the config does not have (`loader.batchsize=32`), as the multirun
    check says it (gpubench.config.prechecks): the key, the value, the close keys, and how to
    add a new one; None for any other composition error."""
    cause = ex.__cause__
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    # the cause names the missing key, or its first missing part only (`lodaer` of
    # `lodaer.batch_size=3`): the override applied is the command's first that names it
    missing = cause.full_key
    o = next((o for o in OverridesParser.create().parse_overrides(list(overrides))
              if o.key_or_group == missing or o.key_or_group.startswith(f"{missing}.")), None)
    key = o.key_or_group if o is not None else missing
    # the whole config, as far as it was composed: the missing key's parent leads to its root
    root = cause.parent_node._get_root() if cause.parent_node is not None else None
    known = _keys(root, skip=("hydra",)) if root is not None else [k.name for k in KEYS]
    close = difflib.get_close_matches(key, known, n=3)
    hint = f" (close: {', '.join(close)})" if close else ""
    # the value as it was typed (`true`, not Python's True)
    typed = f"={o.input_line.partition('=')[2]}" if o is not None and o.input_line else ""
    return f"{key}{typed} is not allowed: a key of the config{hint}; +{key}=... adds a new one"


def hydra_line(ex: HydraException | OmegaConfBaseException, overrides: Sequence[str] = ()) -> str:
    """One line for an error of composing the config (a bad override, a missing option)."""
    if isinstance(ex, MissingConfigException) and ex.options is not None and \
            "/" in (ex.missing_cfg_file or ""):
        group, _, value = ex.missing_cfg_file.rpartition("/")
        return f"{group}={value} is not allowed: one of {', '.join(ex.options)}"
    if isinstance(ex, ConfigCompositionException):
        line = missing_key_line(ex, overrides)
        if line is not None:
            return line
    # Hydra wraps OmegaConf's error of merging an override: the key and value are the cause's
    cause = ex.__cause__ if isinstance(ex.__cause__, OmegaConfBaseException) else None
    bad = ex if isinstance(ex, OmegaConfBaseException) else cause
    key = bad.full_key if bad is not None else None
    if key and isinstance(bad, ValidationError) and bad.value is not None:
        allowed = _allowed(_expected_type(bad))
        if allowed:
            return f"{key}={bad.value} is not allowed: {allowed}"
    line = first_line(bad if bad is not None else ex)
    return f"{key}: {line}" if key else line


def override_line(ex: OverrideParseException) -> str:
    """One line for an override Hydra's parser refused (its attribute `override` is the text):
    a character its lexer does not take unquoted (an accent, a space) or a broken sweep. Says
    what the syntax allows and what the key takes; for model.name, the models."""
    text = ex.override or ""
    key, eq, value = text.partition("=")
    key = key.strip().lstrip("+~")
    if not eq:
        return f"{text!r} is not allowed: an override key=value in Hydra's syntax ({UNQUOTED})"
    # Hydra raises this from None over the parser's own HydraException (its reason), raised
    # while the lexer's error was handled for a character the lexer does not take
    # (hydra/core/override_parser/overrides_parser.py parse_overrides, HydraErrorListener)
    reason = ex.__context__
    lexer = isinstance(getattr(reason, "__context__", None), LexerNoViableAltException)
    syntax = UNQUOTED if lexer else "choice(a,b), range(a,b), interval(a,b), [a,b], {k: v}"
    line = f"{key}={value!r} is not allowed: a value in Hydra's override syntax ({syntax})"
    if not lexer and reason is not None:  # a type a function refused, a missing bracket
        line += f" (Hydra: {flat(str(reason))[:200]})"
    if key == "model.name":
        names = known_models()
        close = difflib.get_close_matches(value, names, n=6, cutoff=0.6)
        return line + f"; model.name takes one of {', '.join(close or names)}"
    declared = next((k for k in KEYS if k.name == key), None)
    return line + (f"; {key} takes {declared.allowed}" if declared is not None else "")


def describe(ex: BaseException, overrides: Sequence[str] = ()) -> tuple[str, ExitCode]:
    """One line and an exit status for the exception that ended the command; `overrides`: the
    command's (they name the value of a key the config lacks)."""
    ex = root_cause(ex)
    if isinstance(ex, ConfigError):
        return str(ex), ExitCode.BAD_INPUT
    if isinstance(ex, argparse.ArgumentError):  # the command line itself: no such flag
        return f"{ex} (see gpubench --help)", ExitCode.BAD_INPUT
    if isinstance(ex, OverrideParseException):
        return override_line(ex), ExitCode.BAD_INPUT
    if isinstance(ex, (HydraException, OmegaConfBaseException)):
        return flat(hydra_line(ex, overrides)), ExitCode.BAD_INPUT
    if isinstance(ex, WriteError):  # already one line: the path, the reason, the free space
        return str(ex), ExitCode.FAILED
    if isinstance(ex, OSError):
        # the path is the useful part: "[Errno 30] Read-only file system: '/x'" reads backwards
        where = f"{ex.filename}: " if ex.filename and str(ex.filename) not in str(ex.strerror) else ""
        return f"{where}{flat(ex.strerror or str(ex))} ({type(ex).__name__})", ExitCode.FAILED
    if isinstance(ex, ValueError) and str(ex).strip():
        # a setting refused by the sweeper or a library (a search space, a sampler): its own
        # message names it. Other types (TypeError, KeyError...) keep their name: a failure.
        return flat(str(ex)), ExitCode.BAD_INPUT
    return f"{type(ex).__name__}: {flat(str(ex))}", ExitCode.FAILED
