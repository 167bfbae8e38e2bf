"""Published asynchronous-RL measurements (issue 25), each with its source, what our model predicts for the nearest
recipe of ours, and the check the prediction must pass (the Case of tests/published_cases.py: a band on
predicted ÷ published, or one-sided where only a direction can be claimed).

What the async cost model claims (planning/cost/overlap.py): overlapping generation and training gains at most
``(gen + train) / max(gen, train)`` ≤ 2×. A published gain within that is checked as a band; a published gain above
it came with other changes (interruptible generation, rebalanced resources, reconfigured batches), and the check is
one-sided: the planner must not promise more than was measured.
"""

from __future__ import annotations

from .helpers import ROOT, plan_recipe
from .published_cases import Case

ISSUE = "issue 25 (grpo-launch), citing"


def _async(recipe: str, gpus: str, *overrides: str):
    return plan_recipe(str(ROOT / "recipes" / recipe), gpus, "launch.mode=async", *overrides)


def _speedup(recipe: str, gpus: str, *overrides: str) -> float:
    """Predicted async step over the best sync plan at the same completions per step."""
    return _async(recipe, gpus, *overrides).asynchronous.speedup


def _bound(recipe: str, gpus: str, *overrides: str) -> float:
    return _async(recipe, gpus, *overrides).asynchronous.overlap_bound


ASYNC_CASES = (
    Case(
        "nemo-rl-qwen3-30b-a3b-32xh100-speedup",
        f"{ISSUE} NeMo-RL async GRPO, Qwen3-30B-A3B on 32 H100s: 192 s → 152 s per step",
        "async over sync step, recipes/qwen3-30b-a3b.yaml on 4x8xH100-80GB (our batch and lengths, not theirs)",
        192 / 152,
        # At the batch this case was recorded at (48 prompts per step; the recipe leaves its batch free, and the
        # default batch, 16 prompts, is one that few async splits take evenly).
        lambda: _speedup("qwen3-30b-a3b.yaml", "4x8xH100-80GB", "launch.prompts_per_step=48"),
        low=0.75,
        high=1.25,
    ),
    Case(
        "nemo-rl-qwen3-30b-a3b-within-overlap-bound",
        f"{ISSUE} NeMo-RL async GRPO, Qwen3-30B-A3B on 32 H100s: 192 s → 152 s per step",
        "the overlap bound (gen + train) / max(gen, train) of our chosen split covers the measured gain",
        192 / 152,
        lambda: _bound("qwen3-30b-a3b.yaml", "4x8xH100-80GB", "launch.prompts_per_step=48"),  # as the speed-up case
        low=1.0,
    ),
    Case(
        "areal-1.5b-16-nodes",
        f"{ISSUE} AReaL (arXiv 2505.24298), 1.5B on 16 nodes: 41.0 h → 14.8 h (2.77×), with interruptible generation",
        "overlap alone predicts no more than measured: recipes/qwen1.5b.yaml on 16x8xH800",
        41.0 / 14.8,
        lambda: _speedup("qwen1.5b.yaml", "16x8xH800"),
        high=1.0,
    ),
    Case(
        "verl-fully-async-128-gpus",
        f"{ISSUE} verl fully-async, 128 GPUs: 2.35-2.67× (the low end here)",
        "overlap alone predicts no more than measured: recipes/qwen7b-math.yaml on 16x8xH100-80GB",
        2.35,
        lambda: _speedup("qwen7b-math.yaml", "16x8xH100-80GB"),
        high=1.0,
    ),
    Case(
        "hf-async-grpo-lora",
        f"{ISSUE} Hugging Face AsyncGRPO LoRA run: 22.9 → 4.8 s per step (3.9×) after five reconfigurations",
        "overlap alone predicts no more than measured: recipes/qwen7b-math.yaml with LoRA on 8xH100-80GB",
        22.9 / 4.8,
        lambda: _speedup("qwen7b-math.yaml", "8xH100-80GB", "use_peft=true"),
        high=1.0,
    ),
)
