"""gpubench's config search path: a team's folder before gpubench's own, each file checked as read.

`python -m gpubench -cd DIR` makes DIR the primary config folder and gpubench's own folder comes
right after it, so a team's `model/tiny.yaml` wins (Hydra's --config-dir puts DIR after the
primary folder: hydra 1.3.8 _run_hydra, add_conf_dir). Both are read through `Files`, which
checks each file's values as written. Other Hydra applications keep their own search path."""

from __future__ import annotations

import os

import yaml
from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.config_source import ConfigLoadError, ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin

SCHEME = "gpubench"


class Files(FileConfigSource):
    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        from gpubench.config.errors import ConfigError
        from gpubench.config.prechecks import check_written, file_package

        where = os.path.join(self.path, self._normalize_file_name(config_path))
        group, _, name = config_path.rpartition("/")
        try:
            result = super().load_config(config_path)
        except ConfigLoadError:  # no such file: Hydra's to report
            raise
        except (OSError, ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
            reason = " ".join(str(e).split())  # YAML's names the file and line
            raise ConfigError(group or "--config-name", name, "a YAML file gpubench can read ("
                              f"{reason if where in reason else f'{where}: {reason}'})") from None
        check_written(result.config, file_package(result.header, group), where)
        return result


class SearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from gpubench.cli import TEAM_DIR
        from gpubench.config.paths import CONFIG_DIR

        main = next((e for e in search_path.get_path() if e.provider == "main"), None)
        folder = main.path.removeprefix("file://") if main is not None else None
        if folder is None or folder not in (str(CONFIG_DIR), TEAM_DIR):
            return
        main.path = f"{SCHEME}://{folder}"
        if folder != str(CONFIG_DIR):
            search_path.append("gpubench", f"{SCHEME}://{CONFIG_DIR}", anchor="main")
