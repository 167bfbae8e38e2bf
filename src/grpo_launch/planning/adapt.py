"""Closed-loop re-splitting (``launch.adapt``): after a warm-up, the run's own measurements re-plan it, and a split
predicted clearly faster per prompt replaces the running one. Pure: the running plan and what its steps measured
in, a decision out (:mod:`grpo_launch.execute.adapt` acts on it: checkpoint, stop, resume on the new layout).

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
from collections.abc import Sequence

from grpo_launch.errors import GrpoLaunchError
from grpo_launch.planning.calibration import calibration_from
from grpo_launch.planning.plan import make_plan
from grpo_launch.planning.types import Plan
from grpo_launch.rundir.measured import Measured
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
    """The running plan's split, as the search labels it."""
    chosen = next((c for c in plan.candidates if c.chosen), None)
    if chosen is not None:
        return chosen.label
    v = plan.vllm
    trainers = plan.layout.num_processes
    return f"vLLM {v.mode} (TP {v.tensor_parallel_size} × DP {v.data_parallel_size}), {trainers} trainers"


def prompts_per_step(plan: Plan) -> int:
    layout = plan.layout
    return layout.completions_per_optimizer_step // max(1, layout.num_generations)


def per_prompt_s(plan: Plan) -> float | None:
    """The plan's predicted seconds per prompt (None without a step-time estimate)."""
    step = plan.estimate.step if plan.estimate else None
    return step.total_s / prompts_per_step(plan) if step is not None else None


def algorithm(plan: Plan) -> tuple[int, int, float]:
    """What a re-split must keep: group size, prompts per optimizer step, generation rounds per optimizer step."""
    layout = plan.layout
    rounds = layout.gradient_accumulation_steps / max(1, layout.steps_per_generation)
    return layout.num_generations, prompts_per_step(plan), rounds


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
    if len(plan.candidates) < 2:
        return "the recipe and the model leave one split"
    return None


@frozen
class Previous:
    """The split a re-split replaced: its plan and its measured seconds per prompt."""

    plan: Plan
    measured_s: float


def decide(plan: Plan, measured: Measured, *, tried: Sequence[str], resplits: int,
           previous: Previous | None = None) -> Adaptation:  # fmt: skip
    """What to do after this layout's warm-up. ``measured``: this layout's steps (read_run(after_step=…));
    ``tried``: every split this run has run; ``resplits``: re-splits made so far; ``previous``: the split the last
    re-split replaced, whose measured time decides a revert."""
    key, prompts = split_key(plan), prompts_per_step(plan)
    measured_s = measured.step_s / prompts
    predicted_s = per_prompt_s(plan)
    keep = dict(split=key, at_step=measured.last_step, measured_s=measured_s, predicted_s=predicted_s)
    if previous is not None and measured_s > previous.measured_s * (1 + REVERT_MARGIN):
        back = split_key(previous.plan)
        why = (f"{key} measured {measured_s:.3g} s per prompt, slower than the {previous.measured_s:.3g} s of {back} "
               "it replaced: back to it")  # fmt: skip
        return Adaptation("revert", why, new_split=back, new_s=previous.measured_s, plan=previous.plan, **keep)
    limit = plan.recipe.launch.adapt_max_resplits
    if resplits >= limit:
        return Adaptation("keep", f"no re-split left (launch.adapt_max_resplits={limit})", **keep)
    calibration, _ = calibration_from(measured)
    pinned = dataclasses.replace(plan.recipe.launch, prompts_per_step=prompts)
    recipe = dataclasses.replace(plan.recipe, launch=pinned)
    try:
        new = make_plan(plan.topology, recipe, plan.model, calibration=calibration, runtime=plan.runtime)
    except GrpoLaunchError as exc:
        return Adaptation("keep", f"the re-plan with the measurements failed: {exc.message}", **keep)
    new_key = split_key(new)
    same = next((c for c in new.candidates if c.label == key), None)
    calibrated_s = None
    if same is not None and same.per_prompt_s is not None:
        calibrated_s = same.per_prompt_s
    elif same is not None and same.bound_s is not None and same.prompts_per_step:
        calibrated_s = same.bound_s / same.prompts_per_step  # a lower bound: the gain is at least this
    new_s = per_prompt_s(new)
    keep["calibrated_s"] = calibrated_s
    found = dict(new_split=new_key, new_s=new_s)
    if new_key == key:
        return Adaptation("keep", f"the measurements re-plan to the same split ({key})", **keep, **found)
    if new_key in tried:
        return Adaptation("keep", f"the re-plan's best split, {new_key}, was already tried in this run", **keep,
                          **found)  # fmt: skip
    if algorithm(new) != algorithm(plan):
        return Adaptation("keep", f"{new_key} would change the algorithm (group size, prompts per step or "
                          "generation rounds per step): not taken", **keep, **found)  # fmt: skip
    current = calibrated_s if calibrated_s is not None else measured_s
    if new_s is None or new_s > current * (1 - MIN_GAIN):
        gain = f"{1 - new_s / current:.0%}" if new_s else "unknown"
        return Adaptation("keep", f"{new_key} is predicted {gain} faster per prompt, under the {MIN_GAIN:.0%} that "
                          "pays for a restart", **keep, **found)  # fmt: skip
    remaining = (measured.max_steps - measured.last_step) if measured.max_steps else None
    restart_s = (new.estimate.startup_s or 0.0) if new.estimate else 0.0
    saved_s = (current - new_s) * prompts * remaining if remaining is not None else math.inf
    if saved_s <= restart_s:
        return Adaptation("keep", f"{new_key} would save {saved_s:.0f} s over the {remaining} steps left, less than "
                          f"the {restart_s:.0f} s a restart takes", **keep, **found)  # fmt: skip
    why = (f"{new_key} is predicted {1 - new_s / current:.0%} faster per prompt ({new_s:.3g} s against "
           f"{current:.3g} s for {key}, both with this run's measurements)")  # fmt: skip
    return Adaptation("resplit", why, plan=new, **keep, **found)
