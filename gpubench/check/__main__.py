"""`python -m gpubench.check`: gpubench.check.suite.cli."""

from gpubench.check.suite import cli

if __name__ == "__main__":
    cli()
