"""vLLM's sizing, decided once (pure): the memory share it may use (``gpu_memory_utilization``: the colocated share
of each training GPU, or the server's) and how many sequences it decodes at once (``max_num_seqs``), from the KV
cache those sequences need (:func:`grpo_launch.planning.cost.memory.vllm_memory`)."""

from __future__ import annotations

from grpo_launch.planning.cost.constants import TRL_COLOCATE_UTILIZATION
from grpo_launch.recipe import Recipe


def colocate_utilization(recipe: Recipe) -> float:
    """The share of each training GPU colocated vLLM may use: launch.vllm_gpu_memory_utilization, TRL's key, else
    TRL's default (0.3, GRPOConfig.vllm_gpu_memory_utilization)."""
    return float(
        recipe.launch.vllm_gpu_memory_utilization
        or recipe.get("vllm_gpu_memory_utilization")
        or TRL_COLOCATE_UTILIZATION
    )
