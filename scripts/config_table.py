"""Write the key tables of docs/configuration.md from the schemas' declarations: the run's keys
(gpubench.config.schema.BenchConfig) and the gpubench sweeper's (hydra.sweeper.*).

    python scripts/config_table.py          # rewrite the tables in the doc
    python scripts/config_table.py --check  # exit 1 when the doc is stale (tests/test_config.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # hydra_plugins from this checkout
DOC = ROOT / "docs" / "configuration.md"

from gpubench.config.doc import rewrite, section  # noqa: E402
from gpubench.config.keys import keys  # noqa: E402
from gpubench.config.schema import KEYS  # noqa: E402
from hydra_plugins.gpubench_sweeper.config import GpubenchSweeperConf  # noqa: E402


def generated() -> str:
    sweeper = [k for k in keys(GpubenchSweeperConf, "hydra.sweeper.") if k.path != "_target_"]
    return section(KEYS, roles=True) + "\n\n" + section(sweeper)


def main(argv: list[str]) -> int:
    doc = DOC.read_text()
    want = rewrite(doc, generated())
    if "--check" in argv:
        if want != doc:
            print(f"{DOC} is stale: run python scripts/config_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(want)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
