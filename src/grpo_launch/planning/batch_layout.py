"""The batch layout: sizes TRL 1.16's GRPOConfig accepts by construction (pure).

TRL's rules, with N trainer processes over all machines (vLLM server GPUs excluded):

* ``per_device_train_batch_size`` (p) counts completions;
* ``steps_per_generation`` (s) defaults to ``gradient_accumulation_steps`` (g);
* ``generation_batch_size`` = p × N × s, and it must be divisible by ``num_generations`` (k ≥ 2);
  setting both ``generation_batch_size`` and ``steps_per_generation`` is an error;
* with evaluation on: (``per_device_eval_batch_size`` × N) divisible by ``num_generations_eval`` or k.

Values the user set are kept. Unset ones are chosen: p near TRL's default, then the least accumulation that makes
the generation batch hold whole prompt groups. When the user's values admit no layout, :func:`solve_layout` raises
one :class:`PlanError` listing every problem and the nearest valid alternatives, ranked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_launch.errors import Fix, PlanError
from grpo_launch.planning.layout_fixes import (
    divisor_near,
    generation_batch_fixes,
    nearest,
    on_policy_fixes,
    rhythm_fixes,
)
from grpo_launch.planning.parallel_and_batch import Layout, group_size
from grpo_launch.recipe.trl_schema import DEFAULTS
from grpo_launch.spec import frozen

# TRL's defaults for the layout keys (generated from TRL's GRPOConfig); the group size's is sizes.group_size's.
TRL_DEFAULTS: dict[str, int] = {
    k: int(DEFAULTS[k])
    for k in (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "per_device_eval_batch_size",
    )
}


class LayoutError(PlanError):
    """The recipe's batch values admit no layout TRL accepts for this many training processes."""


@frozen
class LayoutRequest:
    """What the recipe says about the layout; None means "choose"."""

    per_device: int | None = None
    grad_accum: int | None = None
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None
    num_generations: int | None = None
    eval_on: bool = False
    per_device_eval: int | None = None
    num_generations_eval: int | None = None

    @property
    def group(self) -> int:
        """The group size: num_generations, else TRL's default."""
        return group_size(self.num_generations)

    @property
    def own_batch_key(self) -> str | None:
        """The key by which the recipe sets its own batch (its accumulation or generation rhythm), if any."""
        for key, value in (
            ("generation_batch_size", self.generation_batch_size),
            ("steps_per_generation", self.steps_per_generation),
            ("gradient_accumulation_steps", self.grad_accum),
        ):
            if value is not None:
                return key
        return None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> LayoutRequest:
        def get(key: str) -> Any:
            v = values.get(key)
            return None if v == "auto" else v

        eval_strategy = values.get("eval_strategy", "no")
        return cls(
            per_device=get("per_device_train_batch_size"),
            grad_accum=get("gradient_accumulation_steps"),
            steps_per_generation=get("steps_per_generation"),
            generation_batch_size=get("generation_batch_size"),
            num_generations=get("num_generations"),
            eval_on=bool(values.get("do_eval")) and eval_strategy not in (None, "no"),
            per_device_eval=get("per_device_eval_batch_size"),
            num_generations_eval=get("num_generations_eval"),
        )


def _per_device_filling_groups(n: int, steps: int, k: int, why: list[str]) -> int:
    """TRL's default per-device batch when ``n`` processes × ``steps`` fill whole groups of ``k`` with it, else the
    nearest that does (said in ``why``), else TRL's default (the layout then names the problem)."""
    default = TRL_DEFAULTS["per_device_train_batch_size"]
    p = nearest(default, lambda v: (v * n * steps) % k == 0)
    if p is None:
        return default
    if p != default:
        why.append(f"per_device_train_batch_size={p}: {p}×{n} processes×{steps} is a multiple of {k}")
    return p


@dataclass(eq=False, repr=False)  # a working record: no generated comparison or repr
class _Notes:
    """What solving a layout says: why each value was chosen, the problems that refuse it, and their fixes."""

    why: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)

    def problem(self, text: str, fixes: list[Fix]) -> None:
        self.problems.append(text)
        self.fixes += fixes


