"""Where imports sit: at the top of their module, where a reader sees what the module needs, except
those of heavy or optional libraries, imported inside the function that uses them. Read from the source with ast;
the few light imports kept inside a function on purpose are listed below, each with its reason."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from .helpers import ROOT

SRC = ROOT / "src" / "grpo_launch"

# Seconds of start-up, or a library not every installation has: imported where it is used.
HEAVY = frozenset({
    "torch", "trl", "transformers", "vllm", "ray", "sky", "matplotlib", "wandb", "deepspeed", "prometheus_client",
    "accelerate", "datasets", "peft", "safetensors", "huggingface_hub", "pynvml", "requests", "numpy",
})  # fmt: skip

# (file under src/grpo_launch, module): a light import kept inside a function, and why. A module of grpo_launch that
# imports a heavy library at its top counts as heavy itself (backends/ray/tasks.py, train/async_auth.py).
ALLOWED = frozenset(
    {
        # Start-up of `grpo-launch plan` (scripts/bench_plan.py; tests/test_cli.py): loaded by the plans that use it.
        ("cli/tables.py", "rich"),  # ~30 ms: a table goes through rich only on a terminal
        ("cli/explain.py", "grpo_launch.execute.watchdog"),  # ~50 ms (the supervisor): plan --explain's stop line only
        ("cli/plan.py", "grpo_launch.planning.measured_scales"),  # --calibrate-from, or a stored calibration, only
        ("cli/plan.py", "grpo_launch.analysis.view"),  # --calibrate-from only
        ("cli/common.py", "grpo_launch.planning.measured_scales"),  # a stored calibration only
        ("cli/common.py", "grpo_launch.probe.local"),  # this machine is probed only when it has no --gpus or runs
        ("cli/common.py", "grpo_launch.rundir.invocation"),  # a run's record (and tempfile): not plan's
        ("backends/local.py", "grpo_launch.probe.local"),  # the ports are checked only before a start
        ("backends/base.py", "socket"),  # only a run on other hosts resolves their names
        ("probe/calibration_store.py", "hashlib"),  # with no calibration stored, plan hashes nothing (test_cli)
        ("probe/calibration_store.py", "importlib.metadata"),  # nor reads library versions (email, zipfile; test_cli)
        ("backends/__init__.py", "importlib.metadata"),  # nor other packages' backends, unless they may be asked for
        ("probe/dataset.py", "http.client"),  # ~25 ms: only a dataset's size asked of the Hub
        ("probe/pythons.py", "subprocess"),  # plan reads only this interpreter's vLLM, not another Python's
        ("probe/pythons.py", "shutil"),  # the same: a console script's interpreter is looked up before a run only
        ("errors.py", "difflib"),  # every command imports errors; only a misspelt name needs a suggestion
        # Start-up of the other commands that run often.
        ("probe/hosts.py", "concurrent.futures"),  # ~10 ms (logging): every backend choice imports slurm's allocation
        ("cli/status.py", "grpo_launch.cli.watch"),  # rich's live display: --watch only
        ("cli/status.py", "grpo_launch.rundir.same_run"),  # zipfile: only a stopped run's resume hint
        ("cli/status.py", "grpo_launch.rundir.invocation"),  # tempfile: the same
        # Optional: not installed with grpo-launch.
        ("probe/local.py", "amdsmi"),  # ROCm's library, on AMD machines
        ("backends/ray/submit.py", "click"),  # Ray's CLI (the ray extra)
        ("train/rewards.py", "math_verify"),  # the train extra
        ("train/rewards.py", "open_r1"),  # open-r1's own reward functions, where it is installed
    }
)


def _module_name(rel: str) -> str:
    parts = ["grpo_launch", *Path(rel).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, ours: set[str]) -> list[str]:
    """The modules a statement imports: ``from package import name`` is ``package.name`` where that is one of
    grpo_launch's modules (``ours``) or not grpo_launch's (a name or a submodule: either matches an allowed
    ``package.name``), else ``package``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert node.module and not node.level, "relative imports are not used"
    subs = [f"{node.module}.{a.name}" for a in node.names]
    if node.module.split(".")[0] != "grpo_launch":
        return subs
    return [sub if sub in ours else node.module for sub in subs]


