"""The module graph: no import cycles (not even through imports inside functions), and the
torch-free modules stay torch-free (the sweeper, report and tracking load without torch)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gpubench", "hydra_plugins")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules `path` imports anywhere in it (module level or inside functions)."""
    out = set()
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + ".") and t not in PACKAGES:
                out.add(t)
    return out


def test_no_import_cycles():
    mods = _modules()
    graph = {m: _imports(p, m, set(mods)) for m, p in mods.items()}
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


TORCH_FREE = ("gpubench.record", "gpubench.stats", "gpubench.noise", "gpubench.files",
              "gpubench.report", "gpubench.config", "gpubench.settings")


def test_records_and_reports_load_without_torch():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in TORCH_FREE)
            + "bad = [m for m in ('torch', 'torchvision') if m in sys.modules]\n"
            + "assert not bad, bad\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
