"""A batch the training set can fill (pure): one optimizer step must not need more prompts than the training set
holds, as TRL forms its batches.

TRL 1.16's ``RepeatSampler`` (trl/trainer/utils.py, ``__iter__``) cuts the shuffled rows into generation rounds of
``generation_batch_size / num_generations`` distinct prompts and drops the last incomplete one (``indexes = [chunk
for chunk in indexes if len(chunk) == self.batch_size]``); each round serves ``steps_per_generation ×
num_iterations`` micro-steps (its ``repeat_count``), and an optimizer step is ``gradient_accumulation_steps``
micro-steps. With fewer rows than one round the dataloader is empty and the run trains 0 steps; with fewer rounds
than one optimizer step takes, transformers' ``Trainer`` ends the epoch inside the step and runs it on the
``remainder`` of its micro-batches (trainer.py, ``_inner_training_loop``): a smaller batch than the recipe's. Both
are refused before the start, with the batch that fits.
"""

from __future__ import annotations

import math

from grpo_launch.errors import Fix, PlanError
from grpo_launch.planning.parallel_and_batch import Layout
from grpo_launch.recipe import Recipe

BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
              "generation_batch_size", "num_generations")  # fmt: skip


def rounds_needed(layout: Layout, iterations: int) -> int:
    """Generation rounds one optimizer step consumes: GA micro-steps over the spg × num_iterations each serves."""
    return max(1, math.ceil(layout.gradient_accumulation_steps / (layout.steps_per_generation * iterations)))


def check_rows(layout: Layout, recipe: Recipe, rows: int | None, source: str, *, pinned: bool) -> None:
    """Refuse a batch whose optimizer step needs more prompts than the ``rows`` of the training set (None: unknown,
    nothing checked). ``pinned``: the batch is the plan's target (``launch.prompts_per_step`` or the default
    batch), so the fix is another prompts per step; else the recipe's own values, so a smaller one of them."""
    if not rows:
        return
    iterations = max(1, int(recipe.values.get("num_iterations") or 1))
    per_round = layout.prompts_per_generation
    needed = rounds_needed(layout, iterations)
    if rows // per_round >= needed:
        return
    k, n = layout.num_generations, layout.num_processes
    prompts = per_round * needed
    outcome = (
        "TRL's sampler drops the incomplete round and the run would train 0 steps"
        if rows < per_round
        else "the epoch would end inside the first optimizer step, which would run on fewer micro-batches"
    )
    where = "launch.dataset_rows" if recipe.launch.dataset_rows else (source or "counted")
    set_keys = [k_ for k_ in BATCH_KEYS if recipe.values.get(k_) not in (None, "auto")]
    if recipe.launch.prompts_per_step is not None:
        set_keys.append("launch.prompts_per_step")
    raise PlanError(
        f"one optimizer step needs {prompts} prompts and the training set has {rows} rows ({where}): "
        f"per_device_train_batch_size {layout.per_device_train_batch_size} × {n} trainer(s) × "
        f"gradient_accumulation_steps {layout.gradient_accumulation_steps} = "
        f"{layout.completions_per_optimizer_step} completions, {k} per prompt, in generation rounds of {per_round} "
        f"prompts (steps_per_generation {layout.steps_per_generation}); {outcome}",
        hint=f"Make the batch at most {rows} prompts per optimizer step"
        + (f" (the recipe sets {', '.join(set_keys)})" if set_keys else "")
        + ", or train on a larger dataset.",
        fixes=_fixes(layout, recipe, rows, iterations, pinned=pinned),
    )


def _fits(p: int, n: int, ga: int, spg: int, k: int, rows: int, iterations: int) -> bool:
    """Whether a layout of these values forms whole groups per round and finds its rounds in ``rows``."""
    completions = p * n * spg
    if completions % k:
        return False
    per_round = completions // k
    return rows // per_round >= max(1, math.ceil(ga / (spg * iterations)))


def _fixes(layout: Layout, recipe: Recipe, rows: int, iterations: int, *, pinned: bool) -> list[Fix]:
    """The nearest batches that fit: the largest prompts per step (a pinned or default batch), else the largest
    per-device batch or accumulation of the recipe's (each is planned again before it is shown)."""
    p, n, ga, spg, k = (
        layout.per_device_train_batch_size,
        layout.num_processes,
        layout.gradient_accumulation_steps,
        layout.steps_per_generation,
        layout.num_generations,
    )
    spg_follows = recipe.values.get("steps_per_generation") is None and not layout.generation_batch_size_given
    fixes: list[Fix] = []
    if pinned:
        unit = n * p // math.gcd(n * p, k)  # the least prompts per step these trainers take in whole groups
        if rows >= unit:
            most = unit * (rows // unit)
            fixes.append(
                Fix(
                    "launch.prompts_per_step",
                    most,
                    f"the most prompts per step of whole groups over {n} "
                    f"trainer(s) that the {rows} rows hold; a smaller batch",
                    rank=1,
                )
            )
    if recipe.launch.prompts_per_step is None:  # a pinned batch derives the accumulation: per-device alone keeps it
        needed = max(1, math.ceil(ga / (spg * iterations)))
        top = min(p - 1, rows * k // (needed * n * spg))  # its rounds of p × n × spg / k prompts fit in rows
        smaller = next((q for q in range(top, 0, -1) if _fits(q, n, ga, spg, k, rows, iterations)), None)
        if smaller is not None:
            said = f"the most completions per device that the {rows} rows hold; a smaller batch"
            fixes.append(Fix("per_device_train_batch_size", smaller, said, rank=1, cost=abs(math.log(p / smaller))))
        if not pinned and ga > 1 and recipe.values.get("gradient_accumulation_steps") is not None:
            per_round = p * n * spg // k
            # spg follows GA: one round per step, of p × n × g / k prompts; else g ≤ spg × iterations × rounds
            top_g = rows * k // (p * n) if spg_follows else spg * iterations * (rows // max(1, per_round))
            fewer = next(
                (
                    g
                    for g in range(min(ga - 1, top_g), 0, -1)
                    if _fits(p, n, g, g if spg_follows else spg, k, rows, iterations)
                ),
                None,
            )
            if fewer is not None:
                fixes.append(
                    Fix(
                        "gradient_accumulation_steps",
                        fewer,
                        f"the most accumulation steps the {rows} rows hold; a smaller batch",
                        rank=1,
                        cost=abs(math.log(ga / fewer)),
                    )
                )
    return fixes
