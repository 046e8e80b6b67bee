"""One line and an exit status for the exception that ended a command.

Hydra and OmegaConf raise typed exceptions whose attributes carry what the line needs: a config
group that has no such option (MissingConfigException: `missing_cfg_file`, `options`), a value
of the wrong type (ValidationError: `full_key`, `value`, and the node it was meant for). Those
are read, not their message text; the message is printed as it is only where no attribute says
more (its first line).
"""

from __future__ import annotations

import difflib
import re
import typing
from enum import Enum

from antlr4.error.Errors import LexerNoViableAltException
from hydra.core.override_parser.types import Override
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
# lines of Hydra's report that never explain the error: the override wrapper, the search path
_NOT_THE_REASON = ("Set the environment", "Config search path", "Error merging")


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


def _first_line(*reports: str) -> str:
    """The first line of Hydra's report that says what went wrong."""
    text = "\n".join(reports)
    for ln in text.splitlines():
        if ln.strip() and not ln.startswith((" ", "\t")) and not ln.startswith(_NOT_THE_REASON):
            return ln.strip()
    return text.strip()


def _applied_override(ex: BaseException) -> Override | None:
    """The override Hydra was applying when `ex` was raised. Hydra's exception for a key the
    config lacks carries neither the override's full key nor its value (its cause names the
    first missing part only: `lodaer` of `lodaer.batch_size=3`); the Override object it was
    applying is a local of the frame that raised, the innermost one that holds one."""
    found, tb = None, ex.__traceback__
    while tb is not None:
        found = next((v for v in tb.tb_frame.f_locals.values() if isinstance(v, Override)),
                     found)
        tb = tb.tb_next
    return found


def missing_key_line(ex: ConfigCompositionException) -> str | None:
    """An override of a key the config does not have (`loader.batchsize=32`), as the multirun
    check says it (gpubench.config.prechecks): the key, the value, the close keys, and how to
    add a new one; None for any other composition error."""
    cause = ex.__cause__
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    o = _applied_override(ex)
    key = o.key_or_group if o is not None else cause.full_key
    # the whole config, as far as it was composed: the missing key's parent leads to its root
    root = cause.parent_node._get_root() if cause.parent_node is not None else None
    known = _keys(root, skip=("hydra",)) if root is not None else [k.name for k in KEYS]
    close = difflib.get_close_matches(key, known, n=3)
    hint = f" (close: {', '.join(close)})" if close else ""
    # the value as it was typed (`true`, not Python's True)
    typed = f"={o.input_line.partition('=')[2]}" if o is not None and o.input_line else ""
    return f"{key}{typed} is not allowed: a key of the config{hint}; +{key}=... adds a new one"


def hydra_line(ex: HydraException | OmegaConfBaseException) -> str:
    """One line for an error of composing the config (a bad override, a missing option)."""
    if isinstance(ex, MissingConfigException) and ex.options is not None and \
            "/" in (ex.missing_cfg_file or ""):
        group, _, value = ex.missing_cfg_file.rpartition("/")
        return f"{group}={value} is not allowed: one of {', '.join(ex.options)}"
    if isinstance(ex, ConfigCompositionException):
        line = missing_key_line(ex)
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
    line = _first_line(str(ex), *([str(cause)] if cause is not None else []))
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
    # a character the lexer does not take: Hydra raises this from None and keeps the lexer
    # error's type only as the first word of its message
    lexer = str(ex.message).startswith(LexerNoViableAltException.__name__)
    syntax = UNQUOTED if lexer else "choice(a,b), range(a,b), interval(a,b), [a,b], {k: v}"
    line = f"{key}={value!r} is not allowed: a value in Hydra's override syntax ({syntax})"
    if not lexer:  # Hydra's reason (a type a function refused, a missing bracket) says more
        reason = [ln.strip() for ln in str(ex.message).splitlines()
                  if ln.strip() and not ln.startswith(("See https", "Error parsing override"))]
        line += f" (Hydra: {'; '.join(reason)[:200]})" if reason else ""
    if key == "model.name":
        names = known_models()
        close = difflib.get_close_matches(value, names, n=6, cutoff=0.6)
        return line + f"; model.name takes one of {', '.join(close or names)}"
    declared = next((k for k in KEYS if k.name == key), None)
    return line + (f"; {key} takes {declared.allowed}" if declared is not None else "")


def argparse_line(output: str) -> str | None:
    """argparse's reason from what it printed ("usage: ...", then "prog: error: why"), or None
    when the output is not argparse's."""
    m = re.search(r"^\S+: error: (.+)$", output, re.MULTILINE)
    if m and output.lstrip().startswith("usage:"):
        return f"{m.group(1)} (see gpubench --help)"
    return None


def held_line(output: str) -> str:
    """One line for a failure known only from what it printed (argparse exits after printing)."""
    return argparse_line(output) or _first_line(output)


def describe(ex: BaseException) -> tuple[str, ExitCode]:
    """One line and an exit status for the exception that ended the command."""
    ex = root_cause(ex)
    if isinstance(ex, ConfigError):
        return str(ex), ExitCode.BAD_INPUT
    if isinstance(ex, OverrideParseException):
        return override_line(ex), ExitCode.BAD_INPUT
    if isinstance(ex, (HydraException, OmegaConfBaseException)):
        return flat(hydra_line(ex)), ExitCode.BAD_INPUT
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
