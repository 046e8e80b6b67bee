"""A team's own model and data pipeline, as gpubench measures them (see ../README.md)."""