def solve_layout(
    n: int, req: LayoutRequest, *, completions: int | None = None, colocate_n: int | None = None
) -> tuple[Layout, list[str]]:
    """Choose a valid layout for ``n`` trainer processes; returns it and the reasons for each choice.

    On policy: ``steps_per_generation`` equals ``gradient_accumulation_steps`` (one fresh generation per optimizer
    step) unless the recipe sets ``steps_per_generation`` or ``generation_batch_size`` itself. ``completions`` (a
    pinned or default batch's prompts per step × num_generations) is the number every optimizer step must process
    exactly: the accumulation (and a per-device batch the recipe leaves unset) is chosen to meet it. Without it,
    the recipe's own values at ``n`` processes decide, with the least accumulation that fills whole prompt groups.
    ``colocate_n`` (the process count with colocated vLLM) is only used to suggest an alternative split.
    """
    if n < 1:
        raise PlanError("no GPU is left for training", hint="Use more GPUs, or launch.vllm=colocate.")
    if req.generation_batch_size is not None and req.steps_per_generation is not None:
        raise PlanError(
            "generation_batch_size and steps_per_generation are both set; TRL accepts only one of them",
            hint="Remove one: generation_batch_size = per_device_train_batch_size × processes × steps_per_generation.",
        )
    notes = _Notes()
    k = req.group
    if req.generation_batch_size is not None:
        p, g, s = _given_generation_batch(n, req, colocate_n, notes)
    elif completions is not None:
        p, g, s = _to_target(n, req, completions, notes)
    elif req.steps_per_generation is not None:
        p, g, s = _given_rhythm(n, req, colocate_n, notes)
    else:
        p, g, s = _own_batch(n, req, colocate_n, notes)
    gbs = req.generation_batch_size
    if s is not None and gbs is None and p is not None:
        gbs = p * n * s
    pe = _eval_batch(n, req, notes) if req.eval_on else None
    if notes.problems:
        raise LayoutError(
            f"no valid batch layout for {n} training process{'es' if n > 1 else ''}:",
            problems=notes.problems,
            fixes=notes.fixes,
        )
    assert p is not None and s is not None and gbs is not None
    layout = Layout(
        num_processes=n,
        per_device_train_batch_size=p,
        gradient_accumulation_steps=g,
        steps_per_generation=s,
        generation_batch_size=gbs,
        num_generations=k,
        per_device_eval_batch_size=pe,
        num_generations_eval=req.num_generations_eval,
        generation_batch_size_given=req.generation_batch_size is not None,
        recipe_batch_key=req.own_batch_key if completions is None else None,
    )
    return layout, notes.why


_Sizes = tuple[int | None, int, int | None]  # per-device batch, accumulation, steps per generation


def _given_generation_batch(n: int, req: LayoutRequest, colocate_n: int | None, notes: _Notes) -> _Sizes:
    """The recipe sets generation_batch_size: the per-device batch and the rhythm follow from it."""
    gbs, k = req.generation_batch_size, req.group
    assert gbs is not None
    p, problem = _with_generation_batch(n, req, k)
    if problem:
        notes.problem(problem, generation_batch_fixes(n, gbs, req.per_device, req.num_generations, colocate_n))
    return p, req.grad_accum or TRL_DEFAULTS["gradient_accumulation_steps"], gbs // (p * n) if p else 1


def _given_rhythm(n: int, req: LayoutRequest, colocate_n: int | None, notes: _Notes) -> _Sizes:
    """The recipe's own generation rhythm (off policy when it differs from the accumulation)."""
    s, k = req.steps_per_generation, req.group
    assert s is not None
    g = req.grad_accum or TRL_DEFAULTS["gradient_accumulation_steps"]
    p = req.per_device if req.per_device is not None else _per_device_filling_groups(n, s, k, notes.why)
    if (p * n * s) % k:
        notes.problem(
            f"generation batch {p}×{n} processes×{s} steps_per_generation = {p * n * s} is not divisible by "
            f"num_generations={k}",
            rhythm_fixes(n, p, s, g, k, req.per_device is not None, colocate_n),
        )
    return p, g, s


def _to_target(n: int, req: LayoutRequest, completions: int, notes: _Notes) -> _Sizes:
    """Exactly ``completions`` per optimizer step (the pinned or default batch), on policy unless the recipe sets
    its own generation rhythm (``steps_per_generation``, kept)."""
    k = req.group
    p, g, target_problem = _meet(n, completions, req)
    if target_problem:
        notes.problem(target_problem, _target_fixes(n, completions, req))
        return p, g, None
    s = req.steps_per_generation or g
    if (p * n * s) % k:
        notes.problem(
            f"generation batch {p}×{n} processes×{s} steps_per_generation = {p * n * s} is not divisible by "
            f"num_generations={k}",
            [Fix("steps_per_generation", g, "one generation per optimizer step", rank=1)],
        )
    if req.grad_accum is not None and g != req.grad_accum:
        notes.why.append(
            f"gradient_accumulation_steps={g} (the recipe says {req.grad_accum}): {p} per device × {n} "
            f"processes × {g} = {completions} completions, the {completions // k} prompts per step every "
            "split is planned for"
        )
    elif req.grad_accum is None and g != TRL_DEFAULTS["gradient_accumulation_steps"]:
        notes.why.append(
            f"gradient_accumulation_steps={g}: {p} per device × {n} processes × {g} = {completions} "
            f"completions = {completions // k} prompts × {k}"
        )
    if req.per_device is None and p != TRL_DEFAULTS["per_device_train_batch_size"]:
        notes.why.append(f"per_device_train_batch_size={p}: {completions} completions over {n} processes")
    return p, g, s


