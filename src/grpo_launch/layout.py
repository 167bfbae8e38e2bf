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
from dataclasses import dataclass
from typing import Any

from grpo_launch.errors import PlanError

TRL_DEFAULTS = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "per_device_eval_batch_size": 8,
}
MAX_AUTO = 256  # search bound for chosen sizes


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
    """The value in [lo, hi] closest to ``target`` for which ``ok`` holds; ties go to the smaller one."""
    for d in range(0, hi):
        for v in (target - d, target + d):
            if lo <= v <= hi and ok(v):
                return v
    return None


@dataclass(frozen=True)
class Alternative:
    change: str
    cost: float  # relative size of the change; smaller is nearer
    order: int  # rank first by what changes: accumulation < per-device batch < generations < GPUs; then by cost

    def __str__(self) -> str:
        return self.change


def solve_layout(n: int, req: LayoutRequest, *, colocate_n: int | None = None) -> tuple[Layout, list[str]]:
    """Choose a valid layout for ``n`` trainer processes; returns it and the reasons for each choice.

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
    alternatives: list[Alternative] = []

    k = req.num_generations or TRL_DEFAULTS["num_generations"]
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
    else:
        if p is None:
            # Keep TRL's default when it works; otherwise the nearest per-device batch that fills whole groups
            # without accumulation.
            base_s = s or g
            p = _nearest(TRL_DEFAULTS["per_device_train_batch_size"], lambda v: (v * n * base_s) % k == 0)
            if p is None:
                p = TRL_DEFAULTS["per_device_train_batch_size"]
            elif p != TRL_DEFAULTS["per_device_train_batch_size"]:
                why.append(f"per_device_train_batch_size={p}: {p}×{n} processes×{base_s} is a multiple of {k}")
        if s is None:
            unit = k // math.gcd(p * n * g, k)
            if unit == 1:
                s = g
            elif req.grad_accum is None:
                g = unit
                s = g
                why.append(
                    f"gradient_accumulation_steps={g}: {p}×{n} processes is not a multiple of num_generations={k}; "
                    f"accumulating {g} steps gives {p * n * g} completions = {p * n * g // k} prompts × {k}"
                )
            else:
                s = g * unit
                why.append(
                    f"steps_per_generation={s}: with gradient_accumulation_steps={g} fixed, one generation of "
                    f"{p * n * s} completions serves {unit} optimizer steps"
                )
        elif (p * n * s) % k:
            problems.append(
                f"generation batch {p}×{n} processes×{s} steps_per_generation = {p * n * s} is not divisible by "
                f"num_generations={k}"
            )
            alternatives += _alternatives_spg(n, p, s, k, req, colocate_n)
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
                alternatives.append(Alternative(f"set per_device_eval_batch_size={up}", abs(math.log(up / pe)), 1))
                d = _divisor_near(pe * n, ke)
                if d is not None:
                    alternatives.append(Alternative(f"set num_generations_eval={d}", 1.0 + abs(math.log(d / ke)), 2))

    if problems:
        ranked = sorted({a.change: a for a in alternatives}.values(), key=lambda a: (a.order, a.cost))
        raise PlanError(
            f"no valid batch layout for {n} training process{'es' if n > 1 else ''}:",
            problems=problems,
            hint=("Nearest valid alternatives:\n" + "\n".join(f"  {i}. {a}" for i, a in enumerate(ranked[:6], 1)))
            if ranked
            else None,
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


def _divisor_near(value: int, target: int) -> int | None:
    """The divisor of ``value`` (at least 2) nearest to ``target``, or None."""
    return _nearest(target, lambda d: value % d == 0, lo=2, hi=max(2, value))


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


def _alternatives_gbs(n: int, req: LayoutRequest, k: int, colocate_n: int | None) -> list[Alternative]:
    gbs = req.generation_batch_size
    assert gbs is not None
    p = req.per_device or 1
    unit = math.lcm(p * n, k)
    out = []
    lower = (gbs // unit) * unit
    for v in {lower, lower + unit} - {0}:
        out.append(Alternative(f"set generation_batch_size={v}", abs(math.log(v / gbs)), 0))
    if req.num_generations is not None or gbs % k:
        d = _divisor_near(gbs, k)
        if d is not None and gbs % (p * n) == 0:
            out.append(Alternative(f"set num_generations={d}", abs(math.log(d / k)) + 0.5, 2))
    return out


def _alternatives_spg(n: int, p: int, s: int, k: int, req: LayoutRequest, colocate_n: int | None) -> list[Alternative]:
    out: list[Alternative] = []
    s_unit = k // math.gcd(p * n, k)
    for v in {max(s_unit, (s // s_unit) * s_unit), (s // s_unit + 1) * s_unit}:
        out.append(Alternative(f"set steps_per_generation={v}", abs(math.log(v / s)), 0))
    if req.per_device is not None:
        pv = _nearest(p, lambda v: (v * n * s) % k == 0)
        if pv:
            out.append(Alternative(f"set per_device_train_batch_size={pv}", abs(math.log(pv / p)), 1))
    total = p * n * s
    divisors = [d for d in range(2, total + 1) if total % d == 0]
    near = sorted(divisors, key=lambda d: (abs(d - k), d))[:2]
    if near:
        cost = min(abs(math.log(d / k)) for d in near) + 0.5  # changing the algorithm costs more than the batch
        out.append(Alternative(f"set num_generations={' or '.join(map(str, sorted(near)))}", cost, 2))
    if colocate_n and colocate_n != n and (p * colocate_n * s) % k == 0:
        out.append(Alternative(f"use colocated vLLM (launch.vllm=colocate): {colocate_n} training processes", 1.0, 3))
    return out
