"""`python -m gpubench.report`: see gpubench.report.cli."""

import sys

from gpubench.report.cli import main

sys.exit(main())
