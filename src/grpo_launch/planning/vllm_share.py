"""How much of a GPU's memory vLLM is given (pure): a colocated engine's share of each training GPU, and the
server's --gpu-memory-utilization, from the recipe's keys or TRL's defaults. Read where vLLM is placed
(:mod:`.placement`) and where the splits the recipe allows are listed (:mod:`.splits.allowed`)."""

from __future__ import annotations

from grpo_launch.planning.cost.constants import TRL_COLOCATE_UTILIZATION, VLLM_SERVER_UTILIZATION
from grpo_launch.recipe import Recipe


def colocate_utilization(recipe: Recipe) -> float:
    """The share of each training GPU colocated vLLM may use: launch.vllm_gpu_memory_utilization, TRL's key, else
    TRL's default (0.3, GRPOConfig.vllm_gpu_memory_utilization)."""
    return float(
        recipe.launch.vllm_gpu_memory_utilization
        or recipe.get("vllm_gpu_memory_utilization")
        or TRL_COLOCATE_UTILIZATION
    )


def server_utilization(recipe: Recipe) -> tuple[float, str | None]:
    """The server's --gpu-memory-utilization: launch.vllm_gpu_memory_utilization, TRL's key (which TRL itself reads
    only in colocate mode: moved, and the notice that says so), else TRL's vllm-serve default (0.9)."""
    util = recipe.launch.vllm_gpu_memory_utilization
    if util is None and recipe.is_set("vllm_gpu_memory_utilization"):
        util = float(recipe.values["vllm_gpu_memory_utilization"])
        return util, (
            f"vllm_gpu_memory_utilization={util}: moved to the vLLM server's --gpu-memory-utilization "
            "(TRL only reads it in colocate mode)"
        )
    return util or VLLM_SERVER_UTILIZATION, None
