"""launch.adapt after a layout's warm-up, decided with the planner: the running plan and what its steps measured in,
an :class:`Adaptation` out (keep the split, move to a faster one, or revert the last move), and the course a run
keeps from layout to layout (the splits tried, the re-splits made, the split the last one replaced: :class:`Course`).
Pure; it re-plans with :func:`~grpo_launch.planning.planner.make_plan`, so it sits above it. When the decision comes
and what the plan promises are :mod:`grpo_launch.planning.adapt_terms`; :mod:`grpo_launch.execute.adapt` reads the
measurements, asks :func:`decide`, records the decisions and stops the trainers; the attempt loop resumes on the
plan a move makes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from grpo_launch.analysis.step_means import Measured
from grpo_launch.enums import AdaptAction
from grpo_launch.errors import GrpoLaunchError
from grpo_launch.planning.adapt_terms import MIN_GAIN, warmup_steps
from grpo_launch.planning.measured_scales import calibration_from, with_file_part
from grpo_launch.planning.plan_types import Plan
from grpo_launch.planning.planner import make_plan
from grpo_launch.rundir.records import AdaptRecord
from grpo_launch.spec import frozen

__all__ = ["MIN_GAIN", "REVERT_MARGIN", "Adaptation", "Previous", "decide", "per_prompt_s", "split_key"]


# A re-split measured this much slower per prompt than the split it replaced is undone (step-time noise between
# steps of one layout is a few percent: tests/test_adapt.py measures it on the CPU runs).
REVERT_MARGIN = 0.05


@frozen
class Adaptation(AdaptRecord):
    """One decision: what the run directory keeps of it (:class:`~grpo_launch.rundir.records.AdaptRecord`, whose
    ``to_json`` leaves the plan out) and, for a move or a revert, the plan to resume on."""

    plan: Plan | None = dataclasses.field(default=None, compare=False, repr=False)

    def record(self) -> AdaptRecord:
        """The decision as attempts.jsonl keeps it."""
        return AdaptRecord(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AdaptRecord)})


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


def _keep(reason: str, **values: Any) -> Adaptation:
    return Adaptation(AdaptAction.KEEP, reason, **values)


@frozen
class Previous:
    """The split a re-split replaced: its plan and its measured seconds per prompt."""

    plan: Plan
    measured_s: float


def decide(
    plan: Plan, measured: Measured, *, tried: Sequence[str], resplits: int, previous: Previous | None = None
) -> Adaptation:
    """What to do after this layout's warm-up. ``measured``: this layout's steps (read_run(after_step=…));
    ``tried``: every split this run has run; ``resplits``: re-splits made so far; ``previous``: the split the last
    re-split replaced, whose measured time decides a revert."""
    key, prompts = split_key(plan), prompts_per_step(plan)
    measured_s = measured.step_s / prompts
    predicted_s = per_prompt_s(plan)
    keep: dict[str, Any] = dict(split=key, at_step=measured.last_step, measured_s=measured_s, predicted_s=predicted_s)
    if previous is not None and measured_s > previous.measured_s * (1 + REVERT_MARGIN):
        back = split_key(previous.plan)
        why = (
            f"{key} measured {measured_s:.3g} s per prompt, slower than the {previous.measured_s:.3g} s of {back} "
            "it replaced: back to it"
        )
        return Adaptation(
            AdaptAction.REVERT, why, new_split=back, new_s=previous.measured_s, plan=previous.plan, **keep
        )
    limit = plan.recipe.launch.adapt_max_resplits
    if resplits >= limit:
        return _keep(f"no re-split left (launch.adapt_max_resplits={limit})", **keep)
    calibration, _ = calibration_from(measured)
    calibration = with_file_part(calibration, plan.calibration)  # the calibrate file first, the run's scales on top
    pinned = dataclasses.replace(plan.recipe.launch, prompts_per_step=prompts)
    recipe = dataclasses.replace(plan.recipe, launch=pinned)
    try:
        new = make_plan(plan.topology, recipe, plan.model, calibration=calibration, runtime=plan.runtime)
    except GrpoLaunchError as exc:
        return _keep(f"the re-plan with the measurements failed: {exc.message}", **keep)
    new_key = split_key(new)
    same = next((c for c in new.candidates if c.label == key), None)
    calibrated_s = None
    if same is not None and same.per_prompt_s is not None:
        calibrated_s = same.per_prompt_s
    elif same is not None and same.bound_s is not None and same.prompts_per_step:
        calibrated_s = same.bound_s / same.prompts_per_step  # a lower bound: the gain is at least this
    new_s = per_prompt_s(new)
    keep["calibrated_s"] = calibrated_s
    found: dict[str, Any] = dict(new_split=new_key, new_s=new_s)
    if new_key == key:
        return _keep(f"the measurements re-plan to the same split ({key})", **keep, **found)
    if new_key in tried:
        return _keep(f"the re-plan's best split, {new_key}, was already tried in this run", **keep, **found)
    if algorithm(new) != algorithm(plan):
        return _keep(
            f"{new_key} would change the algorithm (group size, prompts per step or "
            "generation rounds per step): not taken",
            **keep,
            **found,
        )
    current = calibrated_s if calibrated_s is not None else measured_s
    if new_s is None or new_s > current * (1 - MIN_GAIN):
        gain = f"{1 - new_s / current:.0%}" if new_s else "unknown"
        return _keep(
            f"{new_key} is predicted {gain} faster per prompt, under the {MIN_GAIN:.0%} that pays for a restart",
            **keep,
            **found,
        )
    remaining = (measured.max_steps - measured.last_step) if measured.max_steps else None
    restart_s = (new.estimate.startup_s or 0.0) if new.estimate else 0.0
    saved_s = (current - new_s) * prompts * remaining if remaining is not None else math.inf
    if saved_s <= restart_s:
        return _keep(
            f"{new_key} would save {saved_s:.0f} s over the {remaining} steps left, less than "
            f"the {restart_s:.0f} s a restart takes",
            **keep,
            **found,
        )
    why = (
        f"{new_key} is predicted {1 - new_s / current:.0%} faster per prompt ({new_s:.3g} s against "
        f"{current:.3g} s for {key}, both with this run's measurements)"
    )
    return Adaptation(AdaptAction.RESPLIT, why, plan=new, **keep, **found)


def decision_due(plan: Plan, new_steps: int) -> bool:
    """Whether a layout's decision is due once ``new_steps`` of its steps are recorded: the first (which compiles and
    warms up, so it is left out) and :func:`~grpo_launch.planning.adapt_terms.warmup_steps` more."""
    return new_steps >= warmup_steps(plan) + 1


@frozen
class Course:
    """What a run's re-splits so far bind the next decision to (:func:`.adapt.decide`'s ``tried``,
    ``resplits`` and ``previous``)."""

    tried: tuple[str, ...] = ()  # every split the run has run, in order
    resplits: int = 0  # moves made (reverts do not count: launch.adapt_max_resplits bounds the moves)
    previous: Previous | None = None  # the split the last re-split replaced, whose measured time decides a revert

    def starting(self, plan: Plan) -> Course:
        """The course once ``plan``'s layout starts: its split counts as tried."""
        key = split_key(plan)
        return self if key in self.tried else dataclasses.replace(self, tried=(*self.tried, key))

    def after(self, running: Plan, adaptation: Adaptation) -> tuple[Course, Plan]:
        """The course after a move away from ``running``, and the plan to resume on. A re-split counts and remembers
        what it replaced; a revert returns to a measured split, which leaves nothing to compare it with."""
        if not adaptation.action.moves or adaptation.plan is None:
            raise ValueError(f"a {adaptation.action} decision has no plan to move to")
        if adaptation.action == AdaptAction.RESPLIT:
            previous = Previous(running, adaptation.measured_s)
            return dataclasses.replace(self, resplits=self.resplits + 1, previous=previous), adaptation.plan
        return dataclasses.replace(self, previous=None), adaptation.plan
