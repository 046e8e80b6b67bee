"""The checks on Hydra's whole composed config (its `hydra` node included): group names, swept
keys and values, the sweeper's own keys, URIs; run by `InputCheck` before Hydra creates anything."""

from __future__ import annotations

import difflib
import math
from dataclasses import is_dataclass
from typing import Any

import yaml
from hydra._internal.config_repository import ConfigRepository
from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, QuotedString, RangeSweep, Sweep
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpubench.config.errors import ConfigError
from gpubench.config.footprint import check_local_store
from gpubench.config.keys import FLOAT, INT, Key, check_keys, keys, lookup
from gpubench.config.paths import CONFIG_DIR
from gpubench.config.schema import (
    BY_NAME,
    GROUP_NAMES,
    check_known_key,
    check_known_keys,
    config_keys,
    walk,
)
from gpubench.config.settings import (
    check_interpolations,
    check_model_name,
    known_models,
    plain,
    resolve,
)
from gpubench.config.uris import STORAGE_SCHEMES, check_tracking_uri, check_uri
from gpubench.core.ranges import NOT_EMPTY, range_last
from gpubench.core.uris import sqlite_path

# `optional` in bench.yaml's defaults: Hydra skips a name that does not exist without a word
OPTIONAL_GROUPS = ("sweep", "experiment")
_ABSENT = object()


def _at(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=None)


def _parser() -> OverridesParser:
    """With Hydra's config loader, if any: it knows the search path, and glob(...) lists keys."""
    instance = GlobalHydra.instance()
    return OverridesParser.create(
        config_loader=instance.config_loader() if instance.is_initialized() else None)


def group_hint(group: str, value: Any) -> str:
    """`model=resnet34` names a torchvision model: model.name takes it (the group has presets)."""
    return f"; use model.name={value}" if group == "model" and str(value) in known_models() else ""


def _repository(cfg: DictConfig) -> ConfigRepository:
    """The search path `cfg` was composed from (hydra.runtime.config_sources: a `hydra.searchpath`
    folder too, which the loader's repository lacks)."""
    path = ConfigSearchPathImpl()
    for src in _at(cfg, "hydra.runtime.config_sources"):
        path.append(src.provider, f"{src.schema}://{src.path}")
    return ConfigRepository(path)


def file_package(header: dict, group: str) -> str:
    """A config file's keys' prefix as Hydra places them (its group's; '' for _global_)."""
    package = (header.get("package") or "_group_").replace("_group_", group.replace("/", "."))
    return package.replace("_global_", "").strip(".")


def check_option(group: str, value: Any, cfg: DictConfig) -> None:
    """A chosen option is on `cfg`'s search path (Hydra skips an optional group's missing one)."""
    options = list(_repository(cfg).get_group_options(group))
    if str(value) not in options:
        raise ConfigError(group, value, f"one of {', '.join(options) or '(none)'} (conf/{group}/, "
                          f"a --config-dir or hydra.searchpath){group_hint(group, value)}")


def _swept_values(o) -> list:
    v = o.value()
    if isinstance(v, IntervalSweep):
        if not v.start < v.end:  # Optuna refuses it at the first trial, a grid samples nothing
            raise ConfigError(o.key_or_group, typed(o), "an interval(a,b) with a < b")
        return [v.start, v.end]
    if isinstance(v, RangeSweep):
        if not all(math.isfinite(x) for x in (v.start, v.stop, v.step)) or not v.step:
            raise ConfigError(o.key_or_group, typed(o), "a range(a,b[,step]) with finite numbers "
                                                        "and a step that is not 0")
        last = range_last(v.start, v.stop, v.step)
        if last is None:  # a grid would launch no job and end as if it had measured
            raise ConfigError(o.key_or_group, typed(o), NOT_EMPTY)
        return [v.start, last]
    # a quoted choice ('my run') comes as Hydra's QuotedString: the job gets its text
    return [v.text if isinstance(v, QuotedString) else v for v in o.sweep_iterator()]


