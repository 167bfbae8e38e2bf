"""One optimizer step's work (:class:`~grpo_launch.planning.cost.workload.Workload`) from the recipe and the batch
layout, and how far off policy a layout trains. Pure: what the estimate prices, and what the split bounds and
`grpo-launch calibrate` measure, before anything is priced."""

from __future__ import annotations

import math

from grpo_launch.enums import VllmMode
from grpo_launch.planning.cost.constants import TRL_COMPLETION_LEN
from grpo_launch.planning.cost.workload import Calibration, Workload
from grpo_launch.planning.lengths import prompt_bound
from grpo_launch.planning.parallel_and_batch import Layout
from grpo_launch.recipe import Recipe


def workload(recipe: Recipe, layout: Layout, calibration: Calibration | None = None) -> Workload:
    """One optimizer step's work, from the recipe (TRL's defaults where unset) and the layout; the mean completion
    length from a previous run's measurement, else launch.expected_completion_length, else the maximum."""
    ckpt = recipe.get("gradient_checkpointing")
    cal = calibration or Calibration()
    expected = cal.mean_completion_len or recipe.launch.expected_completion_length or 0
    return Workload(
        prompt_len=prompt_bound(recipe),
        completion_len=int(recipe.get("max_completion_length") or TRL_COMPLETION_LEN),
        completions=layout.completions_per_optimizer_step,
        num_generations=layout.num_generations,
        per_device=layout.per_device_train_batch_size,
        gradient_checkpointing=True if ckpt is None else bool(ckpt),
        lora=bool(recipe.get("use_peft")),
        reference_model=float(recipe.get("beta") or 0.0) > 0.0,
        generation_batch=layout.generation_batch_size,
        old_logprobs=_old_logprobs(recipe, layout),
        num_iterations=int(recipe.get("num_iterations") or 1),
        expected_completion_len=float(expected),
        scale=cal,
    )


def off_policy_lag(layout: Layout, iterations: int = 1) -> int:
    """How many optimizer steps old the policy behind a generation's last micro-batch can be: TRL 1.16 generates
    every steps_per_generation × num_iterations micro-batches and steps the optimizer every
    gradient_accumulation_steps (trl/trainer/grpo_trainer.py, _prepare_inputs); 0 when every generation falls within
    one optimizer step (TRL's own test: accumulation % (steps_per_generation × num_iterations) == 0).

    Generation m covers micro-batches m·w … m·w + w - 1, and an optimizer step falls after each j ≡ g - 1 (mod g)
    before its last: ⌊(r + w - 1) / g⌋ of them, r = m·w mod g. The residues r are the multiples of gcd(g, w), so
    the worst generation has r = g - gcd(g, w): a closed form, as quick for steps_per_generation = 10⁹ as for 4."""
    g, w = layout.gradient_accumulation_steps, layout.steps_per_generation * iterations
    return (g - math.gcd(g, w) + w - 1) // g


def _old_logprobs(recipe: Recipe, layout: Layout) -> bool:
    """Whether TRL 1.16 runs the extra forward for the old log-probs (trl/trainer/grpo_trainer.py): with vLLM's
    importance-sampling correction (on by default), or when a generation serves more than one optimizer step."""
    off_policy = off_policy_lag(layout, int(recipe.get("num_iterations") or 1)) > 0
    vllm = recipe.launch.vllm is not VllmMode.OFF and recipe.values.get("use_vllm") is not False
    correction = recipe.get("vllm_importance_sampling_correction")
    return off_policy or (vllm and correction is not False)
