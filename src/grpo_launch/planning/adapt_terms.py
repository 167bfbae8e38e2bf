"""launch.adapt's terms for one plan, fixed when the plan is made: whether it can adapt, how many steps of warm-up
come before the decision, the gain a re-split must promise, and the notice :func:`~.planner.make_plan` adds with
them. Pure.

The decision itself follows a run's warm-up and re-plans, so it sits above ``make_plan``
(:mod:`grpo_launch.planning.after_run.adapt`, which reads :data:`MIN_GAIN` from here); the running side is
:mod:`grpo_launch.execute.adapt`.
"""

from __future__ import annotations

import math

from grpo_launch.planning.plan_types import Plan

# The threshold: a re-split costs a checkpoint, a stop and a start, and the cost model's per-split error is
# of the order of 10 % (tests/test_field_reports.py), so smaller predicted gains are within the noise.
MIN_GAIN = 0.15
# Warm-up: about this much training before judging, in steps of the predicted step time, within the bounds.
WARMUP_TARGET_S = 120.0
WARMUP_MIN, WARMUP_MAX = 3, 20


def warmup_steps(plan: Plan) -> int:
    """Steps measured before a decision (after the first, left out): ``launch.adapt_warmup_steps``, or about
    :data:`WARMUP_TARGET_S` of predicted steps."""
    if plan.recipe.launch.adapt_warmup_steps:
        return plan.recipe.launch.adapt_warmup_steps
    step = plan.estimate.step if plan.estimate else None
    if step is None or step.total_s <= 0:
        return WARMUP_MIN
    return max(WARMUP_MIN, min(WARMUP_MAX, math.ceil(WARMUP_TARGET_S / step.total_s)))


def why_not_adaptable(plan: Plan) -> str | None:
    """Why ``launch.adapt`` cannot work for this plan (None: it can)."""
    if plan.topology.is_cpu:
        return "a CPU plan has no split to change"
    if plan.estimate is None or plan.estimate.step is None:
        return "the plan has no step-time estimate to calibrate (model or GPU speed unknown)"
    if plan.asynchronous is not None:
        # AsyncGRPO overlaps them: a step's time is not generation plus training, which the calibration reads.
        return "an async plan: the calibration reads a synchronous step's generation and training times"
    if len([c for c in plan.candidates if c.outscored is None]) < 2:  # a size's other TP × DP variants aside
        return "the recipe and the model leave one split"
    return None


def adapt_notice(plan: Plan) -> str:
    """What launch.adapt will do in this run, or why it cannot."""
    why = why_not_adaptable(plan)
    if why is not None:
        return f"launch.adapt: off for this plan: {why}"
    return (
        f"launch.adapt: after {warmup_steps(plan)} steps (plus the first) the run re-plans with its own step times and "
        f"moves to a split predicted at least {MIN_GAIN:.0%} faster per prompt (at most "
        f"{plan.recipe.launch.adapt_max_resplits}; group size, prompts per step and on-policy-ness kept)"
    )
