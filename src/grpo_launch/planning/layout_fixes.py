"""The fixes a batch layout refusal offers (pure): the values nearest the recipe's that TRL accepts, on policy
first (the accumulation moves with the generation rhythm), then a different group size or an off-policy rhythm
with its lag said, ranked by how far each moves from the recipe. :mod:`.batch_layout` raises them."""

from __future__ import annotations

import math
from typing import Any

from grpo_launch.errors import Fix
from grpo_launch.planning.parallel_and_batch import group_size

MAX_AUTO = 256  # search bound for chosen sizes


def nearest(target: int, ok: Any, lo: int = 1, hi: int = MAX_AUTO) -> int | None:
    """The value in [lo, hi] closest to ``target`` for which ``ok`` holds; ties go to the smaller one. ``target`` may
    lie outside [lo, hi] (a per-device share below TRL's default): the search reaches the far end either way."""
    for d in range(max(target - lo, hi - target) + 1):
        for v in (target - d, target + d):
            if lo <= v <= hi and ok(v):
                return v
    return None


def _divisors(value: int) -> list[int]:
    """Every divisor of ``value``, by trial division up to its square root."""
    small = [d for d in range(1, math.isqrt(value) + 1) if value % d == 0]
    return sorted({*small, *(value // d for d in small)})


def divisor_near(value: int, target: int) -> int | None:
    """The divisor of ``value`` (at least 2) nearest to ``target`` (the smaller on a tie), or None."""
    candidates = [d for d in _divisors(value) if d >= 2]
    return min(candidates, key=lambda d: (abs(d - target), d)) if candidates else None


def on_policy_fixes(n: int, p: int, g: int, k: int, colocate_n: int | None) -> list[Fix]:
    """Fixes for a per-device batch and accumulation that do not fill whole prompt groups, on policy first."""
    out: list[Fix] = []
    unit = k // math.gcd(p * n, k)
    for v in {max(unit, (g // unit) * unit), (g // unit + 1) * unit}:
        out.append(
            Fix(
                "gradient_accumulation_steps", v, "one generation per optimizer step", rank=0, cost=abs(math.log(v / g))
            )
        )
    pv = nearest(p, lambda v: (v * n * g) % k == 0)
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


def generation_batch_fixes(
    n: int, gbs: int, per_device: int | None, num_generations: int | None, colocate_n: int | None
) -> list[Fix]:
    """Fixes for a generation_batch_size that fills no whole groups or global batches."""
    k = group_size(num_generations)
    p = per_device or 1
    unit = math.lcm(p * n, k)
    out = []
    lower = (gbs // unit) * unit
    for v in {lower, lower + unit} - {0}:
        out.append(Fix("generation_batch_size", v, rank=0, cost=abs(math.log(v / gbs))))
    if num_generations is not None or gbs % k:
        d = divisor_near(gbs, k)
        if d is not None and gbs % (p * n) == 0:
            out.append(Fix("num_generations", d, rank=2, cost=abs(math.log(d / k)) + 0.5))
    return out


def rhythm_fixes(n: int, p: int, s: int, g: int, k: int, per_device_set: bool, colocate_n: int | None) -> list[Fix]:
    """Fixes for a generation rhythm (steps_per_generation) that does not fill whole groups: on policy first (the
    accumulation moves with it), then an off-policy one with its lag said."""
    out: list[Fix] = []
    s_unit = k // math.gcd(p * n, k)
    for v in {max(s_unit, (s // s_unit) * s_unit), (s // s_unit + 1) * s_unit}:
        cost = abs(math.log(v / s))
        if v == g:
            out.append(Fix("steps_per_generation", v, "one generation per optimizer step", rank=0, cost=cost))
            continue
        out.append(
            Fix(
                "steps_per_generation",
                v,
                "one generation per optimizer step",
                rank=0,
                cost=cost,
                also=(("gradient_accumulation_steps", v),),
            )
        )
        if v > g and v % g == 0:
            lag = v // g
            out.append(
                Fix(
                    "steps_per_generation",
                    v,
                    f"off policy: one generation serves {lag} optimizer steps of "
                    f"{p * n * g} completions, the last on a policy {lag - 1} step(s) old",
                    rank=3,
                    cost=1.0 + cost,
                )
            )
    if per_device_set:
        pv = nearest(p, lambda v: (v * n * s) % k == 0)
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
