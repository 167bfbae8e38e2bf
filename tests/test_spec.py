"""``spec.frozen``: the value types behave as ``@dataclass(frozen=True)`` would, though only ``__init__`` is generated
for each (the refusal to assign and to delete is one shared function each, public API only: plan's start-up,
scripts/bench_plan.py)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import ClassVar

import pytest

from grpo_launch.enums import Role
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.spec import ProcessSpec, frozen


def _spec() -> ProcessSpec:
    return ProcessSpec("train", ("python", "-V"), {"A": "1"}, host="h1", role=Role.TRAIN, gpus=("0", "1"))


@pytest.mark.parametrize("name", ["name", "argv", "host", "gpus", "not_a_field"])
def test_no_assignment_after_init(name):
    spec = _spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(spec, name, None)
    assert spec == _spec()


def test_init_sets_each_field_once_and_never_again():
    """The shared refusal lets dataclasses' own __init__ set a field that is not set yet, and nothing else: calling
    __init__ again on a value is refused, as a frozen dataclass refuses it, and a subclass's fields are fields too."""
    spec = _spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.__init__("other", ("true",))  # type: ignore[misc]
    assert spec == _spec()

    @frozen
    class Wider(Parallelism):
        """A value type derived from another."""

        note: str = ""

    wide = Wider(tp=2, pp=1, dp=4, note="x")
    assert (wide.tp, wide.note) == (2, "x") and wide != Parallelism(tp=2, pp=1, dp=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wide.note = "y"  # type: ignore[misc]


def test_a_classvar_is_not_a_field_an_instance_may_set():
    """dataclasses lists a ClassVar in __dataclass_fields__ too: it may not be set on a value either (a frozen
    dataclass refuses it)."""

    @frozen
    class WithClassVar:
        """A value type with a class-level constant."""

        LIMIT: ClassVar[int] = 3
        n: int = 1

    value = WithClassVar()
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.LIMIT = 4  # type: ignore[misc]
    assert value.LIMIT == 3 and "LIMIT" not in vars(value)


@pytest.mark.parametrize("name", ["name", "host", "not_a_field"])
def test_no_deletion(name):
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(_spec(), name)


def test_values_compare_hash_copy_and_replace_as_frozen_dataclasses_do():
    spec = _spec()
    assert spec == _spec() and spec != dataclasses.replace(spec, host="h2")
    assert dataclasses.replace(spec, host="h2").host == "h2" and spec.host == "h1"
    for twin in (copy.copy(spec), copy.deepcopy(spec), pickle.loads(pickle.dumps(spec))):
        assert twin == spec and twin is not spec
        with pytest.raises(dataclasses.FrozenInstanceError):
            twin.host = "h3"  # type: ignore[misc]
    p = Parallelism(tp=2, pp=1, dp=4)
    assert hash(p) == hash(Parallelism(tp=2, pp=1, dp=4)) and {p: 1}[Parallelism(tp=2, pp=1, dp=4)] == 1
    assert repr(p).startswith("Parallelism(tp=2")


def test_every_value_type_on_plans_path_has_a_docstring():
    """dataclasses builds a missing docstring from inspect.signature, a cost paid by every start of ``plan``."""
    import subprocess
    import sys

    code = (
        "import dataclasses, sys\n"
        "import grpo_launch.cli.common, grpo_launch.cli.plan, grpo_launch.cli.tables\n"
        "for m in list(sys.modules.values()):\n"
        "    for v in vars(m).values() if getattr(m, '__name__', '').startswith('grpo_launch') else ():\n"
        "        if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == m.__name__:\n"
        "            if (v.__doc__ or '').startswith(v.__name__ + '('): print(m.__name__ + '.' + v.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "", f"value types without a docstring: {out.split()}"
