"""The key ledger: where each key of a recipe goes. A key is given to one of TRL's configs (GRPOConfig, or
AsyncGRPOConfig under launch.mode async; ModelConfig), read by the training entry itself (the dataset, the rewards,
the prompt's shaping), read by open-r1's reward functions, or used by no part of the run: then it is named, with the
reason, in one notice (:func:`unused_notice`), never dropped without a word.

What the entry reads is :data:`ENTRY_KEYS`: the script arguments ``train/core.py`` and ``train/data.py`` look up
(``tests/test_key_ledger.py`` checks the list against their source, and walks every key of TRL's GRPOConfig and of
open-r1's five GRPO recipes through :func:`key_use`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from grpo_launch.enums import LaunchMode, VllmMode
from grpo_launch.recipe import async_schema, trl_schema
from grpo_launch.recipe.keys import OPEN_R1_REWARD_KEYS, OPEN_R1_UNUSED, TRAIN_ENTRY_KEYS
from grpo_launch.recipe.launch import LaunchSettings
from grpo_launch.recipe.rewards import is_open_r1_reward, reward_names

# TRL's script arguments the training entry reads (the dataset and the rewards), and its own keys.
ENTRY_KEYS = frozenset(
    {"dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming"}
    | {"reward_funcs", "reward_model_name_or_path"}
    | set(TRAIN_ENTRY_KEYS)
)

VLLM_OFF = "vLLM is off"
SYNC_ONLY = "read only by AsyncGRPOTrainer (launch.mode=async)"
NOT_ASYNC = "AsyncGRPOConfig has no such field (launch.mode=async)"
NO_OPEN_R1_REWARD = "read only by open-r1's reward functions, and no reward of this recipe is open-r1's"
OPEN_R1_ONLY = "read by open-r1's own scripts only (hub revisions, benchmarks, callbacks, W&B settings)"
NOBODY = "read by neither TRL's GRPO configs nor the training entry"


def key_use(key: str, *, asynchronous: bool, vllm_off: bool, open_r1_rewards: bool) -> tuple[str, bool]:
    """(where ``key`` goes, or why it is used by nothing; whether it is used)."""
    if vllm_off and key.startswith("vllm_"):
        return VLLM_OFF, False
    if key in trl_schema.GRPO_CONFIG:
        if asynchronous:
            return (NOT_ASYNC, False) if key in async_schema.GRPO_NOT_ASYNC else ("AsyncGRPOConfig", True)
        return "GRPOConfig", True
    if key in async_schema.ASYNC_ONLY and asynchronous:
        return "AsyncGRPOConfig", True
    if key in trl_schema.MODEL_CONFIG:  # dtype: ModelConfig's in a sync run, AsyncGRPOConfig's in an async one
        return "ModelConfig", True
    if key in async_schema.ASYNC_ONLY:
        return SYNC_ONLY, False
    if key in ENTRY_KEYS:
        return "the training entry", True
    if key in OPEN_R1_REWARD_KEYS:
        return ("open-r1's reward functions", True) if open_r1_rewards else (NO_OPEN_R1_REWARD, False)
    return (OPEN_R1_ONLY if key in OPEN_R1_UNUSED else NOBODY), False


def ledger(
    values: Mapping[str, Any], launch: LaunchSettings, given_launch: Iterable[str] = ()
) -> dict[str, tuple[str, bool]]:
    """Every key the recipe sets (``given_launch``: the launch keys it set) → (where it goes or why nowhere, used)."""
    vllm_off = launch.vllm == VllmMode.OFF or values.get("use_vllm") is False
    asynchronous = launch.mode == LaunchMode.ASYNC
    open_r1 = any(is_open_r1_reward(n) for n in reward_names(values))
    out = {k: key_use(k, asynchronous=asynchronous, vllm_off=vllm_off, open_r1_rewards=open_r1) for k in values}
    for k in given_launch:
        out[f"launch.{k}"] = (VLLM_OFF, False) if vllm_off and k.startswith("vllm_") else ("the launcher", True)
    return out


def unused_notice(values: Mapping[str, Any], launch: LaunchSettings, given_launch: Iterable[str] = ()) -> str | None:
    """One notice naming every key this run uses nowhere, grouped by the reason, or None."""
    by_reason: dict[str, list[str]] = {}
    for key, (where, used) in ledger(values, launch, given_launch).items():
        if not used:
            by_reason.setdefault(where, []).append(key)
    if not by_reason:
        return None
    return "not used by this run: " + "; ".join(f"{', '.join(sorted(k))} ({why})" for why, k in by_reason.items())
