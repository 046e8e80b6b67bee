"""gpubench's configuration: the schema (every key declared once), the checks derived from it, the
read-only settings, the checks before Hydra runs.

Importing the package registers the schema in Hydra's ConfigStore: conf/bench.yaml's defaults
name it (`gpubench_schema`), so whatever composes gpubench's configs (CONFIG_DIR from
config.paths) finds it, whichever config module it imported.
"""

from gpubench.config import schema as _schema  # noqa: F401 - registers gpubench_schema
