"""Disk the run's saves take, from the plan: one checkpoint and the final model. Pure.

Counted as the Trainer and DeepSpeed write them (transformers ``Trainer._save_checkpoint``; DeepSpeed
``save_checkpoint``), per parameter P, with W the bytes of a weight as trained (2 for DeepSpeed with bf16/fp16
mixed precision, whose module is 16-bit; 4 otherwise: the planner trains float32 weights under DDP and FSDP):

- DDP / FSDP: ``model.safetensors`` W·P and ``optimizer.pt`` the two float32 Adam moments, 8P.
- ZeRO-2: ``model.safetensors`` W·P, DeepSpeed's ``mp_rank_00_model_states.pt`` the module again (W·P), and the
  optimizer partitions: float32 master weights and moments, 12P.
- ZeRO-3: ``model.safetensors`` W·P (gathered) plus the partitions' 12P (the module files hold no weights).
- The final model: W·P. LoRA: the same per trainable (adapter) parameter.

``tests/test_run.py`` compares these with the checkpoints real CPU runs write (float32: W = 4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_launch.enums import DistBackend
from grpo_launch.models.shape import ModelShape

ADAM_MOMENTS = 8  # two float32 moments per parameter
DEEPSPEED_OPTIMIZER = 12  # float32 master weights and the two moments
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


def checkpoint_bytes_per_param(backend: DistBackend, weight: int) -> float:
    """Bytes one checkpoint holds per (trainable) parameter, for weights of ``weight`` bytes."""
    if backend == DistBackend.ZERO2:
        return 2 * weight + DEEPSPEED_OPTIMIZER
    if backend == DistBackend.ZERO3:
        return weight + DEEPSPEED_OPTIMIZER
    return weight + ADAM_MOMENTS


def save_bytes(
    model: ModelShape, backend: DistBackend, values: Mapping[str, Any], *, mixed_precision: str = "no"
) -> tuple[float, float]:
    """(one checkpoint, the final model) in bytes."""
    weight = 2 if backend.is_deepspeed and mixed_precision in ("bf16", "fp16") else 4
    count = lora_params(model, values) if values.get("use_peft") else model.params
    return count * checkpoint_bytes_per_param(backend, weight), count * weight


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
