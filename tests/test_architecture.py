"""The structure the code keeps: modules stay small, and no stage imports a later one (probe, planning and render
know nothing of running, backends or the CLI). Checked on the source, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import ROOT

SRC = ROOT / "src" / "grpo_launch"
MAX_LINES = 400

# Stages in pipeline order; a module may import its own stage and earlier ones only.
STAGES: list[tuple[str, ...]] = [
    ("__version__", "enums", "errors", "trl_schema", "task", "control", "rundir", "reaper", "faults", "checkpoints"),
    (
        "spec",
        "modelshape",
        "modelconfig",
        "catalog",
        "topology",
        "recipe_keys",
        "recipe_values",
        "recipe_yaml",
        "recipe",
    ),
    ("probe", "measured", "report"),
    ("planning",),
    ("commands", "render"),
    ("supervisor", "session", "watchdog", "backends"),
    ("preflight", "run"),
    ("cli",),
]
TRAIN_MAY_IMPORT = {
    *("control", "recipe", "recipe_keys", "trl_schema", "errors", "train", "enums", "catalog", "checkpoints"),
}


def _top(module: str) -> str:
    return module.split(".")[1] if module.startswith("grpo_launch.") else ""


def _stage(name: str) -> int:
    for i, names in enumerate(STAGES):
        if name in names:
            return i
    raise AssertionError(f"module {name!r} has no stage: add it to STAGES")


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.name != "__main__.py" or p.parent != SRC)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "grpo_launch")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return {m for m in found if m.startswith("grpo_launch.")}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_module_is_small(path):
    if path.name == "trl_schema.py":  # generated
        return
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines: split it along ARCHITECTURE"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_from_a_later_stage(path):
    rel = path.relative_to(SRC)
    name = rel.parts[0].removesuffix(".py")
    if name == "__init__":
        assert not _imports(path), "the package's __init__ must stay import-free (version only)"
        return
    targets = {_top(m) for m in _imports(path)} - {"", name}
    if name == "train":
        assert targets <= TRAIN_MAY_IMPORT, f"the training entry imports {sorted(targets - TRAIN_MAY_IMPORT)}"
        return
    later = sorted(t for t in targets if t != "train" and _stage(t) > _stage(name))
    assert not later, f"{rel} (stage {_stage(name)}) imports later stages: {later}"
    if "train" in targets:
        assert name == "preflight", f"{rel}: only preflight.py may use the training entry's helpers (reward names)"


def test_checker_sees_a_violation(tmp_path):
    """The layering check reads function-level imports too (a violation must be visible to it)."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from grpo_launch.cli import main\n    return main\n")
    assert _imports(bad) == {"grpo_launch.cli"}
