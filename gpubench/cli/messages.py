"""One line and an exit status for the exception that ended a command: Hydra's and OmegaConf's
read by their attributes (their text only where none says more), values as the overrides typed."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import errno
from collections.abc import Sequence

from antlr4.error.Errors import LexerNoViableAltException
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from gpubench.config.errors import NOTHING, ConfigError, cut
from gpubench.config.keys import Key, keys
from gpubench.config.prechecks import UNQUOTED, group_hint, typed, unknown_key
from gpubench.config.schema import BY_NAME as DECLARED
from gpubench.config.schema import config_keys, walk
from gpubench.config.settings import known_models
from gpubench.core.exits import ExitCode
from gpubench.core.files import LinkError, WriteError
from gpubench.search.jobs import SweepFailed

LONGEST = 400  # a line of a message that is not gpubench's own: its start and end


def flat(text: str) -> str:
    return cut("; ".join(part.strip() for part in str(text).splitlines() if part.strip()), LONGEST)


def _parsed(overrides: Sequence[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except (HydraException, ValueError):  # an override the parser refuses: unparsable() names it
        return []


def _declared(bad: ValidationError) -> tuple[Key, bool] | None:
    """A refused value's declaration (by its parent's schema); whether it was a list element."""
    node, name, element = bad.parent_node, bad.key, False
    if isinstance(node, ListConfig):
        node, name, element = node._get_parent(), node._key(), True
    schema = OmegaConf.get_type(node) if node is not None else None
    if not dataclasses.is_dataclass(schema):
        return None
    try:
        declared = keys(schema)
    except (NameError, TypeError):  # a schema whose annotations do not resolve here
        return None
    return next(((k, element) for k in declared if k.path == name), None)


def missing_key_line(ex: ConfigCompositionException, parsed: list[Override]) -> ConfigError | None:
    """A key the config lacks (`loader.batchsize=32`, a team YAML's `extra_key`), else None."""
    cause = ex.__cause__ or ex.__context__  # an override's error is the cause, a file's the context
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    # the first override naming the missing key (or its first part: `lodaer` of `lodaer.x=3`)
    missing = cause.full_key
    o = next((o for o in parsed if o.key_or_group == missing
              or o.key_or_group.startswith(f"{missing}.")), None)
    if o is None:  # else the nearest parent given a value (not `dataset=custom` for dataset.x)
        o = max((o for o in parsed if missing.startswith(f"{o.key_or_group}.")),
                key=lambda o: len(o.key_or_group), default=None)
    key = o.key_or_group if o is not None else missing
    value, written = (o.value(), typed(o)) if o is not None else (None, None)
    if o is not None and missing.startswith(f"{key}."):
        # a mapping given to the parent (`dataset.collate={_target_: ...}`): its value there
        for part in missing[len(key) + 1:].split("."):
            value = value.get(part) if isinstance(value, dict) else None
        key, written = missing, None
    # the config as far as composed: the missing key's parent leads to its root
    root = cause.parent_node._get_root() if cause.parent_node is not None else None
    known = list(DECLARED) if root is None else config_keys(root)
    if root is not None and key.startswith("hydra."):
        # siblings by their last part (the long common prefix made hydra.sweeper.bogus "close"
        # to hydra.sweeper._target_)
        parent, _, leaf = key.rpartition(".")
        sibling = {k.rpartition(".")[2]: k for k, _ in walk(root) if k.rpartition(".")[0] == parent}
        known = [sibling[c] for c in difflib.get_close_matches(leaf, list(sibling), n=3)]
    return unknown_key(key, value, known, typed=written)


def deleted_line(parsed: list[Override]) -> ConfigError | None:
    """`~loader.batch_size`: a declared key is set, never deleted."""
    o = next((o for o in parsed if o.is_delete() and o.key_or_group in DECLARED), None)
    if o is None:
        return None
    k = DECLARED[o.key_or_group]
    return ConfigError(f"~{k.name}", NOTHING, f"a key gpubench declares is set, not deleted: "
                                              f"{k.name}=... takes {k.allowed}")


def sweep_line(ex: ConfigCompositionException, parsed: list[Override]) -> ConfigError | None:
    """A single run's sweep (Hydra's uncaused "Ambiguous value"); a hydra.* one is Hydra's word."""
    o = next((o for o in parsed if o.is_sweep_override()), None)
    if ex.__cause__ or ex.__context__ or o is None or o.key_or_group.startswith(("hydra.",
                                                                              "hydra/")):
        return None
    text, k = typed(o), DECLARED.get(o.key_or_group)
    # a team's own key (undeclared) may take a list or a text with commas
    also = f"; [{text}] is a list, '{text}' a text" if k is None and "." in o.key_or_group \
        and o.value_type is ValueType.SIMPLE_CHOICE_SWEEP else ""
    what = f"one value ({k.allowed})" if k is not None else "one value"
    return ConfigError(o.key_or_group, text, f"{what} in a single run: -m (--multirun) sweeps "
                                             f"it{also}", text)


def hydra_line(ex: HydraException | OmegaConfBaseException, overrides: Sequence[str] = (),
               multirun: bool = False) -> str:
    """An error composing the config; `multirun`: the command has -m (a sweep is no error)."""
    if isinstance(ex, MissingConfigException) and ex.options is not None and \
            "/" in (ex.missing_cfg_file or ""):
        group, _, value = ex.missing_cfg_file.rpartition("/")
        return str(ConfigError(group, value, f"one of {', '.join(ex.options)}"
                               f"{group_hint(group, value)}", value))
    parsed = _parsed(overrides)
    if isinstance(ex, ConfigCompositionException):
        line = missing_key_line(ex, parsed) or deleted_line(parsed) or (
            None if multirun else sweep_line(ex, parsed))
        if line is not None:
            return str(line)
    # Hydra wraps OmegaConf's error of merging an override: the key and value are the cause's
    cause = ex.__cause__ or ex.__context__
    bad = ex if isinstance(ex, OmegaConfBaseException) else \
        cause if isinstance(cause, OmegaConfBaseException) else None
    declared = _declared(bad) if isinstance(bad, ValidationError) else None
    if declared is not None:
        k, element = declared
        allowed = f"one of {', '.join(k.choices.__members__)}" if element and k.choices else \
            k.allowed
        # of a key set twice (`x=4 ... x=abc`), the override whose value OmegaConf refused
        same = [o for o in parsed if o.key_or_group == bad.full_key]
        o = next((o for o in same if str(o.value()) == str(bad.value)), same[-1] if same else None)
        return str(ConfigError(bad.full_key, bad.value, allowed,
                               typed(o) if o is not None else str(bad.value)))
    key, said = (bad.full_key, bad) if bad is not None else (None, ex)
    # the first line: OmegaConf's next are the key and the node's type; Hydra's, the search path
    line = next((ln.strip() for ln in str(said).splitlines() if ln.strip()), type(said).__name__)
    return flat(f"{key}: {line}" if key else line)


def override_line(text: str, reason: BaseException | None) -> str:
    """An override Hydra's parser refused: what the syntax allows, what the key takes."""
    key, eq, value = text.partition("=")
    key = key.strip().lstrip("+~")
    if not eq:
        return str(ConfigError(repr(text), NOTHING,
                               f"an override key=value in Hydra's syntax ({UNQUOTED})"))
    # a character the lexer refuses: the parser's exception is raised while the lexer's is
    # handled (overrides_parser.py, HydraErrorListener)
    lexer = isinstance(getattr(reason, "__context__", None), LexerNoViableAltException)
    syntax = UNQUOTED if lexer else "choice(a,b), range(a,b), interval(a,b), [a,b], {k: v}"
    allowed = f"a value in Hydra's override syntax ({syntax})"
    if not lexer and reason is not None:  # a type a function refused, a missing bracket
        allowed += f" (Hydra: {flat(str(reason))[:200]})"
    if key == "model.name":
        names = known_models()
        takes = "one of " + ", ".join(difflib.get_close_matches(value, names, n=6, cutoff=0.6)
                                      or names)
    else:
        takes = getattr(DECLARED.get(key), "allowed", None)
    return str(ConfigError(key, value, allowed + (f"; {key} takes {takes}" if takes else "")))


def unparsable(overrides: Sequence[str]) -> tuple[str, BaseException] | None:
    """The first override Hydra's parser refuses, and why (its ValueError names no override)."""
    parser = OverridesParser.create()
    for text in overrides:
        try:
            parser.parse_overrides([text])
        except OverrideParseException as e:
            return text, e.__context__
        except ValueError as e:
            return text, e
    return None


def describe(ex: BaseException, overrides: Sequence[str] = (),
             multirun: bool = False) -> tuple[str, ExitCode]:
    # the error under Hydra's InstantiationException ('Error in call to target')
    while isinstance(ex, InstantiationException) and ex.__cause__ is not None:
        ex = ex.__cause__
    if isinstance(ex, ConfigError):
        return str(ex), ExitCode.BAD_INPUT
    if isinstance(ex, argparse.ArgumentError):  # the command line itself: no such flag
        return f"{ex} (see gpubench --help)", ExitCode.BAD_INPUT
    if isinstance(ex, OverrideParseException):
        return override_line(ex.override or "", ex.__context__), ExitCode.BAD_INPUT
    if isinstance(ex, (HydraException, OmegaConfBaseException)):
        return hydra_line(ex, overrides, multirun), ExitCode.BAD_INPUT
    if isinstance(ex, (SweepFailed, WriteError, LinkError)):  # already one line
        return str(ex), ex.code if isinstance(ex, SweepFailed) else ExitCode.FAILED
    if isinstance(ex, OSError) and ex.errno == errno.ENAMETOOLONG:
        # a value made a path: a group's option (Hydra looks for its file), a folder
        o = next((o for o in _parsed(overrides) if isinstance(o.value(), str) and o.value()
                  and o.value() in str(ex.filename)), None)
        if o is not None:
            return str(ConfigError(o.key_or_group, o.value(), "a name the file system takes "
                                   "(a path's names at most 255 characters)")), ExitCode.BAD_INPUT
    if isinstance(ex, OSError):
        # the path is the useful part: "[Errno 30] Read-only file system: '/x'" reads backwards
        where = f"{cut(str(ex.filename))}: " if ex.filename and \
            str(ex.filename) not in str(ex.strerror) else ""
        return f"{where}{flat(ex.strerror or str(ex))} ({type(ex).__name__})", ExitCode.FAILED
    if isinstance(ex, ValueError) and str(ex).strip():
        refused = unparsable(overrides)  # Hydra's parser raised it, naming no override
        if refused is not None:
            return override_line(*refused), ExitCode.BAD_INPUT
        # a setting the sweeper or a library refused names itself; other types fail by name
        return flat(str(ex)), ExitCode.BAD_INPUT
    return f"{type(ex).__name__}: {flat(str(ex))}", ExitCode.FAILED
