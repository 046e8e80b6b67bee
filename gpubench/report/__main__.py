import sys

from gpubench.core.exits import quiet_broken_pipe
from gpubench.report.cli import main

with quiet_broken_pipe():  # `... | head`: no traceback when the reader goes away
    code = main()
sys.exit(code)
