"""The single changes that would make the training side fit, nearest first (each is planned again by
:mod:`.verify` before it is shown). Pure."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

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
            fixes.append(
                Fix(
                    "use_peft",
                    True,
                    "LoRA on the attention only: the experts stay frozen in bf16",
                    1,
                    also=(attention,),
                )
            )
        else:
            fixes.append(Fix("use_peft", True, "LoRA: only the frozen bf16 base stays on the GPU", rank=1))
    for length in (work.completion_len // 2, work.completion_len // 4, work.completion_len // 8):
        if length >= 16 and total(n, b, o, dataclasses.replace(w_ck, completion_len=length)) <= budget:
            fixes.append(Fix("max_completion_length", length, "shorter completions", rank=2))
            break
    if work.per_device > 1:
        fixes += per_device_fixes(
            work.per_device, lambda p: total(n, b, o, dataclasses.replace(w_ck, per_device=p)) <= budget, recipe
        )
    if not fixes:
        fixes.append(
            Fix("gpus", None, f"GPUs with more memory than {mem / GIB:.0f} GiB, or a smaller model", 4, in_recipe=False)
        )
    return fixes


def per_device_fixes(per_device: int, fits: Callable[[int], bool], recipe: Recipe) -> list[Fix]:
    """The most completions per forward pass that fit (memory grows with ``per_device_train_batch_size``): with the
    accumulation scaled to keep the batch (the batch rule's re-factoring of per-device × accumulation), and alone
    (a smaller batch, unless ``launch.prompts_per_step`` pins it and the accumulation follows). Empty when even one
    completion per pass does not fit."""
    if not fits(1):
        return []
    lo, hi = 1, per_device - 1  # the largest that fits: memory is monotone in the per-device batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    most = lo
    cost = abs(math.log(per_device / most))
    if recipe.launch.prompts_per_step is not None:  # the accumulation is derived from the pinned batch
        return [
            Fix(
                "per_device_train_batch_size",
                most,
                "the most completions per forward pass that fit; launch.prompts_per_step keeps the batch",
                rank=0,
                cost=cost,
            )
        ]
    fixes = [
        Fix(
            "per_device_train_batch_size",
            most,
            "the most completions per forward pass that fit; a smaller batch",
            rank=1,
            cost=cost,
        )
    ]
    keep = max(d for d in _divisors(per_device) if d <= most)
    accumulation = int(recipe.get("gradient_accumulation_steps") or 1) * (per_device // keep)
    also: tuple[tuple[str, object], ...] = (("gradient_accumulation_steps", accumulation),)
    spg = recipe.get("steps_per_generation")
    if spg is not None:  # the generation rhythm in micro-steps, scaled with them
        also += (("steps_per_generation", int(spg) * (per_device // keep)),)
    said = f"{keep} completions per forward pass, the same batch over more accumulation steps"
    fixes.append(
        Fix("per_device_train_batch_size", keep, said, rank=0, cost=abs(math.log(per_device / keep)), also=also)
    )
    return fixes


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
