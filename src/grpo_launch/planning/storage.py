"""Disk the run's saves take, from the plan: one checkpoint and the final model. Pure.

Counted as the Trainer and DeepSpeed write them (transformers ``Trainer._save_checkpoint``; DeepSpeed
``save_checkpoint``), per parameter P:

- DDP / FSDP: the planner trains float32 weights, so ``model.safetensors`` holds 4P and ``optimizer.pt`` the two
  float32 Adam moments, 8P: 12P; the final model 4P.
- ZeRO-2: ``model.safetensors`` 2P (bf16), DeepSpeed's ``mp_rank_00_model_states.pt`` the bf16 module again (2P),
  and the optimizer partitions float32 master weights and moments (12P): 16P; the final model 2P.
- ZeRO-3: ``model.safetensors`` 2P (gathered 16-bit) plus the partitions' 12P (the module file holds no weights):
  14P; the final model 2P.
- LoRA: only the adapters and their optimizer state, as above per trainable parameter.

``tests/test_run.py`` compares these with the checkpoints real CPU runs write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_launch.enums import DistBackend
from grpo_launch.modelshape import ModelShape

CHECKPOINT_BYTES_PER_PARAM = {DistBackend.DDP: 12, DistBackend.FSDP: 12, DistBackend.ZERO2: 16, DistBackend.ZERO3: 14}
FINAL_BYTES_PER_PARAM = {DistBackend.DDP: 4, DistBackend.FSDP: 4, DistBackend.ZERO2: 2, DistBackend.ZERO3: 2}
LORA_TARGETS_DEFAULT = 2  # PEFT's default for Qwen/Llama-style models: q_proj and v_proj
ALL_LINEAR_TARGETS = 7  # q, k, v, o, gate, up, down


def lora_params(model: ModelShape, values: Mapping[str, Any]) -> float:
    """Trainable adapter parameters: r × (in + out) per targeted projection per layer (hidden × hidden taken for
    each, an approximation that errs large for the k/v projections of grouped-query attention)."""
    r = int(values.get("lora_r") or 16)
    targets = values.get("lora_target_modules")
    if targets == "all-linear":
        count = ALL_LINEAR_TARGETS
    elif isinstance(targets, (list, tuple)):
        count = len(targets)
    else:
        count = LORA_TARGETS_DEFAULT
    return float(model.layers * count * r * 2 * model.hidden)


def save_bytes(model: ModelShape, backend: DistBackend, values: Mapping[str, Any]) -> tuple[float, float]:
    """(one checkpoint, the final model) in bytes."""
    if values.get("use_peft"):
        trainable = lora_params(model, values)
        return trainable * CHECKPOINT_BYTES_PER_PARAM[backend], trainable * FINAL_BYTES_PER_PARAM[backend]
    return model.params * CHECKPOINT_BYTES_PER_PARAM[backend], model.params * FINAL_BYTES_PER_PARAM[backend]


def checkpoints_kept(values: Mapping[str, Any], max_steps: int | None) -> int | None:
    """How many checkpoints exist at once at most: ``save_total_limit`` (+1 while the Trainer writes a new one
    before deleting the oldest), else every save of the run; None when unknown (no step count)."""
    if values.get("save_strategy", "steps") == "no":
        return 0
    limit = values.get("save_total_limit")
    every = values.get("save_steps") or 500
    saves = None
    if isinstance(every, (int, float)) and 0 < every < 1:  # a fraction of the run (the Trainer's float form)
        saves = int(1 / every)
    elif max_steps and max_steps > 0 and isinstance(every, (int, float)) and every >= 1:
        saves = int(max_steps // every)
    if isinstance(limit, int) and limit > 0:
        return min(limit + 1, saves) if saves is not None else limit + 1
    return saves
