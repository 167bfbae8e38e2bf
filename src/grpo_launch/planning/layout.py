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
from typing import Any

from grpo_launch.errors import Fix, PlanError
from grpo_launch.planning.values import group_size
from grpo_launch.recipe.trl_schema import DEFAULTS
from grpo_launch.spec import frozen

# TRL's defaults for the layout keys (generated from TRL's GRPOConfig).
TRL_DEFAULTS: dict[str, int] = {
    k: int(DEFAULTS[k])
    for k in (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_generations",
        "per_device_eval_batch_size",
    )
}
MAX_AUTO = 256  # search bound for chosen sizes


class LayoutError(PlanError):
    """The recipe's batch values admit no layout TRL accepts for this many training processes."""


@frozen
class Layout:
    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    generation_batch_size: int
    num_generations: int
    per_device_eval_batch_size: int | None = None  # set when evaluation is on
    num_generations_eval: int | None = None
    generation_batch_size_given: bool = False  # the user set generation_batch_size (not steps_per_generation)

    @property
    def prompts_per_generation(self) -> int:
        return self.generation_batch_size // self.num_generations

    @property
    def completions_per_optimizer_step(self) -> int:
        return self.per_device_train_batch_size * self.num_processes * self.gradient_accumulation_steps

    def trl_values(self) -> dict[str, Any]:
        """The keys to write into the trainer's recipe. Exactly one of generation_batch_size/steps_per_generation."""
        out: dict[str, Any] = {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "num_generations": self.num_generations,
        }
        if self.generation_batch_size_given:
            out["generation_batch_size"] = self.generation_batch_size
        else:
            out["steps_per_generation"] = self.steps_per_generation
        if self.per_device_eval_batch_size is not None:
            out["per_device_eval_batch_size"] = self.per_device_eval_batch_size
        return out


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


def _nearest(target: int, ok: Any, lo: int = 1, hi: int = MAX_AUTO) -> int | None:
    """The value in [lo, hi] closest to ``target`` for which ``ok`` holds; ties go to the smaller one. ``target`` may
    lie outside [lo, hi] (a per-device share below TRL's default): the search reaches the far end either way."""
    for d in range(max(target - lo, hi - target) + 1):
        for v in (target - d, target + d):
            if lo <= v <= hi and ok(v):
                return v
    return None


def _per_device_filling_groups(n: int, steps: int, k: int, why: list[str]) -> int:
    """TRL's default per-device batch when ``n`` processes × ``steps`` fill whole groups of ``k`` with it, else the
    nearest that does (said in ``why``), else TRL's default (the layout then names the problem)."""
    default = TRL_DEFAULTS["per_device_train_batch_size"]
    p = _nearest(default, lambda v: (v * n * steps) % k == 0)
    if p is None:
        return default
    if p != default:
        why.append(f"per_device_train_batch_size={p}: {p}×{n} processes×{steps} is a multiple of {k}")
    return p


