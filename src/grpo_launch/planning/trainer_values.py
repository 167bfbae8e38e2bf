"""The resolved trainer recipe: the recipe's TRL values with every planned value written in. Pure."""

from __future__ import annotations

from typing import Any

from grpo_launch.enums import Device, DistBackend, VllmMode
from grpo_launch.planning.parallel_and_batch import Layout
from grpo_launch.planning.plan_types import Trace, TrainPlan, VllmPlan
from grpo_launch.recipe import Recipe
from grpo_launch.recipe.keys import PLANNED_KEYS
from grpo_launch.recipe.trl_schema import DEFAULTS as TRL_FIELD_DEFAULTS

# Keys the planner owns in each vLLM mode: the recipe's values are replaced by the plan's.
_SERVER_ONLY_IN_PLAN = (
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_server_host",
    "vllm_server_port",
)
_OFF_DROPPED = ("vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size")
_SERVER_REPLACED = ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout")
_HALF = ("bfloat16", "float16", "bf16", "fp16", "half", "auto")


def _master_weights(out: dict[str, Any], train: TrainPlan, trace: Trace) -> None:
    """The optimizer must update fp32 weights. DeepSpeed ZeRO keeps an fp32 master copy of half-precision weights;
    DDP and FSDP update the weights as loaded, and AdamW on bf16 weights rounds small updates away (at lr 3e-6 almost
    nothing changes). So under DDP and FSDP the model loads in float32 and the forward runs under bf16/fp16 autocast
    (accelerate's mixed_precision). TRL's own default dtype is float32 too; open-r1's recipes ask for bfloat16
    because they run under ZeRO."""
    dtype = out.get("dtype")
    if train.backend.is_deepspeed or dtype is None or str(dtype) not in _HALF:
        return
    if out.get("use_peft"):
        # LoRA trains only the adapters, which PEFT keeps in float32 (autocast_adapter_dtype); the frozen base may
        # stay in half precision.
        return
    out["dtype"] = "float32"
    why = "fp32 on CPU" if train.device == Device.CPU else f"{train.mixed_precision} autocast"
    trace.decide(
        "dtype",
        "float32",
        f"the recipe loads {dtype}, but {train.backend} keeps no fp32 master copy: weights load in float32 "
        f"({why}), so the optimizer's small updates are not rounded away",
    )


def lora_decision(recipe: Recipe, vllm: VllmPlan, trace: Trace) -> None:
    """The Why row of a LoRA run (GRPOTrainer: AsyncGRPOTrainer's adapter sync is async_grpo.lora_rank's): what it
    trains, and how the adapter reaches vLLM. TRL 1.16 merges the adapter into the base weights for each sync and
    sends every base tensor (trl/generation/vllm_generation.py, ``_iter_named_params``: merge_adapter, the weights,
    unmerge_adapter), so the estimate charges the sync as full fine-tuning's."""
    if not recipe.values.get("use_peft"):
        return
    r = recipe.get("lora_r") or TRL_FIELD_DEFAULTS["lora_r"]
    why = f"LoRA rank {r}: the base weights are frozen (no gradients, no optimizer state for them), the adapter trains"
    if vllm.mode != VllmMode.OFF:
        why += (
            "; at each sync TRL merges the adapter into the base weights and sends all of them to vLLM, then "
            "unmerges: the sync moves as many bytes as full fine-tuning's"
        )
    trace.decide("use_peft", True, why)


def trainer_values(
    recipe: Recipe, layout: Layout, vllm: VllmPlan, train: TrainPlan, trace: Trace, *, dense: bool = False
) -> dict[str, Any]:
    """What the training entry reads. ``output_dir`` stays out unless the recipe sets it: the Plan derives the
    default from its run directory, so a plan moved to another run dir writes there."""
    # "auto" on a key the planner chooses means "choose"; elsewhere it is the value TRL takes (dtype: auto).
    out = {k: v for k, v in recipe.values.items() if not (v == "auto" and k in PLANNED_KEYS)}
    if vllm.mode != VllmMode.OFF and vllm.max_prompt_length is not None:
        if not recipe.get("max_prompt_length"):
            trace.notice(
                f"max_prompt_length={vllm.max_prompt_length}: prompts longer than this are dropped before "
                f"generation (vLLM's max length is {vllm.max_model_len}; it rejects longer requests). Set "
                "max_prompt_length to choose."
            )
        out["max_prompt_length"] = vllm.max_prompt_length
    for key in ("generation_batch_size", "steps_per_generation"):
        out.pop(key, None)
    out.update(layout.trl_values())
    if vllm.mode == VllmMode.OFF:
        out["use_vllm"] = False
        for key in _OFF_DROPPED:
            out.pop(key, None)
    elif vllm.mode == VllmMode.SERVER:
        timeout = float(recipe.launch.vllm_health_timeout_s)
        replaced = [k for k in _SERVER_REPLACED if k in out and not (k == "vllm_server_timeout" and out[k] == timeout)]
        if replaced:
            trace.notice(
                f"{', '.join(replaced)}: replaced by the planned server ({vllm.base_url}, health timeout "
                f"launch.vllm_health_timeout_s={recipe.launch.vllm_health_timeout_s:g} s)"
            )
        out.update(
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=vllm.base_url,
            vllm_server_timeout=timeout,
        )
        for key in _SERVER_ONLY_IN_PLAN:
            out.pop(key, None)
    else:
        out.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_tensor_parallel_size=vllm.tensor_parallel_size,
            vllm_gpu_memory_utilization=vllm.gpu_memory_utilization,
            # Unset, vLLM reserves the model's whole context (131072 for Llama-3.1) and may not start.
            vllm_max_model_length=vllm.max_model_len,
            vllm_enable_sleep_mode=vllm.sleep_mode,
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
    _master_weights(out, train, trace)
    if train.backend == DistBackend.DDP and dense and "ddp_find_unused_parameters" not in out:
        # Without checkpointing transformers asks DDP to search for unused parameters after every backward; a dense
        # model has none, and DDP warns about the wasted traversal. (A mixture of experts keeps the search: experts
        # no token was routed to get no gradient.)
        out["ddp_find_unused_parameters"] = False
    if out.get("output_dir") is None:
        out.pop("output_dir", None)
    return out