def typed(o) -> str:
    """The value of a parsed override as it was typed (`true`, not Python's True)."""
    return o.input_line.partition("=")[2]


# what Hydra's lexer takes unquoted; anything else (an accent, a space, a comma) must be quoted
UNQUOTED = "unquoted: ASCII letters, digits and _-+.:/\\$%*@?|; quote anything else: key='value'"


def parse(text: str, key: str) -> Any:
    """One override by Hydra's parser; a malformed one is a ConfigError naming `key`."""
    try:
        return _parser().parse_overrides([text])[0]
    except HydraException:
        raise ConfigError(key, text, f"an override in Hydra's syntax, key=value ({UNQUOTED})"
                          ) from None


def unknown_key(key: str, value: Any, known: list[str], what: str = "",
                typed: str | None = None) -> ConfigError:
    """A key the config lacks: the declared (gpubench's groups) or close keys, or how to add it."""
    try:
        if key.split(".")[0] in GROUP_NAMES:  # a root key's near-miss: the close keys below
            check_known_key(key, value)
    except ConfigError as e:
        return ConfigError(key, value, e.allowed, typed)
    close = difflib.get_close_matches(key, known, n=3)
    # `+key=...` only where nothing is close (beside a near-miss it led to a typo run), and
    # never under hydra.: a key Hydra's or the sweeper's schema lacks is read by nothing
    hint = f" (close: {', '.join(close)})" if close else "" if key.startswith("hydra.") else \
        f"; +{key}=... adds a new one"
    return ConfigError(key, value, f"a key of the config{what}{hint}", typed)


def _left_to_set(cfg: DictConfig, key: str) -> bool:
    """A key held as `???` (select reads it as absent): a value to set, not a typo."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys() and OmegaConf.is_missing(node, leaf)


def _check_override(cfg: DictConfig, o, groups: dict) -> None:
    """A parsed override's key exists and takes each value it names: else every trial fails."""
    key = o.key_or_group
    if o.is_delete() or key.startswith(("hydra.", "hydra/")):
        return
    sweep = o.is_sweep_override()
    values = _swept_values(o) if sweep else [o.value()]
    if any(isinstance(v, Sweep) for v in values):  # `choice(8,16),choice(4)`
        raise ConfigError(key, typed(o), "one sweep of plain values: a,b,c, choice(a,b), "
                                         "range(a,b) or interval(a,b), not a sweep of sweeps")
    if key in groups:
        for v in values:
            check_option(key, v, cfg)
        return
    if o.is_add() or o.is_force_add():
        check_known_key(key, typed(o))
    elif OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT and not _left_to_set(cfg, key):
        raise unknown_key(key, typed(o), config_keys(cfg), " to sweep" if sweep else "")
    k = BY_NAME.get(key)
    if k is None:
        return
    if isinstance(v := o.value(), IntervalSweep) and k.kind != FLOAT:
        raise ConfigError(key, typed(o), f"range({int(v.start)},{int(v.end) + 1}) or choice(...) "
                          "for an integer key (an interval samples real numbers)"
                          if k.kind == INT else f"choice(...) of {k.allowed} (an interval "
                          "samples numbers)")
    if isinstance(v, RangeSweep) and k.kind == INT and any(
            isinstance(x, float) for x in (v.start, v.stop, v.step)):  # every job would fail
        raise ConfigError(key, typed(o), "range(a,b[,step]) of integers for an integer key (a "
                                         "float range samples real numbers)")
    for v in values:
        k.check(v)
        if k.name == "model.name":
            check_model_name(v)


