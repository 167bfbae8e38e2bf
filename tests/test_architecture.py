"""The structure the code keeps, read from the tree: each stage is a folder, a folder imports only the folders
below it (probe, planning and render know nothing of running, backends or the CLI), the import graph has no
cycle, modules stay small, and only errors, enums, spec and the package face sit at the root. Checked on the
source, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .helpers import ROOT

SRC = ROOT / "src" / "grpo_launch"

# Folders (and root modules) bottom to top: a module may import its own folder and lower ones only.
LAYERS: list[tuple[str, ...]] = [
    ("enums", "spec", "errors"),
    ("models",),
    ("machines", "recipe"),
    ("probe", "rundir"),
    ("analysis",),
    ("node",),
    ("planning", "train"),
    ("render",),
    ("backends",),
    ("execute",),
    ("cli",),
]
ROOT_MODULES = {"__init__", "__main__", "errors", "enums", "spec"}
# The training entry runs under accelerate on every rank: it reads the run directory's contract, the recipe and
# the model table, nothing of planning or running.
TRAIN_MAY_IMPORT = {"rundir", "recipe", "models", "machines", "errors", "enums", "spec", "train"}


def _stage(path: Path) -> str:
    """The folder (or root module) a source file belongs to."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _layer(stage: str) -> int:
    for i, names in enumerate(LAYERS):
        if stage in names:
            return i
    raise AssertionError(f"{stage!r} has no layer: add it to LAYERS")


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.name != "__main__.py" or p.parent != SRC)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import submodule` imports the submodule; `from module import name`, the module
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if _is_module(sub) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return {m for m in found if m == "grpo_launch" or m.startswith("grpo_launch.")}


def _target_stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (a name imported from a module counts as that module)."""
    names = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges = set()
        for m in _imports(path):
            while m not in names and "." in m:
                m = m.rsplit(".", 1)[0]
            if m in names and m != name:
                edges.add(m)
        graph[name] = edges
    return graph


def test_only_errors_enums_spec_and_the_face_at_the_root():
    loose = sorted(p.stem for p in SRC.glob("*.py") if p.stem not in ROOT_MODULES)
    assert not loose, f"modules at the package root: {loose}; each belongs in a stage folder"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_from_a_higher_folder(path):
    rel = path.relative_to(SRC)
    stage = _stage(path)
    if rel == Path("__init__.py"):
        assert not _imports(path), "the package's __init__ must stay import-free (version only)"
        return
    targets = {s for m in _imports(path) if (s := _target_stage(m)) and s != "__version__"} - {stage}
    if stage == "train":
        assert targets <= TRAIN_MAY_IMPORT, f"the training entry imports {sorted(targets - TRAIN_MAY_IMPORT)}"
        return
    higher = sorted(t for t in targets if t != "train" and _layer(t) > _layer(stage))
    assert not higher, f"{rel} ({stage}, layer {_layer(stage)}) imports higher folders: {higher}"
    if "train" in targets:
        assert rel == Path("execute/preflight.py"), f"{rel}: only preflight may use the training entry's reward names"


def test_after_run_sits_above_the_rest_of_planning():
    """planning/after_run/ re-plans what follows an attempt with make_plan: it may import any of planning/, and no
    other planning module may import it (execute/ does)."""
    after_run = SRC / "planning" / "after_run"
    below = [p for p in (SRC / "planning").rglob("*.py") if after_run not in p.parents]
    climbing = sorted(
        str(p.relative_to(SRC))
        for p in below
        if any(
            m == "grpo_launch.planning.after_run" or m.startswith("grpo_launch.planning.after_run.")
            for m in _imports(p)
        )
    )
    assert not climbing, f"planning modules that import planning/after_run/ (which sits above them): {climbing}"


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " → ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


# The longest import chain inside planning/, modules counted (the package's face included): planning → planner →
# modes → search → batch_advice → split_in_full → estimate → gpu_types → plan_types → cost.* → cost.constants.
PLANNING_LAYERS = 11


def test_planning_import_chains_stay_short():
    """planning/ is read from its face down: the chain a reader follows from make_plan to the cost constants may not
    grow. A new module that imports the planner's deepest ones adds a layer on top; a type imported from a decision
    module (rather than plan_types or cost/) is the usual way one grows."""
    graph = _graph()
    planning = {m for m in graph if m == "grpo_launch.planning" or m.startswith("grpo_launch.planning.")}
    chains: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in chains:
            below = [chain(m) for m in sorted(graph[module] & planning)]
            chains[module] = [module, *max(below, key=len, default=[])]
        return chains[module]

    longest = max((chain(m) for m in sorted(planning)), key=len)
    shown = " → ".join(m.removeprefix("grpo_launch.planning.") for m in longest)
    assert len(longest) <= PLANNING_LAYERS, f"planning/ has {len(longest)} layers: {shown}"
    assert len(longest) >= 3, shown  # the checker reads planning's imports


def test_checker_sees_a_violation(tmp_path):
    """The layering check reads function-level imports too (a violation must be visible to it)."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from grpo_launch.cli import main\n    return main\n")
    assert _imports(bad) == {"grpo_launch.cli"}


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string (and bytes) literals of a module's code, f-string parts included, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)) and id(n) not in docs:
            out.append((n.lineno, n.value.decode(errors="replace") if isinstance(n.value, bytes) else n.value))
    return out


def test_grpo_launch_variables_are_spelled_only_in_the_run_directory_contract():
    """Every GRPO_LAUNCH_* environment variable is named once, in rundir/layout.py (the contract between the
    launcher and what it starts); the code elsewhere (the SkyPilot task's sections included) takes the name from
    there. Docstrings may cite a name."""
    layout = SRC / "rundir" / "layout.py"
    spelled = [
        f"{path.relative_to(SRC)}:{line}: {text.strip()[:80]!r}"
        for path in _modules()
        if path != layout
        for line, text in _code_strings(path)
        if "GRPO_LAUNCH_" in text
    ]
    assert not spelled, "GRPO_LAUNCH_* spelled outside rundir/layout.py:\n" + "\n".join(spelled)
    assert any("GRPO_LAUNCH_" in text for _, text in _code_strings(layout)), "the checker reads the layout's names"


def _room(module: str) -> str:
    """The room a module stands in inside its stage folder: a subfolder is one room (``planning.cost``), a file at
    the folder's top its own (``planning.planner``)."""
    parts = module.split(".")
    return ".".join(parts[:3])


def test_no_two_rooms_of_a_folder_import_each_other():
    """Inside each stage folder, a subfolder counts as one room: no chain of imports between rooms comes back to
    where it started (a package that both imports and is imported by a module beside it reads as an arrow running
    back up; e.g. cost/ and planning/plan_types.py, or refusal/ importing make_plan inside a function)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        here = _room(module)
        rooms.setdefault(here, set())
        for target in targets:
            there = _room(target)
            if there != here and there.split(".")[:2] == here.split(".")[:2]:
                rooms[here].add(there)
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(rooms.get(node, ())):
            if state.get(nxt) == 1:
                found.append(" → ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(rooms):
        if node not in state:
            visit(node, [node])
    assert not found, "rooms that import each other:\n" + "\n".join(found)


def test_no_backend_is_named_outside_backends():
    """A backend is one module or package of backends/ (or another package's): no code outside backends/ names one,
    by its name, the name its submissions record or its submit verb, so the planner, the CLI and the run directory
    read a topology's properties and the registry (backends.SUBMIT_VERBS, job_backend), never a backend's name.
    ``local`` is left out: it is also a plain word (open-r1's local code provider). Docstrings may name one."""
    from grpo_launch.backends import REGISTRY, SUBMIT_VERBS

    names = {*REGISTRY, *SUBMIT_VERBS, *(e.recorded_as for e in SUBMIT_VERBS.values())} - {"local"}
    named = [
        f"{path.relative_to(SRC)}:{line}: {text!r}"
        for path in _modules()
        if path.relative_to(SRC).parts[0] != "backends"
        for line, text in _code_strings(path)
        if text.strip().lower() in names
    ]
    assert not named, "backend names outside backends/:\n" + "\n".join(named)
    assert {"slurm", "sbatch", "skypilot"} <= names  # the checker reads the registry's names
