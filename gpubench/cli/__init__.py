"""The command line's layer: its error lines, signals and callbacks."""

# `-cd DIR` as the command line made it the primary config folder (gpubench.__main__.team_first),
# read by the search path plugin (hydra_plugins.gpubench_searchpath): kept here, as Hydra's
# plugin scan executes the plugin's module again and would reset it there
TEAM_DIR: str | None = None