def _overrides(cfg: DictConfig) -> tuple[list, list]:
    """The command line's and hydra.sweeper.params' overrides, parsed, apart; read unresolved
    (plain): an override's `${...}` is the job's to resolve (check_interpolations). The command
    line's parse: Hydra composed the config from them, by the same parser."""
    task = _parser().parse_overrides(list(plain(_at(cfg, "hydra.overrides.task")) or []))
    return task, [parse(f"{k}={v}", f"hydra.sweeper.params.{k}")
                  for k, v in (plain(_at(cfg, "hydra.sweeper.params")) or {}).items()]


def _first(o: Any) -> Any:
    """The override's value in one job: a sweep's first (a bad sweep: None, named later)."""
    if not o.is_sweep_override():
        return o.value()
    try:
        return _swept_values(o)[0]
    except (ConfigError, IndexError):
        return None


def _prefixed(values: Any, package: str) -> Any:
    for part in reversed([p for p in package.split(".") if p]):
        values = {part: values}
    return values


def _placed(raw: DictConfig, package: str) -> tuple[DictConfig, list] | None:
    """A file's values placed under its package (its defaults list aside), and its declared
    leaves (key, node); None: not a mapping (Hydra's own line says so)."""
    values = OmegaConf.to_container(raw, resolve=False)
    if not isinstance(values, dict):
        return None
    values.pop("defaults", None)
    placed = OmegaConf.create(_prefixed(values, package))
    return placed, [(k, n) for k, n in walk(placed)
                    if k in BY_NAME and not isinstance(n, DictConfig)]


def check_written(raw: DictConfig, package: str, where: str) -> None:
    """A YAML file's values as Hydra read them at `where` (hydra_plugins.gpubench_searchpath),
    before the schema turns `checkpointing: 2` into true; `package`: its keys' prefix ('' for
    primary, _global_). Read again as text: YAML 1.1 read `yes`, `on` as a boolean, refused here."""
    if (placed := _placed(raw, package)) is None:
        return
    with open(where, encoding="utf-8") as f:  # as Hydra just read it: it decoded
        spelled = _prefixed(yaml.load(f, Loader=yaml.BaseLoader), package)
    try:
        check_known_keys(placed[0])
        for key, node in placed[1]:
            value, as_text = node._value(), lookup(spelled, key)  # as the file spells it
            if isinstance(value, bool) and isinstance(as_text, str) and \
                    as_text.lower() not in ("true", "false"):
                value = as_text
            BY_NAME[key].check_type(value)
    except ConfigError as e:
        raise ConfigError(e.key, e.value, f"{e.allowed} (in {where})") from None


def check_team_files(cfg: DictConfig, groups: dict, overrides: list) -> None:
    """A team's chosen option files, each read once. A `hydra.searchpath` folder's (read by
    Hydra's file source, not gpubench's `Files`) is checked as written, as a `-cd` folder's is.
    A declared key a file leaves `???` that nothing else sets (an override, another chosen file)
    is refused: OmegaConf keeps the schema's default under a `???`, so `image_size: ???` ran at
    32 px. A file whose defaults list goes on after `_self_` (a later config may set it) is not."""
    sources = _at(cfg, "hydra.runtime.config_sources") or ()
    if not any(src.schema in ("file", "gpubench") and src.path != str(CONFIG_DIR)
               for src in sources):
        return  # gpubench's own files leave no declared key to set (test_presets)
    repo, given = _repository(cfg), {o.key_or_group for o in overrides}
    left: dict[str, str] = {}  # key -> the file that leaves it to set
    for group, option in groups.items():
        if not isinstance(option, str) or str(group).startswith("hydra"):
            continue  # (a list: Hydra's multi-select of a group)
        try:
            found = repo.load_config(f"{group}/{option}")
        except (HydraException, ConfigError, OSError, ValueError):  # composing it said so first
            continue
        package = file_package(found.header, str(group)) if found else ""
        if not found or (placed := _placed(found.config, package)) is None:
            continue
        defaults = found.defaults_list or []  # Hydra's, parsed out of the file
        after_self = any(d.is_self() for d in defaults) and not defaults[-1].is_self()
        where = f"{found.path.partition('://')[2]}/{group}/{option}.yaml"
        if found.path.startswith("file://"):  # a hydra.searchpath folder, which Files never read
            check_written(found.config, package, where)
        for key, node in placed[1]:
            if not node._is_missing():
                given.add(key)
            elif not after_self:
                left.setdefault(key, where)
    if key := min(set(left) - given, default=None):
        raise ConfigError(key, "???", f"a value (??? in {left[key]} marks one to set: {key}=... "
                                      "on the command line or in the file)")


