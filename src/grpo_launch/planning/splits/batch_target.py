"""The batch every split is compared at (pure): every split is planned at the same prompts per optimizer step
(:func:`prompts_target`), so the search compares like with like: the recipe's algorithm (group size, prompts per
step, one generation per step) is the same whatever wins, and only the accumulation (and a per-device batch the
recipe leaves unset) adapts to the trainer count."""

from __future__ import annotations

import math
from collections.abc import Iterable

from grpo_launch.planning.batch_layout import TRL_DEFAULTS, LayoutRequest


def feasible(completions: int, trainers: int, per_device: int | None) -> bool:
    """``trainers`` processes can take exactly ``completions`` per optimizer step (with the recipe's per-device
    batch when it sets one)."""
    return completions % (trainers * (per_device or 1)) == 0


# When the recipe leaves the accumulation to the planner, it may take up to this many times the least batch with
# every GPU training, to find one that more splits can take exactly.
TARGET_GROWTH = 4


def prompts_target(req: LayoutRequest, pinned: int | None, trainer_counts: Iterable[int], gpus: int) -> tuple[int, str]:
    """The prompts per optimizer step every split is planned at, and why.

    - ``launch.prompts_per_step`` pins it;
    - a recipe that sets its accumulation (or its generation rhythm) fixes it through its per-device values: their
      batch with as many trainers as can take it, every GPU training first (TRL's own default layout);
    - otherwise the planner chooses the accumulation: the least batch that fills whole prompt groups with every GPU
      training, or a multiple of it (up to :data:`TARGET_GROWTH` ×) that the most trainer counts can take exactly,
      so the splits are compared at one batch."""
    k = req.group
    counts = sorted(set(trainer_counts) | {gpus}, reverse=True)
    if pinned is not None:
        return pinned, "launch.prompts_per_step"
    p = req.per_device
    if req.grad_accum is not None or req.steps_per_generation is not None:
        g = req.steps_per_generation or req.grad_accum or 1
        pd = p or TRL_DEFAULTS["per_device_train_batch_size"]
        for n in counts:
            if (pd * n * g) % k == 0:
                said = "steps_per_generation" if req.steps_per_generation else "gradient_accumulation_steps"
                return pd * n * g // k, (
                    f"the recipe's per_device_train_batch_size {pd} × {n} trainers × {said} {g} ÷ num_generations {k}"
                )
        g = req.grad_accum or 1
        return _least(pd, gpus, k), f"the least batch of {pd} per device on {gpus} trainers that fills groups of {k}"
    pd = p or _default_per_device(gpus, k)
    base = _least(pd, gpus, k)
    best, best_count = base, -1
    for m in range(1, TARGET_GROWTH + 1):
        count = sum(feasible(base * m * k, n, p) for n in counts)
        if count > best_count:
            best, best_count = base * m, count
    why = f"the least batch of {pd} per device on all {gpus} GPUs that fills whole groups of {k} is {base}"
    if best != base:
        why += f"; {best}, {best // base}× that, is one more of the compared splits can take exactly"
    return best, why + " (pin it with launch.prompts_per_step)"


def _least(per_device: int, trainers: int, k: int) -> int:
    """Prompts per step of the least accumulation that fills whole groups of ``k``."""
    return per_device * trainers * (k // math.gcd(per_device * trainers, k)) // k


def _default_per_device(trainers: int, k: int) -> int:
    """TRL's default per-device batch, or the nearest that fills whole groups without accumulation."""
    base = TRL_DEFAULTS["per_device_train_batch_size"]
    for d in range(base):
        for v in (base - d, base + d):
            if v >= 1 and (v * trainers) % k == 0:
                return v
    return base
