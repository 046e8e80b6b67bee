"""Every `gpu` test's configuration, resolved on a CPU as a CUDA machine would resolve it.

The `gpu` tests skip themselves without CUDA, so a rule change that refuses their
configuration (the warm-up keys' cross-check once did) went unnoticed until a GPU was lent.
Each gpu test declares what it composes with conftest.gpu_config at its module's top; here
each is composed, resolved and checked against this machine's resources with CUDA taken as
present, and a gpu test that composes anything else is named."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest
from conftest import GPU_CONFIGS, ROOT, at, compose_config

from gpubench.config.settings import check_resources, resolve
from gpubench.parts import targets

TESTS = ROOT / "tests"
COMPOSERS = {"compose_cfg", "compose_config", "cfg_for", "_compose"}


def gpu_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "mark.gpu" in p.read_text())


for _path in gpu_modules():  # their gpu_config calls fill GPU_CONFIGS at import
    if str(_path.parent) not in sys.path:  # a layer's folder, as pytest's own import adds it
        sys.path.insert(0, str(_path.parent))
    importlib.import_module(_path.stem)


def _is_gpu_mark(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "gpu" and "mark" in ast.unparse(node)


def _gpu_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module's gpu-marked tests (a module-wide `pytestmark` marks all of them)."""
    whole = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark"
                                                  for t in n.targets)
                and _is_gpu_mark(n.value) for n in tree.body)
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
            and (whole or any(_is_gpu_mark(d) for d in n.decorator_list))]


def unregistered_compositions(path: Path) -> list[str]:
    """Calls in gpu tests that compose a config from anything but a registered name
    (`compose_cfg(*NAME)` or `compose_cfg(*at(NAME, folder))`, NAME = gpu_config(...))."""
    tree = ast.parse(path.read_text())
    registered = {t.id for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", "") ==
                  "gpu_config" for t in n.targets if isinstance(t, ast.Name)}

    def ok(arg: ast.expr) -> bool:
        if not isinstance(arg, ast.Starred):
            return False
        v = arg.value
        if isinstance(v, ast.Call) and getattr(v.func, "id", "") == "at" and v.args:
            v = v.args[0]
        return isinstance(v, ast.Name) and v.id in registered

    bad = []
    for fn in _gpu_functions(tree):
        for call in ast.walk(fn):
            if (isinstance(call, ast.Call) and getattr(call.func, "id", "") in COMPOSERS
                    and (not call.args or not all(ok(a) for a in call.args) or call.keywords)):
                bad.append(f"{path.name}:{call.lineno} {fn.name}: {ast.unparse(call)}")
    return bad


def test_every_gpu_test_composes_a_registered_configuration():
    assert gpu_modules(), "no gpu test found: the scan itself is broken"
    bad = [b for p in gpu_modules() for b in unregistered_compositions(p)]
    assert not bad, "declare these with conftest.gpu_config: " + "; ".join(bad)


def test_the_guard_names_an_inline_composition(tmp_path):
    """The scan above finds what it must refuse (a guard that finds nothing proves nothing)."""
    src = tmp_path / "test_x.py"
    src.write_text('import pytest\nOK = gpu_config("x", "bench.device=cuda")\n'
                   "@pytest.mark.gpu\ndef test_a(compose_cfg):\n"
                   '    compose_cfg(*OK)\n    compose_cfg(*OK, "bench.steps=3")\n'
                   "def test_cpu(compose_cfg):\n    compose_cfg(\"bench.steps=3\")\n")
    bad = unregistered_compositions(src)
    assert len(bad) == 1 and "bench.steps=3" in bad[0] and "test_a" in bad[0]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_imagefolder import make_imagefolder

    root = tmp_path_factory.mktemp("gpu_folder")
    make_imagefolder(root, classes=2, per_class=8, size=48, seed=4)
    return root


@pytest.mark.parametrize("name", sorted(GPU_CONFIGS))
def test_gpu_configuration_resolves_on_a_cuda_machine(name, image_folder, monkeypatch):
    monkeypatch.setattr("gpubench.config.settings.cuda_available", lambda: True)
    s = resolve(compose_config(*at(GPU_CONFIGS[name], image_folder)))
    assert s.device == "cuda"
    check_resources(s)
    targets.check(s)
