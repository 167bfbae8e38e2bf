"""Fixes that really fix: every in-recipe fix a refusal offers is applied to the recipe and planned again before
it is shown; one that does not plan is dropped, and when no single change plans, pairs of them are tried. Pure."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from typing import Any

from grpo_launch.errors import ConfigError, Fix, PlanError
from grpo_launch.machines.gpus import find_gpu_spec
from grpo_launch.machines.topology import Topology
from grpo_launch.recipe import Recipe
from grpo_launch.recipe.launch import LAUNCH_FIELDS, convert_launch
from grpo_launch.recipe.values import check_value

MAX_PAIRS = 30  # pairs tried when no single fix plans (each is one plan, about a millisecond)


def with_assignments(recipe: Recipe, assignments: tuple[tuple[str, Any], ...]) -> Recipe | None:
    """The recipe with ``key=value`` changes applied, or None when a value is not one the recipe accepts."""
    values, launch = dict(recipe.values), {}
    for key, value in assignments:
        if key.startswith("launch."):
            name = key.removeprefix("launch.")
            if name not in LAUNCH_FIELDS:
                return None
            problem, converted = convert_launch(name, value)
            if problem:
                return None
            launch[name] = converted
        elif check_value(key, value) is None:
            values[key] = value
        else:
            return None
    try:
        return dataclasses.replace(recipe, values=values, launch=dataclasses.replace(recipe.launch, **launch))
    except (TypeError, ValueError, ConfigError):
        return None


def verified(error: PlanError, recipe: Recipe, plan: Callable[[Recipe], object]) -> PlanError:
    """``error`` with only the fixes that plan (changes outside the recipe, such as more GPUs, are kept: they
    cannot be planned from here), or a pair of fixes when no single one does."""
    outside = [f for f in error.fixes if not f.in_recipe]
    inside = [f for f in error.fixes if f.in_recipe]
    if not inside:
        return error

    def attempt(assignments: tuple[tuple[str, Any], ...]) -> str | None:
        """None when the changed recipe plans; else what it fails with (message and problems)."""
        changed = with_assignments(recipe, assignments)
        if changed is None:
            return _failure(error)
        try:
            plan(changed)
        except PlanError as exc:
            return _failure(exc)
        return None

    def plans(assignments: tuple[tuple[str, Any], ...]) -> bool:
        return attempt(assignments) is None

    outcomes = [attempt(f.assignments()) for f in inside]
    good = [f for f, failed in zip(inside, outcomes, strict=True) if failed is None]
    if not good:
        for a, b in itertools.islice(itertools.combinations(inside, 2), MAX_PAIRS):
            if a.setting != b.setting and plans((*a.assignments(), *b.assignments())):
                both = Fix(
                    a.setting,
                    a.choices[0],
                    f"{a.reason}, and {b.reason}",
                    rank=max(a.rank, b.rank),
                    also=(*a.also, *b.assignments()),
                )
                good.append(both)
                break
    if not good:  # none plans on its own: the ones that get past this problem, saying what comes next
        good = [
            dataclasses.replace(f, reason=f"{f.reason}; then: {_first_line(failed)}")
            for f, failed in zip(inside, outcomes, strict=True)
            if failed is not None and not _same_problem(failed, error)
        ]
    dropped = [
        f"tried {', '.join(f.overrides())}: {_first_line(failed)}"
        for f, failed in zip(inside, outcomes, strict=True)
        if failed is not None
    ]
    hint = (error.hint or "").replace("Each fix listed would fit by the estimate (grpo-launch plan --explain).", "")
    if not good:
        hint += " No change to the recipe alone plans here (each one offered was planned again)."
        if not outside:
            outside = [Fix("gpus", None, "more GPUs, or GPUs with more memory", rank=3, in_recipe=False)]
    elif all("; then: " not in f.reason for f in good):
        hint += " Each change listed was planned again and fits."
    return PlanError(
        error.message,
        problems=error.problems,
        hint=hint.strip() or None,
        fixes=[*good, *outside],
        explain=(*error.explain, *dropped),
    )


def _failure(exc: PlanError) -> str:
    """What a plan fails with, as one line: the message and its problems."""
    return " ".join([exc.message.rstrip(":"), *exc.problems])


MAX_GPU_TRIES = 12  # GPU counts tried for a "more GPUs" fix (one plan each)


def _larger(topology: Topology) -> list[tuple[str, Topology]]:
    """Larger topologies of the same GPU, smallest first, each with its --gpus spec: one host grows to 8 GPUs, then
    whole hosts are added."""
    first = topology.hosts[0]
    if not first.gpus or len(set(topology.gpus_per_host)) != 1:
        return []
    gpu, per, hosts = first.gpus[0], len(first.gpus), len(topology.hosts)
    shapes = [(1, n) for n in range(per + 1, 9)] if hosts == 1 and per < 8 else []
    shapes += [(h, max(per, 8) if hosts == 1 else per) for h in range(2 if hosts == 1 else hosts + 1, 65)]
    name = gpu.name if find_gpu_spec(gpu.name) else f"{gpu.name}-{(gpu.memory_bytes or 0) / 1e9:.0f}GB"
    out = []
    for h, n in shapes[:MAX_GPU_TRIES]:
        gpus = tuple(dataclasses.replace(gpu, visible_id=str(i), uuid=None) for i in range(n))
        made = tuple(
            dataclasses.replace(first, name=f"{first.name}-{i}" if i else first.name, gpus=gpus) for i in range(h)
        )
        out.append((f"{h}x{n}x{name}" if h > 1 else f"{n}x{name}", dataclasses.replace(topology, hosts=made)))
    return out


def with_gpu_count(error: PlanError, topology: Topology, plan: Callable[[Topology], object]) -> PlanError:
    """``error`` whose "more GPUs" fix says how many: the first larger topology of the same GPU that plans."""
    more = [
        f
        for f in error.fixes
        if f.setting == "gpus"
        and not f.in_recipe
        and f.reason.startswith("more ")
        and not re.search(r"\d+ (training )?GPUs|at least \d+", f.reason)  # a count of its own already
    ]
    if not more or topology.is_cpu:
        return error
    found = None
    for spec, larger in _larger(topology):
        try:
            plan(larger)
        except PlanError:
            continue
        found = spec
        break
    if found is None:
        return error
    gpus = found.rsplit("x", 1)[0].replace("x", " × ")
    count = f"{gpus} GPUs is the first count that plans (grpo-launch plan RECIPE --gpus {found})"
    fixes = [dataclasses.replace(f, reason=f"{f.reason}: {count}") if f in more else f for f in error.fixes]
    return PlanError(error.message, problems=error.problems, hint=error.hint, fixes=fixes, explain=error.explain)


def _same_problem(failure: str, error: PlanError) -> bool:
    """Whether a fix's re-plan fails with the problem it was to fix (other numbers, same words): a fix that does
    not fix, such as max_completion_length=500 for 512 + 1024 tokens over a max length of 1000."""

    def words(text: str) -> str:
        return re.sub(r"\d[\d.,]*", "#", text.split(": ")[0])

    return words(failure) == words(error.message)


def _first_line(failure: str | None) -> str:
    line = failure or ""
    return line if len(line) <= 160 else line[:159] + "…"