def _target_fixes(n: int, completions: int, req: LayoutRequest) -> list[Fix]:
    """A pinned batch ``n`` trainers cannot take evenly: the nearest batches they can (never applied without the
    user: the batch is the algorithm), then a per-device batch that divides each trainer's share."""
    k, p = req.group, req.per_device or 1
    unit = n * p // math.gcd(n * p, k)  # the least prompts per step n trainers take in whole groups
    prompts = completions // k
    near = sorted({max(unit, unit * (prompts // unit)), unit * -(-prompts // unit)})
    said = f"{n} trainer{'s take' if n > 1 else ' takes'} it evenly (a different batch)"
    fixes = [Fix("launch.prompts_per_step", v, said, rank=1, cost=abs(math.log(v / prompts))) for v in near]
    if req.per_device is not None and completions % n == 0:
        d = nearest(req.per_device, lambda v: (completions // n) % v == 0, hi=completions // n)
        if d is not None and d != req.per_device:
            fixes.append(
                Fix(
                    "per_device_train_batch_size",
                    d,
                    f"{completions // n} completions per trainer",
                    rank=1,
                    cost=abs(math.log(d / req.per_device)),
                )
            )
    return fixes


def _own_batch(n: int, req: LayoutRequest, colocate_n: int | None, notes: _Notes) -> _Sizes:
    """The recipe's own values at ``n`` processes, with the least accumulation that fills whole prompt groups."""
    k = req.group
    g = req.grad_accum or TRL_DEFAULTS["gradient_accumulation_steps"]
    p = req.per_device if req.per_device is not None else _per_device_filling_groups(n, g, k, notes.why)
    unit = k // math.gcd(p * n * g, k)
    if unit == 1:
        return p, g, g
    if req.grad_accum is None:
        notes.why.append(
            f"gradient_accumulation_steps={unit}: {p}×{n} processes is not a multiple of num_generations={k}; "
            f"accumulating {unit} steps gives {p * n * unit} completions = {p * n * unit // k} prompts × {k}"
        )
        return p, unit, unit
    notes.problem(
        f"global batch {p}×{n} processes×{g} gradient_accumulation_steps = {p * n * g} is not divisible "
        f"by num_generations={k}, and a generation that served more than one optimizer step would train "
        "off policy",
        on_policy_fixes(n, p, g, k, colocate_n),
    )
    return p, g, g


def _eval_batch(n: int, req: LayoutRequest, notes: _Notes) -> int:
    """per_device_eval_batch_size with evaluation on: (it × n) must fill whole groups of num_generations_eval."""
    ke = req.num_generations_eval or req.group
    unit_e = ke // math.gcd(n, ke)
    if req.per_device_eval is None:
        pe = nearest(TRL_DEFAULTS["per_device_eval_batch_size"], lambda v: v % unit_e == 0) or unit_e
        if pe != TRL_DEFAULTS["per_device_eval_batch_size"]:
            notes.why.append(f"per_device_eval_batch_size={pe}: {pe}×{n} processes is a multiple of {ke}")
        return pe
    pe = req.per_device_eval
    if (pe * n) % ke:
        up = nearest(pe, lambda v: v % unit_e == 0) or unit_e
        fixes = [Fix("per_device_eval_batch_size", up, rank=1, cost=abs(math.log(up / pe)))]
        d = divisor_near(pe * n, ke)
        if d is not None:
            fixes.append(Fix("num_generations_eval", d, rank=2, cost=1.0 + abs(math.log(d / ke))))
        notes.problem(
            f"global eval batch {pe}×{n} processes = {pe * n} is not divisible by the "
            f"{'num_generations_eval' if req.num_generations_eval else 'num_generations'} ({ke})",
            fixes,
        )
    return pe


def _meet(n: int, completions: int, req: LayoutRequest) -> tuple[int, int, str | None]:
    """(per-device batch, accumulation, problem) for ``n`` processes to take exactly ``completions`` per step: the
    recipe's per-device batch when it sets one, else the divisor of the per-process share nearest TRL's default."""
    k = req.group
    share, rest = divmod(completions, n)
    if rest:
        return 1, 1, f"{completions} completions ({completions // k} prompts × {k}) do not split over {n} processes"
    p = req.per_device
    if p is None and req.grad_accum is not None and share % req.grad_accum == 0:
        return share // req.grad_accum, req.grad_accum, None
    if p is None:
        p = nearest(TRL_DEFAULTS["per_device_train_batch_size"], lambda v: share % v == 0, hi=share)
    if p is None or share % p:
        return (
            p or 1,
            1,
            (
                f"{completions} completions over {n} processes are {share} each, not a whole number of "
                f"per_device_train_batch_size={p}"
            ),
        )
    return p, share // p, None


def _with_generation_batch(n: int, req: LayoutRequest, k: int) -> tuple[int | None, str | None]:
    gbs = req.generation_batch_size
    assert gbs is not None
    p = req.per_device
    if p is None:
        p = nearest(TRL_DEFAULTS["per_device_train_batch_size"], lambda v: gbs % (v * n) == 0)
        if p is None:
            return None, f"generation_batch_size={gbs} is not divisible by the {n} training processes"
    elif gbs % (p * n):
        return p, f"generation_batch_size={gbs} is not divisible by the global batch {p}×{n} = {p * n}"
    if gbs % k:
        return p, f"generation_batch_size={gbs} is not divisible by num_generations={k}"
    return p, None
