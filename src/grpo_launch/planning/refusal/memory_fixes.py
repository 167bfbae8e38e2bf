"""The single changes that would make the training side fit, nearest first (each is planned again by
:mod:`.verify` before it is shown). Pure."""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.errors import Fix
from grpo_launch.machines.gpus import GIB
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.memory import train_memory
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.refusal.explain import Setting
from grpo_launch.recipe import Recipe


def memory_fixes(
    model: ModelShape, n: int, mem: int, budget: float, setting: Setting, work: Workload, recipe: Recipe
) -> list[Fix]:
    """Single changes that would make the training side fit, nearest first."""
    b, o, _ = setting
    fixes: list[Fix] = []

    def total(nn: int, bb: DistBackend, oo: Offload, w: Workload) -> float:
        return train_memory(model, nn, bb, oo, w).total

    w_ck = dataclasses.replace(work, gradient_checkpointing=True)
    if recipe.launch.offload is not None and total(n, DistBackend.ZERO3, Offload.OPTIMIZER_PARAMS, w_ck) <= budget:
        fixes.append(Fix("launch.offload", "optimizer+params", "offload", rank=0, also=(("launch.backend", "zero3"),)))
    for more in (2, 4, 8, 16, 32, 64):
        if total(n * more, DistBackend.ZERO3, Offload.OPTIMIZER, w_ck) <= budget:
            fixes.append(
                Fix(
                    "gpus",
                    n * more,
                    f"more GPUs: {n * more} training GPUs (ZeRO-3 + optimizer offload)",
                    rank=3,
                    in_recipe=False,
                )
            )
            break
    if not work.lora and total(n, b, o, dataclasses.replace(w_ck, lora=True)) <= budget:
        if model.is_moe:  # the experts stay frozen: adapters on the attention projections only
            attention = ("lora_target_modules", ["q_proj", "k_proj", "v_proj", "o_proj"])
            fixes.append(Fix("use_peft", True, "LoRA on the attention only: the experts stay frozen in bf16", 1,
                             also=(attention,)))  # fmt: skip
        else:
            fixes.append(Fix("use_peft", True, "LoRA: only the frozen bf16 base stays on the GPU", rank=1))
    for length in (work.completion_len // 2, work.completion_len // 4, work.completion_len // 8):
        if length >= 16 and total(n, b, o, dataclasses.replace(w_ck, completion_len=length)) <= budget:
            fixes.append(Fix("max_completion_length", length, "shorter completions", rank=2))
            break
    if work.per_device > 1 and total(n, b, o, dataclasses.replace(w_ck, per_device=1)) <= budget:
        fixes.append(Fix("per_device_train_batch_size", 1, "fewer completions per forward pass", rank=1, cost=0.5))
    if not fixes:
        fixes.append(
            Fix("gpus", None, f"GPUs with more memory than {mem / GIB:.0f} GiB, or a smaller model", 4, in_recipe=False)
        )
    return fixes
