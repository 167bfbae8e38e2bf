"""The batch is the user's algorithm (pure): which batch each split is planned at (:func:`planned_batch`).

The rule (DESIGN.md, "The batch rule"), with k = num_generations and p = per_device_train_batch_size (TRL's
defaults where unset); a split of N trainers runs p × N × GA completions per optimizer step (TRL's GRPOConfig):

- **pinned**: ``launch.prompts_per_step`` P, as verl's ``train_batch_size`` and NeMo-RL's ``num_prompts_per_step``
  do: every split is planned at P × k completions; the accumulation is derived for its trainers, and a split that
  cannot take that batch evenly is rejected (never planned at another);
- **the recipe's own**: the recipe sets ``gradient_accumulation_steps``, ``steps_per_generation`` or
  ``generation_batch_size`` (as open-r1's recipes do): None here; each split keeps those values, so a split with
  fewer trainers runs a smaller batch and the search compares the candidates per completion;
- **free**: the recipe sets none of them: the default batch, the one TRL itself runs on these GPUs with no
  accumulation and every GPU a trainer, p × GPUs completions rounded up to whole groups of k (lcm(p × GPUs, k)),
  then planned as if pinned. It depends on the recipe and the topology only, never on the splits compared: the
  search never chooses (or inflates) a batch to make a split comparable.
"""

from __future__ import annotations

import math

from grpo_launch.planning.batch_layout import TRL_DEFAULTS, LayoutRequest
from grpo_launch.planning.parallel_and_batch import Layout


def feasible(completions: int, trainers: int, per_device: int | None) -> bool:
    """``trainers`` processes can take exactly ``completions`` per optimizer step (with the recipe's per-device
    batch when it sets one)."""
    return completions % (trainers * (per_device or 1)) == 0


def sets_its_batch(req: LayoutRequest) -> str | None:
    """The key by which the recipe sets its own batch (its accumulation or generation rhythm), if any."""
    return req.own_batch_key


def default_prompts(req: LayoutRequest, trainers: int) -> int:
    """The default batch's prompts per step: p × ``trainers`` completions rounded up to whole groups of k."""
    share = (req.per_device or TRL_DEFAULTS["per_device_train_batch_size"]) * trainers
    return math.lcm(share, req.group) // req.group


def planned_batch(req: LayoutRequest, pinned: int | None, trainers: int, gpus: int) -> tuple[int, str] | None:
    """The prompts per optimizer step every split is planned at, and why; None where the recipe sets its own batch
    (each split then runs the recipe's values at its own trainer count). ``trainers`` is the trainer count the
    default batch is sized for: every GPU (``gpus``), unless the recipe (its launch pins, or a model that fits
    one split) leaves a single trainer count."""
    k = req.group
    if pinned is not None:
        return pinned, f"launch.prompts_per_step={pinned} pins the global batch: {pinned * k} completions per step"
    if sets_its_batch(req) is not None:
        return None
    prompts = default_prompts(req, trainers)
    p = req.per_device or TRL_DEFAULTS["per_device_train_batch_size"]
    said = "the recipe's" if req.per_device is not None else "TRL's default"
    where = f"all {gpus} GPUs" if trainers == gpus else f"the {trainers} training GPUs the recipe leaves"
    return prompts, (
        f"the default batch: {said} per_device_train_batch_size {p} on {where} with no accumulation, rounded up "
        f"to whole groups of num_generations {k}: lcm({p * trainers}, {k}) = {prompts * k} completions = {prompts} "
        "prompts per step, every split planned at it (pin another with launch.prompts_per_step, or set "
        "gradient_accumulation_steps)"
    )


def batch_pins(layout: Layout) -> list[str]:
    """The recipe overrides that pin a planned batch (the algorithm), for a job that plans again inside its
    allocation (``sbatch``, ``sky``, ``ray-submit``): it keeps this batch, or refuses.

    - A batch the recipe sets itself (its accumulation, generation rhythm or generation batch) is pinned as those
      values, never as a prompts-per-step: the job then plans by the same rule as here (each split runs the
      recipe's values on its own trainers), so on the same GPUs it plans the same split and the same batch. A
      ``launch.prompts_per_step`` taken from the split planned here would turn the recipe's accumulation into a
      derived one and let the allocation's split change it (4 → 2 where the job found more trainers than a plan made
      without the GPU model), and beside a ``generation_batch_size`` it is refused.
    - A pinned or default batch is pinned as its prompts per step, group size and per-device batch (a split that
      cannot take it evenly is never planned at another). A generation rhythm that spans optimizer steps (not whole
      groups per step) pins nothing: the recipe's own values keep it."""
    completions, k = layout.completions_per_optimizer_step, layout.num_generations
    common = [f"num_generations={k}", f"per_device_train_batch_size={layout.per_device_train_batch_size}"]
    if layout.recipe_batch_key is not None:
        own = [f"gradient_accumulation_steps={layout.gradient_accumulation_steps}"]
        if layout.generation_batch_size_given:
            own.append(f"generation_batch_size={layout.generation_batch_size}")
        elif layout.steps_per_generation != layout.gradient_accumulation_steps:  # the recipe's own rhythm
            own.append(f"steps_per_generation={layout.steps_per_generation}")
        return [*own, *common]
    if completions % k:
        return []
    return [f"launch.prompts_per_step={completions // k}", *common]
