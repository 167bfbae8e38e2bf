"""What the recipe asks of vLLM (pure): its mode (launch.vllm, TRL's use_vllm / vllm_mode, a server size) and its
tensor-parallel size, each refused here when it contradicts itself or the topology."""

from __future__ import annotations

from grpo_launch.enums import VllmMode
from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import Topology
from grpo_launch.planning.types import Trace
from grpo_launch.recipe import Recipe


def requested_mode(topology: Topology, recipe: Recipe) -> VllmMode | None:
    """The vLLM mode the recipe asks for (launch.vllm, TRL's use_vllm / vllm_mode, a server size), or None: the
    split search chooses. On CPU there is no vLLM."""
    wanted = recipe.launch.vllm
    trl_mode = VllmMode(recipe.get("vllm_mode")) if recipe.get("vllm_mode") else None
    if recipe.values.get("use_vllm") is False:
        if wanted not in (None, VllmMode.OFF):
            raise PlanError(
                f"the recipe sets use_vllm: false but launch.vllm={wanted}",
                hint="Remove one of them: use_vllm: true with launch.vllm, or launch.vllm=off.",
            )
        wanted = VllmMode.OFF
    if trl_mode and wanted is None:
        wanted = trl_mode
    elif trl_mode and wanted not in (None, trl_mode):
        raise PlanError(
            f"the recipe sets vllm_mode: {trl_mode} but launch.vllm={wanted}",
            hint="Keep one: grpo-launch writes vllm_mode for the trainer from launch.vllm.",
        )
    if topology.is_cpu:
        if wanted in (VllmMode.SERVER, VllmMode.COLOCATE):
            raise PlanError(
                f"vLLM {wanted} mode needs CUDA GPUs, and this topology has none",
                hint="On CPU, generate with transformers: launch.vllm=off (or use_vllm: false). "
                "To plan for GPUs from here, pass --gpus, e.g. --gpus 4xL20-48GB.",
            )
        return VllmMode.OFF
    launch = recipe.launch
    pp = launch.vllm_pipeline_parallel_size
    if wanted == VllmMode.COLOCATE and pp is not None and pp > 1:
        raise PlanError(
            f"launch.vllm_pipeline_parallel_size={pp} with colocated vLLM: TRL's colocate mode runs tensor "
            "parallelism only",
            hint="Drop launch.vllm_pipeline_parallel_size, or use launch.vllm=server.",
        )
    if wanted is None and (launch.vllm_gpus is not None or launch.vllm_tensor_parallel_size is not None or pp):
        return VllmMode.SERVER  # a server size asks for a server
    return wanted


def requested_tp(recipe: Recipe, mode: VllmMode | None, trace: Trace) -> int | None:
    """The tensor-parallel size the recipe sets (launch.vllm_tensor_parallel_size, or TRL's key)."""
    tp = recipe.launch.vllm_tensor_parallel_size
    if tp is None and recipe.is_set("vllm_tensor_parallel_size"):
        tp = int(recipe.values["vllm_tensor_parallel_size"])
        if mode == VllmMode.SERVER:
            trace.notice(f"vllm_tensor_parallel_size={tp}: used as the vLLM server's --tensor-parallel-size")
    return tp
