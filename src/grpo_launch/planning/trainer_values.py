"""The resolved trainer recipe: the recipe's TRL values with every planned value written in. Pure."""

from __future__ import annotations

from typing import Any

from grpo_launch.enums import Device, VllmMode
from grpo_launch.planning.layout import Layout
from grpo_launch.planning.types import Trace, TrainPlan, VllmPlan
from grpo_launch.recipe import Recipe

# Keys the planner owns in each vLLM mode: the recipe's values are replaced by the plan's.
_SERVER_ONLY_IN_PLAN = (
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_server_host",
    "vllm_server_port",
)
_OFF_DROPPED = ("vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size")


def trainer_values(recipe: Recipe, layout: Layout, vllm: VllmPlan, train: TrainPlan, trace: Trace) -> dict[str, Any]:
    """What the training entry reads. ``output_dir`` stays out unless the recipe sets it: the Plan derives the
    default from its run directory, so a plan moved to another run dir writes there."""
    out = {k: v for k, v in recipe.values.items() if v != "auto"}
    for key in ("generation_batch_size", "steps_per_generation"):
        out.pop(key, None)
    out.update(layout.trl_values())
    if vllm.mode == VllmMode.OFF:
        out["use_vllm"] = False
        for key in _OFF_DROPPED:
            out.pop(key, None)
    elif vllm.mode == VllmMode.SERVER:
        out.update(
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=vllm.base_url,
            vllm_server_timeout=float(recipe.launch.vllm_health_timeout_s),
        )
        for key in _SERVER_ONLY_IN_PLAN:
            out.pop(key, None)
    else:
        out.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_tensor_parallel_size=vllm.tensor_parallel_size,
            vllm_gpu_memory_utilization=vllm.gpu_memory_utilization,
        )
    if train.device == Device.CPU:
        if out.get("bf16") or out.get("fp16"):
            trace.notice("bf16/fp16 turned off: CPU training runs in fp32")
        out.update(bf16=False, fp16=False)
        if train.backend.is_deepspeed:
            # DeepSpeed on CPU: its CPU accelerator owns the device, and accelerate must be told the process-group
            # backend, or it finds none and quietly runs every rank as a world of one. use_cpu would bypass
            # DeepSpeed altogether (MULTI_CPU).
            out.update(use_cpu=False, ddp_backend="gloo")
        else:
            out["use_cpu"] = True
    if train.gradient_checkpointing is not None and train.device == Device.CUDA:
        out["gradient_checkpointing"] = train.gradient_checkpointing
    if out.get("output_dir") is None:
        out.pop("output_dir", None)
    return out
