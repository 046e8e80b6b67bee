"""gpubench's configuration; importing any of it registers `gpubench_schema` (bench.yaml's
defaults) in Hydra's ConfigStore."""

from gpubench.config import schema as _schema  # noqa: F401 - registers gpubench_schema
