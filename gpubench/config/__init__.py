"""gpubench's configuration: the schema (every key declared once), the checks derived from it, the
read-only settings. Importing the package registers the schema in Hydra's ConfigStore
(`gpubench_schema`, named by conf/bench.yaml's defaults), whichever module it imported."""

from gpubench.config import schema as _schema  # noqa: F401 - registers gpubench_schema
