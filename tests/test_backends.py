"""The backend registry (:mod:`grpo_launch.backends`): every backend and submitter declares its options once, as a
frozen :class:`BackendOptions` dataclass, and the protocol is typed by that same class (mypy checks the methods
against it: the ``TYPE_CHECKING`` block of backends/__init__.py; this checks the class variable agrees)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from grpo_launch.backends import REGISTRY, SUBMIT_VERBS, load, load_submitter, select
from grpo_launch.backends.base import BackendOptions, BaseBackend
from grpo_launch.backends.submission import BaseSubmitter

CLASSES = [("backend", name, load) for name in REGISTRY] + [
    ("submitter", verb, load_submitter) for verb in SUBMIT_VERBS
]


def _typed_by(cls: type) -> type:
    """The options class ``cls`` is generic over: X in ``class C(BaseBackend[X])`` / ``BaseSubmitter[X]``."""
    (base,) = [b for b in getattr(cls, "__orig_bases__", ()) if typing.get_origin(b) in (BaseBackend, BaseSubmitter)]
    (options,) = typing.get_args(base)
    return options


@pytest.mark.parametrize(("kind", "name", "loader"), CLASSES, ids=[f"{k}:{n}" for k, n, _ in CLASSES])
def test_options_are_declared_once_and_type_the_protocol(kind, name, loader):
    cls = loader(name)
    assert issubclass(cls.Options, BackendOptions), f"{kind} {name}: Options must derive from BackendOptions"
    assert dataclasses.is_dataclass(cls.Options)
    for name in [f.name for f in dataclasses.fields(cls.Options)] + ["not_an_option"]:
        with pytest.raises(dataclasses.FrozenInstanceError):  # frozen: options are values
            setattr(cls.Options(), name, None)
    assert _typed_by(cls) is cls.Options, f"{kind} {name} is typed by {_typed_by(cls)}, declares {cls.Options}"


def test_select_passes_each_backend_its_own_options():
    """Without options or a batch system's environment the local backend runs; --hostfile picks ssh with them."""
    from grpo_launch.backends.ssh import SshOptions

    assert select({}, {}).name == "local"
    chosen = select({"ssh": SshOptions(hostfile="hosts")}, {})
    assert chosen.name == "ssh" and chosen.options == SshOptions(hostfile="hosts")


def test_every_backends_options_are_read_without_loading_the_backend():
    """The CLI declares every backend's flags on each command: it reads them from backends.options, which names the
    same class each backend says it takes, so ``plan --gpus`` loads no ssh, Ray or Slurm module (start-up)."""
    import subprocess
    import sys

    from grpo_launch.backends import REGISTRY, load, option_classes

    assert option_classes().keys() == REGISTRY.keys()
    for name, options in option_classes().items():
        assert load(name).Options is options, name
    code = (
        "import sys, io, contextlib\n"
        "from grpo_launch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['plan', 'recipes/qwen1.5b.yaml', '--gpus', '8xH100-80GB', '--no-write'], environ={})\n"
        "print(sorted(m for m in sys.modules if m.startswith('grpo_launch.backends.')))\n"
    )
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    loaded = eval(out.strip().splitlines()[-1])
    assert not [m for m in loaded if m.split(".")[2] in ("ssh", "ray", "slurm", "remote")], loaded


def test_no_code_outside_backends_branches_on_a_backend_s_name():
    """The planner and the checks read what a topology's backend says of it (named_by_user, naming_gpus,
    trainers_share_this_cache, planned_again_at_start), never its source's name: a backend from another package
    must get the same plan as a built-in one with the same properties."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "grpo_launch"
    branch = re.compile(r"\.source\s*(==|!=|in\b|not in\b)|source\s*==\s*\"")
    found = [
        f"{path.relative_to(src)}:{n}: {line.strip()}"
        for path in src.rglob("*.py")
        if "backends" not in path.relative_to(src).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "topology" in line and branch.search(line)
    ]
    assert found == []
