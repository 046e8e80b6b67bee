"""The argument parser of gpubench's small commands (`python -m gpubench.report`, `... tracking`):
a bad argument is one line, without the usage block, exit 2 (argparse's own for bad input)."""

from __future__ import annotations

import argparse
import re

from gpubench.core.exits import ExitCode
from gpubench.core.secrets import mask_secrets


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        # a type's own "--flag=value is not allowed: ..." needs no "argument --flag: " before it
        message = mask_secrets(re.sub(r"^argument (\S+): (?=\1=)", "", message))
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")