def solve_layout(
    n: int, req: LayoutRequest, *, completions: int | None = None, colocate_n: int | None = None
) -> tuple[Layout, list[str]]:
    """Choose a valid layout for ``n`` trainer processes; returns it and the reasons for each choice.

    On policy: ``steps_per_generation`` equals ``gradient_accumulation_steps`` (one fresh generation per optimizer
    step) unless the recipe sets ``steps_per_generation`` or ``generation_batch_size`` itself. ``completions`` (the
    split search's prompts per step × num_generations) is the number every optimizer step must process exactly:
    the accumulation (and a per-device batch the recipe leaves unset) is chosen to meet it. Without it, the recipe's
    own values at ``n`` processes decide, with the least accumulation that fills whole prompt groups.
    ``colocate_n`` (the process count with colocated vLLM) is only used to suggest an alternative split.
    """
    if n < 1:
        raise PlanError("no GPU is left for training", hint="Use more GPUs, or launch.vllm=colocate.")
    if req.generation_batch_size is not None and req.steps_per_generation is not None:
        raise PlanError(
            "generation_batch_size and steps_per_generation are both set; TRL accepts only one of them",
            hint="Remove one: generation_batch_size = per_device_train_batch_size × processes × steps_per_generation.",
        )
    why: list[str] = []
    problems: list[str] = []
    alternatives: list[Fix] = []

    k = req.group
    g = req.grad_accum or TRL_DEFAULTS["gradient_accumulation_steps"]
    p = req.per_device
    s = req.steps_per_generation
    gbs = req.generation_batch_size

    if gbs is not None:
        p, gbs_problem = _with_generation_batch(n, req, k)
        if gbs_problem:
            problems.append(gbs_problem)
            alternatives += _alternatives_gbs(n, req, k, colocate_n)
        s = gbs // (p * n) if p else 1
    elif s is not None:  # the recipe's own generation rhythm (off policy when it differs from the accumulation)
        if p is None:
            p = _per_device_filling_groups(n, s, k, why)
        if (p * n * s) % k:
            problems.append(
                f"generation batch {p}×{n} processes×{s} steps_per_generation = {p * n * s} is not divisible by "
                f"num_generations={k}"
            )
            alternatives += _alternatives_spg(n, p, s, k, req, colocate_n)
    elif completions is not None:
        p, g, target_problem = _meet(n, completions, req)
        if target_problem:
            problems.append(target_problem)
        else:
            s = g
            if req.grad_accum is not None and g != req.grad_accum:
                why.append(
                    f"gradient_accumulation_steps={g} (the recipe says {req.grad_accum}): {p} per device × {n} "
                    f"processes × {g} = {completions} completions, the {completions // k} prompts per step every "
                    "split is planned for"
                )
            elif req.grad_accum is None and g != TRL_DEFAULTS["gradient_accumulation_steps"]:
                why.append(
                    f"gradient_accumulation_steps={g}: {p} per device × {n} processes × {g} = {completions} "
                    f"completions = {completions // k} prompts × {k}"
                )
            if req.per_device is None and p != TRL_DEFAULTS["per_device_train_batch_size"]:
                why.append(f"per_device_train_batch_size={p}: {completions} completions over {n} processes")
    else:
        if p is None:
            p = _per_device_filling_groups(n, g, k, why)
        unit = k // math.gcd(p * n * g, k)
        if unit == 1:
            s = g
        elif req.grad_accum is None:
            g = s = unit
            why.append(
                f"gradient_accumulation_steps={g}: {p}×{n} processes is not a multiple of num_generations={k}; "
                f"accumulating {g} steps gives {p * n * g} completions = {p * n * g // k} prompts × {k}"
            )
        else:
            s = g
            problems.append(
                f"global batch {p}×{n} processes×{g} gradient_accumulation_steps = {p * n * g} is not divisible "
                f"by num_generations={k}, and a generation that served more than one optimizer step would train "
                "off policy"
            )
            alternatives += _alternatives_on_policy(n, p, g, k, req, colocate_n)
    if s is not None and gbs is None and p is not None:
        gbs = p * n * s

    pe, ke = None, None
    if req.eval_on:
        ke = req.num_generations_eval or k
        unit_e = ke // math.gcd(n, ke)
        if req.per_device_eval is None:
            pe = _nearest(TRL_DEFAULTS["per_device_eval_batch_size"], lambda v: v % unit_e == 0) or unit_e
            if pe != TRL_DEFAULTS["per_device_eval_batch_size"]:
                why.append(f"per_device_eval_batch_size={pe}: {pe}×{n} processes is a multiple of {ke}")
        else:
            pe = req.per_device_eval
            if (pe * n) % ke:
                problems.append(
                    f"global eval batch {pe}×{n} processes = {pe * n} is not divisible by the "
                    f"{'num_generations_eval' if req.num_generations_eval else 'num_generations'} ({ke})"
                )
                up = _nearest(pe, lambda v: v % unit_e == 0) or unit_e
                alternatives.append(Fix("per_device_eval_batch_size", up, rank=1, cost=abs(math.log(up / pe))))
                d = _divisor_near(pe * n, ke)
                if d is not None:
                    alternatives.append(Fix("num_generations_eval", d, rank=2, cost=1.0 + abs(math.log(d / ke))))

    if problems:
        raise LayoutError(
            f"no valid batch layout for {n} training process{'es' if n > 1 else ''}:",
            problems=problems,
            fixes=alternatives,
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
    )
    return layout, why


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
        p = _nearest(TRL_DEFAULTS["per_device_train_batch_size"], lambda v: share % v == 0, hi=share)
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


