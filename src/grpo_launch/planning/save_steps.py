"""The checkpoint interval and the checkpoints kept: where the recipe leaves ``save_steps`` unset the plan chooses
Young/Daly's interval (:mod:`.cost.checkpoints`) from the checkpoint's size over the disk's write speed (measured by
``grpo-launch calibrate``, else assumed), the GPUs' failure rate and the predicted step; a recipe's own
``save_steps`` is kept, with a notice when it loses more than twice the optimum's time; an unset
``save_total_limit`` becomes 2, so the disk holds at most three checkpoints (the Trainer writes the next before it
deletes the oldest). Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.checkpoints import (
    OFF_BY,
    TRL_SAVE_STEPS,
    SaveInterval,
    duration,
    off_the_optimum,
    save_interval,
)
from grpo_launch.planning.cost.constants import _c
from grpo_launch.planning.cost.storage import save_bytes
from grpo_launch.planning.plan_types import Estimate, Trace, TrainPlan
from grpo_launch.recipe import Recipe

KEEP = 2  # save_total_limit when the recipe sets none


def plan_saves(
    recipe: Recipe,
    values: dict[str, Any],
    estimate: Estimate | None,
    topology: Topology,
    model: ModelShape | None,
    train: TrainPlan,
    trace: Trace,
) -> tuple[dict[str, Any], Estimate | None]:
    """The trainer values with the chosen ``save_steps`` and ``save_total_limit``, and the estimate with the interval's
    arithmetic; unchanged where the run saves no checkpoints, or its step time or GPUs are unknown."""
    step = estimate.step if estimate is not None else None
    if estimate is None or step is None or model is None or topology.is_cpu or not _saves_by_steps(recipe):
        return values, estimate
    one, _ = save_bytes(model, train.backend, values, mixed_precision=train.mixed_precision)
    measured = estimate.workload.scale.measured if estimate.workload is not None else None
    if measured is not None and measured.save_bytes_per_s:
        rate, why = measured.save_bytes_per_s, "measured by calibrate"
    else:
        rate, why = _c("save_bytes_per_s"), "assumed: calibrate measures it"
    own = recipe.values.get("save_steps")
    recipe_steps = int(own) if isinstance(own, (int, float)) and own >= 1 else None
    if own is not None and recipe_steps is None:  # a fraction of the run (the Trainer's float form): the recipe's
        return values, estimate
    interval = save_interval(
        one,
        rate,
        why,
        topology.num_gpus,
        recipe.launch.mtbf_hours,
        step.total_s,
        estimate.restart_s or 0.0,
        recipe_steps,
    )
    out = dict(values)
    if recipe_steps is None:
        out["save_steps"] = interval.steps
        trace.decide("save_steps", interval.steps, _why(interval))
        every = duration(interval.steps * step.total_s)
        trace.notice(
            f"save_steps={interval.steps} (a checkpoint every {every}): the interval that loses least to "
            f"failures and saving for {topology.num_gpus} GPUs (Young/Daly; TRL's default is "
            f"{TRL_SAVE_STEPS}); plan --explain shows the arithmetic"
        )
    elif (ratio := off_the_optimum(interval)) > OFF_BY:
        lost, saving = interval.waste_per_day_s(interval.steps)
        best = sum(interval.waste_per_day_s(interval.optimum_steps))
        trace.notice(
            f"save_steps={recipe_steps} (the recipe's) loses about {duration(lost + saving)} a day of "
            f"training to failures and saving, {ratio:.1f}× the {duration(best)} of save_steps="
            f"{interval.optimum_steps} (Young/Daly for {topology.num_gpus} GPUs); kept"
        )
    if values.get("save_total_limit") is None:
        out["save_total_limit"] = KEEP
        disk = f"{(KEEP + 1) * one / 1e9:.1f} GB"
        trace.decide(
            "save_total_limit",
            KEEP,
            f"checkpoints kept: at most {KEEP + 1} on disk at once ({KEEP} and "
            f"the one being written), {disk}; set save_total_limit to keep more",
        )
    else:
        kept = int(values["save_total_limit"]) + 1
        disk = f"{kept * one / 1e9:.1f} GB"
        trace.decide(
            "save_total_limit",
            values["save_total_limit"],
            f"the recipe's: at most {kept} checkpoints on disk at once, {disk}",
        )
    explain = (*estimate.explain, *interval.lines())
    return out, dataclasses.replace(estimate, explain=explain, save_interval=interval)


def _saves_by_steps(recipe: Recipe) -> bool:
    """Whether the run saves every N steps (TRL's default "steps"; "no" and "epoch" have no interval to choose)."""
    return str(recipe.values.get("save_strategy") or "steps") == "steps"


def _why(interval: SaveInterval) -> str:
    lost, saving = interval.waste_per_day_s(interval.steps)
    trl = sum(interval.waste_per_day_s(TRL_SAVE_STEPS))
    return (
        f"Young/Daly √(2 · save {interval.save_s:.0f} s · {duration(interval.mtbf_s)} between failures): "
        f"{duration(lost + saving)} a day lost to failures and saving, against {duration(trl)} at TRL's "
        f"{TRL_SAVE_STEPS}"
    )