def check_extra_overrides(cfg: DictConfig, sweeper: list[Key], groups: dict) -> None:
    """The sweeper's `*overrides` lists, checked like the command line's before any trial."""
    for k in (k for k in sweeper if k.name.endswith("overrides")):
        for i, text in enumerate(_at(cfg, k.name) or []):
            key = f"{k.name}[{i}]"
            o = parse(str(text), key)
            if o.is_sweep_override():
                raise ConfigError(key, str(text), "a plain override key=value (the sweeper "
                                                  "chooses the swept values)")
            try:
                _check_override(cfg, o, groups)
            except ConfigError as e:  # which list it came from, and the key in it
                raise ConfigError(key, str(text), f"{e.key}: {e.allowed}") from None


def check_before_work(cfg: DictConfig) -> None:
    groups = _at(cfg, "hydra.runtime.choices") or {}
    for group in OPTIONAL_GROUPS:
        if groups.get(group) is not None:
            check_option(group, groups[group], cfg)
    # a sweep's values and hydra.sweeper.params' (plain ones too) are not in the multirun's
    # config but given to each job: a `???` they set is set there
    task, params = _overrides(cfg)
    overrides, set_by_sweeper = task + params, {o.key_or_group for o in params}
    # params first: the command line's value wins, as the sweepers give it
    check_interpolations(cfg, {o.key_or_group: _first(o) for o in params + task
                               if o.is_sweep_override() or o.key_or_group in set_by_sweeper})
    check_known_keys(cfg)
    for o in overrides:  # a plain value has its key's type as written (composed, 2 reads as true)
        if o.is_sweep_override():
            _check_override(cfg, o, groups)
        elif o.key_or_group in BY_NAME and not o.is_delete():
            BY_NAME[o.key_or_group].check_type(o.value())
    check_team_files(cfg, groups, overrides)
    node = _at(cfg, "hydra.sweeper")
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    sweeper = keys(schema, "hydra.sweeper.") if is_dataclass(schema) else []  # its typed schema's
    # a negative seed is one line here, not a traceback after a study was made
    check_keys(node, sweeper)
    check_extra_overrides(cfg, sweeper, groups)
    if _at(cfg, "tracking.backend") == "mlflow":
        check_tracking_uri(_at(cfg, "tracking.uri"))
    if isinstance(storage := _at(cfg, "hydra.sweeper.storage"), str):
        check_uri("hydra.sweeper.storage", storage, STORAGE_SCHEMES)
        check_local_store("hydra.sweeper.storage", sqlite_path(storage), value=storage)


class InputCheck(Callback):
    """First in bench.yaml's hydra.callbacks: runs before a run dir, the sweeper or any other
    callback (the MLflow parent run) exists."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # a single run's settings too: Hydra makes the run's folder before the job resolves them
        # (bad input would leave an empty run). A multirun's jobs differ: check_extra_overrides
        self.on_multirun_start(config, settings=True)

    def on_multirun_start(self, config: DictConfig, settings: bool = False, **kwargs: Any) -> None:
        try:
            check_before_work(config)
            if settings:
                resolve(config, checked=True)
        except ConfigError as e:
            # Hydra turns an Exception raised in a callback into a warning and carries on: a
            # SystemExit ends the command (gpubench.cli.errors prints its ConfigError, exit 2)
            raise SystemExit(e) from None