def _alternatives_on_policy(n: int, p: int, g: int, k: int, req: LayoutRequest, colocate_n: int | None) -> list[Fix]:
    """Fixes for a per-device batch and accumulation that do not fill whole prompt groups, on policy first."""
    out: list[Fix] = []
    unit = k // math.gcd(p * n, k)
    for v in {max(unit, (g // unit) * unit), (g // unit + 1) * unit}:
        out.append(Fix("gradient_accumulation_steps", v, "one generation per optimizer step", rank=0,
                       cost=abs(math.log(v / g))))  # fmt: skip
    pv = _nearest(p, lambda v: (v * n * g) % k == 0)
    if pv:
        out.append(Fix("per_device_train_batch_size", pv, rank=1, cost=abs(math.log(pv / p))))
    total = p * n * g
    near = sorted((d for d in _divisors(total) if d >= 2), key=lambda d: (abs(d - k), d))[:2]
    if near:
        cost = min(abs(math.log(d / k)) for d in near) + 0.5  # changing the algorithm costs more than the batch
        out.append(Fix("num_generations", tuple(sorted(near)), "a different group size", rank=2, cost=cost))
    lag = k // math.gcd(total, k)
    out.append(
        Fix(
            "steps_per_generation",
            g * lag,
            f"off policy: one generation serves {lag} optimizer steps, the last trains on completions from a policy "
            f"{lag - 1} step(s) old",
            rank=3,
            cost=1.0,
        )
    )
    if colocate_n and colocate_n != n and (p * colocate_n * g) % k == 0:
        out.append(
            Fix("launch.vllm", "colocate", f"use colocated vLLM: {colocate_n} training processes", rank=3, cost=0.9)
        )
    return out


def _divisors(value: int) -> list[int]:
    """Every divisor of ``value``, by trial division up to its square root."""
    small = [d for d in range(1, math.isqrt(value) + 1) if value % d == 0]
    return sorted({*small, *(value // d for d in small)})


def _divisor_near(value: int, target: int) -> int | None:
    """The divisor of ``value`` (at least 2) nearest to ``target`` (the smaller on a tie), or None."""
    candidates = [d for d in _divisors(value) if d >= 2]
    return min(candidates, key=lambda d: (abs(d - target), d)) if candidates else None


def _with_generation_batch(n: int, req: LayoutRequest, k: int) -> tuple[int | None, str | None]:
    gbs = req.generation_batch_size
    assert gbs is not None
    p = req.per_device
    if p is None:
        p = _nearest(TRL_DEFAULTS["per_device_train_batch_size"], lambda v: gbs % (v * n) == 0)
        if p is None:
            return None, f"generation_batch_size={gbs} is not divisible by the {n} training processes"
    elif gbs % (p * n):
        return p, f"generation_batch_size={gbs} is not divisible by the global batch {p}×{n} = {p * n}"
    if gbs % k:
        return p, f"generation_batch_size={gbs} is not divisible by num_generations={k}"
    return p, None


def _alternatives_gbs(n: int, req: LayoutRequest, k: int, colocate_n: int | None) -> list[Fix]:
    gbs = req.generation_batch_size
    assert gbs is not None
    p = req.per_device or 1
    unit = math.lcm(p * n, k)
    out = []
    lower = (gbs // unit) * unit
    for v in {lower, lower + unit} - {0}:
        out.append(Fix("generation_batch_size", v, rank=0, cost=abs(math.log(v / gbs))))
    if req.num_generations is not None or gbs % k:
        d = _divisor_near(gbs, k)
        if d is not None and gbs % (p * n) == 0:
            out.append(Fix("num_generations", d, rank=2, cost=abs(math.log(d / k)) + 0.5))
    return out


def _alternatives_spg(n: int, p: int, s: int, k: int, req: LayoutRequest, colocate_n: int | None) -> list[Fix]:
    """Fixes for a generation rhythm (steps_per_generation) that does not fill whole groups: on policy first (the
    accumulation moves with it), then an off-policy one with its lag said."""
    out: list[Fix] = []
    g = req.grad_accum or TRL_DEFAULTS["gradient_accumulation_steps"]
    s_unit = k // math.gcd(p * n, k)
    for v in {max(s_unit, (s // s_unit) * s_unit), (s // s_unit + 1) * s_unit}:
        cost = abs(math.log(v / s))
        if v == g:
            out.append(Fix("steps_per_generation", v, "one generation per optimizer step", rank=0, cost=cost))
            continue
        out.append(Fix("steps_per_generation", v, "one generation per optimizer step", rank=0, cost=cost,
                       also=(("gradient_accumulation_steps", v),)))  # fmt: skip
        if v > g and v % g == 0:
            lag = v // g
            out.append(
                Fix("steps_per_generation", v, f"off policy: one generation serves {lag} optimizer steps of "
                    f"{p * n * g} completions, the last on a policy {lag - 1} step(s) old", rank=3, cost=1.0 + cost)
            )  # fmt: skip
    if req.per_device is not None:
        pv = _nearest(p, lambda v: (v * n * s) % k == 0)
        if pv:
            out.append(Fix("per_device_train_batch_size", pv, rank=1, cost=abs(math.log(pv / p))))
    total = p * n * s
    divisors = [d for d in _divisors(total) if d >= 2]
    near = sorted(divisors, key=lambda d: (abs(d - k), d))[:2]
    if near:
        cost = min(abs(math.log(d / k)) for d in near) + 0.5  # changing the algorithm costs more than the batch
        out.append(Fix("num_generations", tuple(sorted(near)), rank=2, cost=cost))
    if colocate_n and colocate_n != n and (p * colocate_n * s) % k == 0:
        out.append(
            Fix("launch.vllm", "colocate", f"use colocated vLLM: {colocate_n} training processes", rank=3, cost=1.0)
        )
    return out
