"""After an out-of-memory failure: the plan's next memory fix, one step more frugal by the cost model, re-planned
with :func:`~grpo_launch.planning.planner.make_plan` before it is offered (printed with the failure; applied and
restarted with ``launch.on_oom: replan``, :mod:`grpo_launch.execute.policy`). Pure.

Training side, in order: gradient checkpointing; half the per-device batch with twice the accumulation (the same
generation batch, so the same learning signal); ZeRO-3; optimizer offload; optimizer and parameter offload.
vLLM side: a larger memory share when the KV cache did not fit, else eager mode (no CUDA graphs), or a smaller
share for a colocated engine that left training too little.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from grpo_launch.enums import DistBackend, Offload, VllmMode
from grpo_launch.errors import PlanError, override_value
from grpo_launch.planning.plan_types import Plan
from grpo_launch.planning.planner import make_plan
from grpo_launch.planning.refusal.verify import with_assignments

Change = tuple[tuple[tuple[str, Any], ...], str]  # (key=value assignments, why)


def _training_changes(plan: Plan) -> Iterator[Change]:
    values = plan.recipe.values
    if plan.train.gradient_checkpointing is not True and values.get("gradient_checkpointing") is not True:
        yield (("gradient_checkpointing", True),), "recompute activations in the backward (gradient checkpointing)"
    layout = plan.layout
    if layout.per_device_train_batch_size > 1:
        half = layout.per_device_train_batch_size // 2
        accumulate = layout.gradient_accumulation_steps * layout.per_device_train_batch_size // half
        same = [("per_device_train_batch_size", half), ("gradient_accumulation_steps", accumulate)]
        if "steps_per_generation" in values:
            same.append(("steps_per_generation", layout.steps_per_generation * 2))
        yield tuple(same), "half the completions per forward pass, twice the accumulation (same generation batch)"
    if plan.train.backend in (DistBackend.DDP, DistBackend.ZERO2):
        yield (("launch.backend", "zero3"),), "ZeRO-3: shard the weights too"
    if plan.train.backend.is_deepspeed and plan.train.offload == Offload.NONE:
        yield (("launch.backend", "zero3"), ("launch.offload", "optimizer")), "offload the optimizer state to CPU"
    if plan.train.backend.is_deepspeed and plan.train.offload != Offload.OPTIMIZER_PARAMS:
        yield (("launch.backend", "zero3"), ("launch.offload", "optimizer+params")), "offload weights and optimizer"


def _vllm_changes(plan: Plan, cause: str) -> Iterator[Change]:
    share = plan.vllm.gpu_memory_utilization or 0.9
    kv = "cache blocks" in cause or "KV cache" in cause
    if kv and share < 0.95:
        raised = round(min(0.95, share + 0.05), 2)
        yield (("launch.vllm_gpu_memory_utilization", raised),), "a larger vLLM memory share for the KV cache"
    if plan.vllm.mode == VllmMode.SERVER and "--enforce-eager" not in plan.recipe.launch.vllm_extra_args:
        extra = (*plan.recipe.launch.vllm_extra_args, "--enforce-eager")
        yield (("launch.vllm_extra_args", extra),), "vLLM without CUDA graphs (eager), which frees their memory"
    if plan.vllm.mode == VllmMode.COLOCATE and not kv and share > 0.15:
        lowered = round(share - 0.05, 2)
        yield (("launch.vllm_gpu_memory_utilization", lowered),), "a smaller colocated vLLM share, more for training"


def next_frugal_plan(plan: Plan, *, vllm_side: bool, cause: str = "") -> tuple[Plan, str] | None:
    """The first change (in the order above) whose recipe still plans, as (the new plan, "key=value …: why")."""
    changes = _vllm_changes(plan, cause) if vllm_side else _training_changes(plan)
    for assignments, why in changes:
        recipe = with_assignments(plan.recipe, assignments)
        if recipe is None:
            continue
        try:
            # the plan's own runtime settings, as it may have been moved to another run directory
            runtime = dataclasses.replace(
                plan.runtime, run_dir=plan.run_dir, python=plan.python, vllm_version=plan.vllm_version
            )
            new = make_plan(plan.topology, recipe, plan.model, runtime=runtime, calibration=plan.calibration)
        except PlanError:
            continue
        said = " ".join(f"{k}={override_value(v)}" for k, v in assignments)
        return new, f"{said} ({why})"
    return None
