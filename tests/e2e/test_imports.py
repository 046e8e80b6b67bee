"""The module graph: the layers of gpubench (LAYERS: which subpackage may import which), no
import cycles (imports inside functions included), and the
torch-free modules stay torch-free (the sweeper, report and tracking load without torch).
docs/architecture.md shows LAYERS; a test fails when the two disagree."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpubench", "hydra_plugins")

# The layers, bottom up, and what each may import (besides itself). `gpubench` is the entry
# modules at the package's top (`__main__`, `__init__`); `hydra_plugins` the sweeper's thin front.
LAYERS: dict[str, tuple[str, ...]] = {
    "core": (),
    "config": ("core",),
    "parts": ("core", "config"),
    "telemetry": ("core", "config"),
    "analysis": ("core", "config"),
    "search": ("core", "config", "analysis"),
    "tracking": ("core", "config", "analysis", "search", "telemetry"),
    "report": ("core", "config", "analysis", "search", "tracking"),
    "run": ("core", "config", "parts", "telemetry", "analysis", "tracking", "report"),
    "cli": ("core", "config", "analysis", "search", "tracking", "report", "run"),
    "check": ("core", "config", "parts", "telemetry", "analysis", "report", "run", "cli"),
    "gpubench": ("core", "config", "cli", "run"),
    "hydra_plugins": ("core", "config", "search", "report", "cli"),
}


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


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "hydra_plugins"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "gpubench"


def test_every_module_sits_in_a_layer():
    stray = [m for m in _modules() if layer_of(m) not in LAYERS]
    assert not stray, f"modules outside the layers: {stray}"
    entry = sorted(m for m in _modules() if layer_of(m) == "gpubench")
    assert entry == ["gpubench", "gpubench.__main__"], entry


def test_no_lower_layer_imports_a_higher_one():
    mods = _modules()
    bad = []
    for m, p in sorted(mods.items()):
        for t in sorted(_imports(p, m, set(mods))):
            a, b = layer_of(m), layer_of(t)
            if a != b and b not in LAYERS[a]:
                bad.append(f"{m} ({a}) imports {t} ({b})")
    assert not bad, "imports across layers the map forbids:\n" + "\n".join(bad)


def test_layer_check_catches_an_upward_import(tmp_path):
    """The check itself: a core module importing the report is reported."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from gpubench.report.write import sweep_report\n")
    mods = _modules()
    targets = _imports(f, "gpubench.core.x", set(mods))
    assert "gpubench.report.write" in targets
    assert "report" not in LAYERS[layer_of("gpubench.core.x")]


def _documented_layers() -> dict[str, tuple[str, ...]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            may = tuple(re.findall(r"`([a-z_]+)`", cells[2]))
            out[cells[0].strip("`")] = may
    return out


def test_architecture_doc_shows_the_layer_map():
    assert _documented_layers() == LAYERS


TORCH_FREE = ("gpubench.core.record", "gpubench.core.stats", "gpubench.core.files",
              "gpubench.core.secrets", "gpubench.config.schema", "gpubench.config.settings",
              "gpubench.config.keys", "gpubench.config.prechecks", "gpubench.config.uris",
              "gpubench.config.errors", "gpubench.config.paths",
              "gpubench.analysis.noise", "gpubench.analysis.verdict",
              "gpubench.analysis.recommend", "gpubench.search.rows", "gpubench.report.write",
              "gpubench.report.cli", "gpubench.tracking.translate")


@pytest.mark.slow
def test_records_and_reports_load_without_torch():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in TORCH_FREE)
            + "bad = [m for m in ('torch', 'torchvision') if m in sys.modules]\n"
            + "assert not bad, bad\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