def _on_import(tree: ast.Module, ours: set[str]) -> set[str]:
    """The modules a module imports when it is imported (``if TYPE_CHECKING:`` left out), their packages included."""
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for module in _imported(node, ours):
                parts = module.split(".")
                found.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            body += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            body += [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
    return found


def _heavy(trees: dict[str, ast.Module]) -> set[str]:
    """grpo_launch's modules that import a heavy library when they are imported, directly or through another."""
    edges = {name: _on_import(tree, set(trees)) for name, tree in trees.items()}
    heavy = {name for name, found in edges.items() if {m.split(".")[0] for m in found} & HEAVY}
    while more := {name for name, found in edges.items() if name not in heavy and found & heavy}:
        heavy |= more
    return heavy


def _function_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: dict[int, ast.Import | ast.ImportFrom] = {}  # by id: a nested function's imports are walked twice
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.update((id(n), n) for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return sorted(found.values(), key=lambda n: n.lineno)


def _allowed(rel: str, module: str) -> set[tuple[str, str]]:
    return {(f, m) for f, m in ALLOWED if rel == f and (module == m or module.startswith(m + "."))}


def misplaced(sources: dict[str, str]) -> tuple[list[str], set[tuple[str, str]]]:
    """``sources``: path under src/grpo_launch → text. The light imports inside functions that are not allowed
    (``file:line: statement``), and the allowed pairs met."""
    trees = {rel: ast.parse(text) for rel, text in sources.items()}
    heavy = _heavy({_module_name(rel): tree for rel, tree in trees.items()})
    ours = set(map(_module_name, trees))
    found, used = [], set()
    for rel, tree in sorted(trees.items()):
        for node in _function_imports(tree):
            for module in _imported(node, ours):
                if module.split(".")[0] in HEAVY or module in heavy:
                    continue
                if allowed := _allowed(rel, module):
                    used |= allowed
                else:
                    found.append(f"src/grpo_launch/{rel}:{node.lineno}: {ast.unparse(node)}")
    return list(dict.fromkeys(found)), used


@functools.cache
def _in_the_source() -> tuple[list[str], set[tuple[str, str]]]:
    return misplaced({str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.py"))})


def test_light_imports_sit_at_the_top_of_their_module():
    found, _ = _in_the_source()
    assert not found, (
        "light modules imported inside a function (move each to the top of its module; ALLOWED in "
        "tests/test_import_places.py says when not):\n" + "\n".join(found)
    )


def test_every_allowed_import_is_still_there():
    """An entry whose import has moved to the top (or gone) is deleted, so the list stays the list of reasons."""
    _, used = _in_the_source()
    assert not ALLOWED - used, f"allowed but no longer imported inside a function: {sorted(ALLOWED - used)}"


def test_the_check_sees_a_misplaced_import():
    sources = {
        "planning/x.py": "import json\n\ndef f():\n    import os\n    from grpo_launch.spec import frozen\n"
        "    import torch\n    return os, frozen, torch, json\n",
        "planning/y.py": "import ray\n",  # heavy at its top: importing it in a function is right
        "planning/z.py": "def g():\n    from grpo_launch.planning import y\n    import rich.table\n    return y\n",
        "cli/tables.py": "def h():\n    from rich.console import Console\n    return Console\n",  # allowed
    }
    found, used = misplaced(sources)
    assert found == [
        "src/grpo_launch/planning/x.py:4: import os",
        "src/grpo_launch/planning/x.py:5: from grpo_launch.spec import frozen",
        "src/grpo_launch/planning/z.py:3: import rich.table",
    ], found
    assert used == {("cli/tables.py", "rich")}
