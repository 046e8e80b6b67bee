"""The checks that run on Hydra's whole composed config (its `hydra` node included) before Hydra
creates anything: group names, swept keys and values, the sweeper's own keys, URIs.

`InputCheck` is listed first in bench.yaml's hydra.callbacks, so it runs before a run dir, the
sweeper or the MLflow parent run exists. The rules on the run's own config are in
gpubench.config.settings (resolve), which every job applies.
"""

from __future__ import annotations

import difflib
from dataclasses import is_dataclass
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, RangeSweep
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpubench.config.errors import ConfigError
from gpubench.config.keys import check_keys, keys
from gpubench.config.paths import CONFIG_DIR
from gpubench.config.schema import KEYS
from gpubench.config.uris import STORAGE_SCHEMES, check_tracking_uri, check_uri
from gpubench.core.ranges import range_last

# `optional` in bench.yaml's defaults: Hydra skips a name that does not exist without a word
OPTIONAL_GROUPS = ("sweep", "experiment")


def group_options(group: str) -> list[str]:
    """Option names of a config group, from every folder on the search path (--config-dir too)."""
    if GlobalHydra.instance().is_initialized():
        return list(GlobalHydra.instance().config_loader().get_group_options(group))
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def check_choices(cfg: DictConfig) -> None:
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    for group in OPTIONAL_GROUPS:
        name = choices.get(group)
        if name is None:
            continue
        options = group_options(group)
        if name not in options:
            raise ConfigError(group, name, f"one of {', '.join(options) or '(none)'} "
                                           f"(conf/{group}/ or a --config-dir)")


_ABSENT = object()


def _swept_values(o) -> list:
    """The values a sweep override names: every choice, a range's ends, an interval's ends."""
    v = o.value()
    if isinstance(v, IntervalSweep):
        return [v.start, v.end]
    if isinstance(v, RangeSweep):
        last = range_last(v.start, v.stop, v.step)
        return [v.start, last] if last is not None else []
    return list(o.sweep_iterator())


def _keys(node: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Every dotted key under `node` (nodes read unresolved), the top-level `skip` left out."""
    if not isinstance(node, DictConfig):
        return []
    out = []
    for k in node.keys():
        if k in skip:
            continue
        key = f"{prefix}{k}"
        out.append(key)
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            out += _keys(child, key + ".")
    return out


def check_sweep_overrides(cfg: DictConfig) -> None:
    """Every swept key of a multirun (`key=a,b`, `choice(...)`, `range(...)`, `interval(...)`,
    on the command line or in hydra.sweeper.params) names a key of the config or a config
    group, and its values are in the key's range or choices (its declaration in the schema) or
    among the group's options: a misspelled key or a value out of range would otherwise fail
    every trial, one by one."""
    task = list(OmegaConf.select(cfg, "hydra.overrides.task", default=None) or [])
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    texts = task + [f"{k}={v}" for k, v in params.items()]
    try:
        overrides = OverridesParser.create().parse_overrides(texts)
    except Exception:  # Hydra itself reports a malformed override
        return
    groups = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    declared = {k.name: k for k in KEYS}
    for o in overrides:
        key = o.key_or_group
        if (not o.is_sweep_override() or o.is_add() or o.is_force_add() or o.is_delete()
                or key.startswith(("hydra.", "hydra/"))):
            continue
        values = _swept_values(o)
        if key in groups:
            options = group_options(key)
            for v in values:
                if str(v) not in options:
                    raise ConfigError(key, v, f"one of {', '.join(options)} (conf/{key}/ or a "
                                              "--config-dir)")
            continue
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            close = difflib.get_close_matches(key, _keys(cfg, skip=("hydra",)), n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise ConfigError(key, o.input_line.split("=", 1)[-1] if o.input_line else values,
                              f"a key of the config to sweep{hint}; +{key}=... adds a new one")
        if key in declared:
            for v in values:
                declared[key].check(v)


def check_sweeper(cfg: DictConfig) -> None:
    """hydra.sweeper's own keys against their declarations, when the sweeper's config is a typed
    schema (gpubench's GpubenchSweeperConf, found from the node's type): a negative seed is one
    line here, not a traceback after a study was made."""
    node = OmegaConf.select(cfg, "hydra.sweeper", default=None)
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if schema is not None and is_dataclass(schema):
        check_keys(node, keys(schema, "hydra.sweeper."))


def check_before_work(cfg: DictConfig) -> None:
    """What can be checked on the whole composed config (with its `hydra` node) before Hydra
    creates a run dir, a sweeper or an MLflow parent run: group names, swept keys and values,
    the sweeper's own keys, and URIs."""
    check_choices(cfg)
    check_sweep_overrides(cfg)
    check_sweeper(cfg)
    if OmegaConf.select(cfg, "tracking.backend") == "mlflow":
        check_tracking_uri(OmegaConf.select(cfg, "tracking.uri"))
    storage = OmegaConf.select(cfg, "hydra.sweeper.storage", default=None)
    if isinstance(storage, str):
        check_uri("hydra.sweeper.storage", storage, STORAGE_SCHEMES)


class InputCheck(Callback):
    """Listed first in bench.yaml's hydra.callbacks: Hydra calls it on the composed config
    before the sweeper is built and before any other callback (the MLflow parent run) starts."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    @staticmethod
    def _check(config: DictConfig) -> None:
        try:
            check_before_work(config)
        except ConfigError as e:
            # a SystemExit carrying the ConfigError: Hydra turns an Exception raised in a
            # callback into a warning and carries on; this ends the command, and
            # gpubench.cli.errors prints the ConfigError as one line, exit 2
            raise SystemExit(e) from None
