"""The command line's layer: its error lines, signals and callbacks."""

# `-cd DIR` made the primary config folder (gpubench.__main__.team_first), read by
# hydra_plugins.gpubench_searchpath: kept here, as Hydra's plugin scan re-executes that module
TEAM_DIR: str | None = None
