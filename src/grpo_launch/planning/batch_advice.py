"""Batches the user may prefer, named but never applied (pure): the batch is the recipe's algorithm and changes
only with the user. When the chosen batch keeps a faster split out (its trainers cannot take it evenly), the batch
that split could take and what it would gain; when colocated generation is decode latency at a small batch, a
larger one; and when no split plans, the nearest batches the others could take, as fixes."""

from __future__ import annotations

import math

from grpo_launch.enums import VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.planning.batch_layout import LayoutError
from grpo_launch.planning.bounds import best_variant
from grpo_launch.planning.parallel_and_batch import Batch
from grpo_launch.planning.plan_types import Candidate
from grpo_launch.planning.search_context import Context
from grpo_launch.planning.split_in_full import plan_one
from grpo_launch.planning.splits.split import Split

WORTH_IT = 0.05  # a batch that lets a split do at least this much better per prompt is worth naming


def better_batch(ctx: Context, misses: list[Split], best: Candidate, chosen_split: Split) -> tuple[int, str] | None:
    """A batch near the chosen one that a faster split could take, and what it would gain per prompt."""
    assert best.step is not None
    req, k = ctx.request, ctx.group
    chosen = best.step.total_s / best.prompts_per_step
    found: tuple[float, int, Split] | None = None
    for split in misses:
        unit = least_prompts(split.trainers, req.per_device, k)
        for prompts in {
            max(unit, unit * math.floor(best.prompts_per_step / unit)),
            unit * math.ceil(best.prompts_per_step / unit),
        }:
            try:
                bound = best_variant(ctx, [split], Batch(prompts, k), [], [])
            except LayoutError:
                continue
            if bound is None or bound[0] / prompts >= chosen * (1 - WORTH_IT):
                continue
            if found is None or bound[0] / prompts < found[0]:
                found = (bound[0] / prompts, prompts, bound[1])
    if found is None:
        return None
    _, prompts, split = found
    try:
        plan = plan_one(ctx, split, Batch(prompts, k))
    except PlanError:
        return None
    assert plan.estimate is not None
    assert plan.estimate is not None and plan.estimate.step is not None
    per_prompt = plan.estimate.step.total_s / prompts
    # Like for like: the chosen split at that batch too, when it can take it (a larger batch is cheaper per prompt
    # on any split; only what the other split adds counts).
    against, where = chosen, f"the chosen {chosen:.2f} s"
    try:
        same = plan_one(ctx, chosen_split, Batch(prompts, k))
    except PlanError:
        same = None
    if same is not None and same.estimate is not None:
        against = same.estimate.step.total_s / prompts  # type: ignore[union-attr]  # an estimate of a candidate has its step
        where = f"{against:.2f} s with the chosen split at that batch"
    if per_prompt >= against * (1 - WORTH_IT):
        return None
    return prompts, (
        f"at {best.prompts_per_step:g} prompts per step the {split.trainers} trainers of {split.label} cannot take "
        f"the batch evenly; with launch.prompts_per_step={prompts} it would take {per_prompt:.2f} s per prompt, "
        f"{1 - per_prompt / against:.0%} less than {where} (a different batch: your choice)"
    )


LATENCY_BOUND = 10.0  # generation this many times the training (colocated) suggests a batch too small for the GPUs
LARGER = 4  # … and the batch this many times larger is tried


def latency_bound(ctx: Context, best: Candidate, split: Split, target: Batch) -> tuple[int, str] | None:
    """Colocated generation many times the training at a small batch is decode latency: every engine runs the
    longest completion's steps whatever its batch, so a larger batch costs little more generation per step. Name
    the batch that would use the GPUs better (the batch is the recipe's algorithm: never changed without the user)."""
    if best.balance is None or best.balance < LATENCY_BOUND or best.mode != VllmMode.COLOCATE or best.step is None:
        return None
    try:
        bigger = plan_one(ctx, split, target.times(LARGER))
    except PlanError:
        return None
    assert bigger.estimate is not None
    prompts = best.prompts_per_step * LARGER
    now, then = best.step.total_s / best.prompts_per_step, bigger.estimate.step.total_s / prompts  # type: ignore[union-attr]  # an estimate of a candidate has its step
    if then >= now * (1 - WORTH_IT):
        return None
    return int(prompts), (
        f"generation is {best.balance:.0f}× the training at {best.prompts_per_step:g} prompts per step: decode "
        f"latency, not throughput (each engine runs the longest completion's steps whatever its batch); "
        f"launch.prompts_per_step={prompts:g} would take {bigger.estimate.step.total_s:.1f} s per step, "  # type: ignore[union-attr]  # an estimate of a candidate has its step
        f"{1 - then / now:.0%} less per prompt (a different batch: your choice)"
    )


def least_prompts(trainers: int, per_device: int | None, k: int) -> int:
    """The least prompts per step ``trainers`` can take in whole groups of ``k``."""
    share = trainers * (per_device or 1)
    return share // math.gcd(share, k)


def batch_fixes(ctx: Context, misses: list[Split], target: Batch | None) -> list[Fix]:
    """When no split plans: the batches nearest the chosen one that the splits it kept out could take evenly
    (each is planned again before it is shown)."""
    if target is None:
        return []
    req = ctx.request
    k, prompts = target.group, target.prompts
    fixes = []
    for split in misses:
        unit = least_prompts(split.trainers, req.per_device, k)
        for near in {max(unit, unit * math.floor(prompts / unit)), unit * math.ceil(prompts / unit)}:
            fixes.append(
                Fix(
                    "launch.prompts_per_step",
                    near,
                    f"{split.trainers} trainers of {split.label} take it evenly (a different batch)",
                    rank=1,
                    cost=abs(math.log(near / prompts)),
                )
            )
    return fixes
