"""What a refusal offers besides its message: the single changes that would fit (nearest first), and the
arithmetic behind it (``plan --explain``: the budget and the nearest settings tried, term by term). Pure."""

from __future__ import annotations

import dataclasses

from grpo_launch.catalog import GIB, ModelShape
from grpo_launch.enums import DistBackend, Offload
from grpo_launch.errors import Fix
from grpo_launch.planning.costmodel import (
    HEADROOM,
    HOST_HEADROOM,
    VLLM_OVERHEAD_BYTES,
    VLLM_UTILIZATION_MARGIN,
    TrainMemory,
    Workload,
    train_memory,
)
from grpo_launch.recipe import Recipe

Setting = tuple[DistBackend, Offload, bool]  # (backend, offload, gradient checkpointing)


def setting_label(setting: Setting) -> str:
    b, o, c = setting
    return str(b) + ("" if o == Offload.NONE else f" + offload {o}") + (" + gradient checkpointing" if c else "")


def training_explain(
    tried: list[tuple[Setting, TrainMemory, float]], mem: int, share: float, budget: float, host_ram: int | None
) -> list[str]:
    """The training budget, then the settings tried nearest to fitting first, each term by term."""
    head = f"budget per training GPU: {HEADROOM:.0%} of {mem / GIB:.1f} GiB"
    if share:
        head += f" − the colocated vLLM's {share:.2f} × {mem / GIB:.1f} GiB"
    head += f" = {budget / GIB:.1f} GiB"
    if host_ram:
        head += f"; offload may use {HOST_HEADROOM:.0%} of {host_ram / GIB:.0f} GiB of host RAM per node"
    lines = [head]
    for setting, need, host in sorted(tried, key=lambda t: t[1].total)[:4]:
        over = need.total - budget
        verdict = "fits" if over <= 0 else f"over by {over / GIB:.1f} GiB"
        ram = f"; offload needs {host / GIB:.0f} GiB of host RAM per node" if host else ""
        lines.append(f"{setting_label(setting)}: {need.lines()[0]} ({verdict}){ram}")
    return lines


def vllm_explain(
    model: ModelShape, tp: int, mem: int, seq_len: int, util: float, weights: float, need: float, ep: int | None
) -> list[str]:
    """Why not one sequence's KV cache fits next to vLLM's weights at ``util`` of a GPU of ``mem`` bytes."""
    kv = model.kv_bytes_per_token_per_gpu(tp) * seq_len
    room = util * mem - weights - VLLM_OVERHEAD_BYTES
    spread = f"TP {tp}" + (f", experts over {ep} ranks" if ep else "")
    fit = max(room, 0) / kv if kv else 0.0
    return [
        f"vLLM memory per GPU: {util:.2f} × {mem / GIB:.1f} GiB = {util * mem / GIB:.1f} GiB − weights "
        f"{weights / GIB:.1f} GiB ({spread}) − {VLLM_OVERHEAD_BYTES / GIB:.1f} GiB CUDA graphs and activations = "
        f"{room / GIB:.2f} GiB for the KV cache",
        f"one {seq_len}-token sequence needs {kv / GIB:.2f} GiB of KV cache per GPU: {fit:.2f} sequences fit, at "
        "least 1 is needed",
        f"the smallest gpu_memory_utilization that holds one: {need:.2f} (with a {VLLM_UTILIZATION_MARGIN:.2f} margin)",
    ]


def memory_fixes(
    model: ModelShape, n: int, mem: int, budget: float, setting: Setting, work: Workload, recipe: Recipe
) -> list[Fix]:
    """Single changes that would make the training side fit, nearest first."""
    b, o, _ = setting
    fixes: list[Fix] = []

    def total(nn: int, bb: DistBackend, oo: Offload, w: Workload) -> float:
        return train_memory(model, nn, bb, oo, w).total

    w_ck = dataclasses.replace(work, gradient_checkpointing=True)
    if recipe.launch.offload != "auto" and total(n, DistBackend.ZERO3, Offload.OPTIMIZER_PARAMS, w_ck) <= budget:
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
