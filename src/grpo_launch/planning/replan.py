"""launch.adapt's decision after a layout's warm-up (the rules are in :mod:`.adapt`). Pure: the running plan and
what its steps measured in, an :class:`~grpo_launch.planning.adapt.Adaptation` out."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from grpo_launch.errors import GrpoLaunchError
from grpo_launch.planning.adapt import (
    MIN_GAIN,
    REVERT_MARGIN,
    Adaptation,
    algorithm,
    per_prompt_s,
    prompts_per_step,
    split_key,
)
from grpo_launch.planning.calibration import calibration_from
from grpo_launch.planning.plan import make_plan
from grpo_launch.planning.types import Plan
from grpo_launch.rundir.measured import Measured
from grpo_launch.spec import frozen


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
    keep: dict[str, Any] = dict(split=key, at_step=measured.last_step, measured_s=measured_s, predicted_s=predicted_s)
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
    found: dict[str, Any] = dict(new_split=new_key, new_s=new_s)
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
