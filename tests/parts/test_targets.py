"""The one check of every `_target_` gpubench calls (gpubench/parts/targets.py), by kind: a
library function is refused before Hydra calls it, wherever it is named (transform, collate,
a nested node, a team module's re-export); what the rule admits (torchvision's transforms,
torch's default_collate, an nn.Module, the team's own code) is decided by where the code
lives, not by a list of names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from mlflow.utils.process import _exec_cmd  # noqa: F401 - re-exported, as a team module may
from torch.utils.data import Dataset

from gpubench.config.errors import ConfigError
from gpubench.parts import targets
from gpubench.run.runner import measure_run

HERE = "test_targets"  # this module, importable by dotted path (tests/ is on sys.path)


class Images(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.zeros(3, 16, 16, dtype=torch.uint8), i % 10


def scale(x):
    """A team transform: a plain function of the team's own code."""
    return x.float() / 255


CUSTOM_DS = ("dataset=custom", f"dataset._target_={HERE}.Images")


def library_calls(marker: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    """Third-party functions that act on their arguments the moment Hydra calls them (the
    probe's `_exec_cmd` runs a command; numpy.save and torch.save write a file): (overrides,
    the key the refusal names)."""
    run = f"[touch, '{marker}']"
    return {
        "transform": ((*CUSTOM_DS, "+dataset.transform._target_=mlflow.utils.process._exec_cmd",
                       f"+dataset.transform.cmd={run}"), "dataset.transform._target_"),
        "collate": ((*CUSTOM_DS, "+dataset.collate._target_=numpy.save",
                     f"+dataset.collate.file='{marker}'", "+dataset.collate.arr=[1]"),
                    "dataset.collate._target_"),
        "nested": ((*CUSTOM_DS, "+dataset.transform._target_=torchvision.transforms.Compose",
                    f"+dataset.transform.transforms=[{{_target_: torch.save, obj: 1, "
                    f"f: '{marker}'}}]"), "dataset.transform.transforms[0]._target_"),
        # a team module's `from mlflow... import _exec_cmd`: judged where it is defined
        "reexport": ((*CUSTOM_DS, f"+dataset.transform._target_={HERE}._exec_cmd",
                      f"+dataset.transform.cmd={run}"), "dataset.transform._target_"),
    }


@pytest.mark.parametrize("case", ["transform", "collate", "nested", "reexport"])
def test_a_library_function_is_refused_before_it_is_called(compose_cfg, tmp_path, case):
    marker = tmp_path / "MARKER"
    overrides, key = library_calls(marker)[case]
    try:
        measure_run(compose_cfg(*overrides), tmp_path / "run")
        msg = "no error"
    except Exception as e:  # the marker is looked at first, whatever was raised
        msg = str(e)
    assert not marker.exists(), f"{case}: it ran before the check"
    assert msg.startswith(f"{key}=") and "\n" not in msg, msg
    assert "an installed library: call it from a function of your own code" in msg
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize("target", [
    "torchvision.transforms.v2.Compose", "torchvision.transforms.v2.functional.resize",
    "torchvision.transforms.ToTensor", "torch.utils.data.default_collate", "torch.nn.Identity",
    f"{HERE}.scale", f"{HERE}.Images"])
def test_what_the_rule_admits(target):
    targets.callable_node({"_target_": target}, "dataset.transform")


@pytest.mark.parametrize("target, says", [
    ("gpubench.tracking.sync.sync", "an installed library"),  # gpubench is never team code
    ("hydra_plugins.gpubench_sweeper.config.GpubenchSweeperConf", "an installed library"),
    ("torch.hub.load", "an installed library"),
    ("torch.nn.functional.relu", "an installed library"),
    (f"{HERE}.CUSTOM_DS", "it is tuple"),
    ("subprocess.run", "subprocess is in the standard library"),
    # a misspelt name: Python's "No module named 'x.y.Nope'; 'x.y' is not a package" blamed
    # the module that holds the code
    (f"{HERE}.Nope", f"module {HERE} has no Nope"),
    ("gpubench.parts.nope.collate", "package gpubench.parts has no nope, as a name or a submodule"),
])
def test_what_the_rule_refuses(target, says):
    with pytest.raises(ConfigError) as e:
        targets.callable_node({"_target_": target}, "dataset.collate")
    assert says in str(e.value) and str(e.value).startswith("dataset.collate._target_=")


@pytest.mark.parametrize("folder, team", [("site-packages", False), ("dist-packages", False),
                                          ("repo", True)])
def test_team_code_is_decided_by_where_the_module_lives(tmp_path, monkeypatch, folder, team):
    """The same function is the team's in a repository on the path, an installed library's in
    any site-packages or dist-packages (another environment's on PYTHONPATH too)."""
    name = f"lib_{folder.replace('-', '_')}"
    (tmp_path / folder).mkdir()
    (tmp_path / folder / f"{name}.py").write_text("def fn(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path / folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    node = {"_target_": f"{name}.fn", "_partial_": True}
    if team:
        targets.callable_node(node, "dataset.transform")
    else:
        with pytest.raises(ConfigError, match="an installed library"):
            targets.callable_node(node, "dataset.transform")
