"""Closed-loop re-splitting (``launch.adapt``): after a warm-up, the run's own measurements re-plan it, and a split
predicted clearly faster per prompt replaces the running one. This module holds its rules and the plan's notice;
:mod:`.replan` makes the decision (pure: the running plan and what its steps measured in, a decision out), and
:mod:`grpo_launch.execute.adapt` acts on it (checkpoint, stop, resume on the new layout).

- **Measured truth.** The re-plan uses the calibration of :mod:`.calibration` from this layout's steps only (the
  first step after a start is left out: it compiles and warms up), composed with the calibration the running plan
  was made with, so a miscalibrated plan is corrected, not compounded.
- **Like for like.** Both sides are predicted under that calibration at the running plan's prompts per step: the
  running split as the re-plan's candidate of the same label, the new one as its choice. The re-split is made when
  the new one is at least :data:`MIN_GAIN` faster per prompt and what remains of the run pays for the restart (the
  predicted time to the first step, paid again).
- **The algorithm is kept**: group size, prompts per optimizer step and generation rounds per optimizer step
  (on-policy-ness) must be equal in both plans, or there is no re-split.
- **Bounded**: at most ``launch.adapt_max_resplits`` re-splits, never a split already tried, and a re-split whose
  measured time per prompt is worse than the split it replaced (beyond :data:`REVERT_MARGIN`) is reverted.
"""

from __future__ import annotations

import dataclasses
import math

from grpo_launch.planning.types import Plan
from grpo_launch.spec import frozen

# Issue 24's threshold: a re-split costs a checkpoint, a stop and a start, and the cost model's per-split error is
# of the order of 10 % (tests/test_field_reports.py), so smaller predicted gains are within the noise.
MIN_GAIN = 0.15
# A re-split measured this much slower per prompt than the split it replaced is undone (step-time noise between
# steps of one layout is a few percent: tests/test_adapt.py measures it on the CPU runs).
REVERT_MARGIN = 0.05
# Warm-up: about this much training before judging, in steps of the predicted step time, within the bounds.
WARMUP_TARGET_S = 120.0
WARMUP_MIN, WARMUP_MAX = 3, 20


@frozen
class Adaptation:
    """One decision. Times are seconds per prompt: ``measured_s`` on the running split; ``predicted_s`` what its plan
    predicted; ``calibrated_s`` the running split re-predicted with the measurements; ``new_s`` the split moved to,
    predicted the same way (a revert: the measured time of the split returned to)."""

    action: str  # keep | resplit | revert
    reason: str
    at_step: int
    split: str
    measured_s: float
    predicted_s: float | None = None
    calibrated_s: float | None = None
    new_split: str | None = None
    new_s: float | None = None
    plan: Plan | None = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("plan")
        return out


def split_key(plan: Plan) -> str:
    """The plan's split, as the search labels it (the same label in every plan of the same split)."""
    return plan.split or f"vLLM {plan.vllm.mode}, {plan.layout.num_processes} trainers"


def prompts_per_step(plan: Plan) -> int:
    layout = plan.layout
    return layout.completions_per_optimizer_step // max(1, layout.num_generations)


def per_prompt_s(plan: Plan) -> float | None:
    """The plan's predicted seconds per prompt (None without a step-time estimate)."""
    step = plan.estimate.step if plan.estimate else None
    return step.total_s / prompts_per_step(plan) if step is not None else None


def algorithm(plan: Plan) -> tuple[int, int, float, int | None]:
    """What a re-split must keep: group size, prompts per optimizer step, generation rounds per optimizer step, and
    for AsyncGRPO the staleness its samples may have (on-policy-ness either way)."""
    layout = plan.layout
    rounds = layout.gradient_accumulation_steps / max(1, layout.steps_per_generation)
    staleness = plan.asynchronous.max_staleness if plan.asynchronous is not None else None
    return layout.num_generations, prompts_per_step(plan), rounds, staleness


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
    if len(plan.candidates) < 2:
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
