"""Keys of TRL 1.16's ``AsyncGRPOConfig`` (trl/experimental/async_grpo/async_grpo_config.py) against GRPOConfig's,
for launch.mode async. Written from TRL 1.16.0's dataclasses; tests/test_async_grpo.py recomputes both sets from
the installed TRL and fails when they drift.
"""

from __future__ import annotations

from typing import Any

# AsyncGRPOConfig's own fields (async_grpo_config.py:171-394), with their kinds and defaults.
ASYNC_ONLY: dict[str, str] = {
    "dtype": "str",
    "fork_threshold_tokens": "int",
    "heartbeat_stale_after_s": "float",
    "max_inflight_tasks": "int",
    "max_staleness": "int",
    "queue_maxsize": "int",
    "request_timeout": "int",
    "token_budget": "int?",
    "weight_sync_steps": "int",
    "weight_sync_timeout": "int",
}
ASYNC_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",  # async_grpo_config.py:178-186
    "max_completion_length": 2048,  # async_grpo_config.py:237 (GRPOConfig's is 512)
    "max_inflight_tasks": -1,  # async_grpo_config.py:350: -1 = max_staleness × samples per step
    "max_staleness": 4,  # async_grpo_config.py:360
    "queue_maxsize": 1024,  # async_grpo_config.py:367
    "weight_sync_steps": 1,  # async_grpo_config.py:371
    "token_budget": None,  # async_grpo_config.py:335: None = the server's max_model_len
}

# GRPOConfig fields AsyncGRPOConfig does not have: AsyncGRPOConfig(**values) raises TypeError on any of them.
GRPO_NOT_ASYNC: frozenset[str] = frozenset(
    {
        "beta",
        "cache_implementation",
        "cast_lm_head_to_fp32",
        "delta",
        "disable_dropout",
        "ds3_gather_for_generation",
        "entropy_coef",
        "entropy_coef_delta",
        "entropy_coef_max",
        "entropy_coef_min",
        "entropy_target",
        "generation_batch_size",
        "generation_kwargs",
        "importance_sampling_level",
        "log_completions_hub_repo",
        "log_multimodal",
        "log_unique_prompts",
        "loss_type",
        "mask_truncated_completions",
        "multi_objective_aggregation",
        "num_generations_eval",
        "num_iterations",
        "off_policy_mask_threshold",
        "pad_to_multiple_of",
        "ref_model_mixup_alpha",
        "ref_model_sync_steps",
        "reward_weights",
        "sapo_temperature_neg",
        "sapo_temperature_pos",
        "scale_rewards",
        "shuffle_dataset",
        "steps_per_generation",
        "sync_ref_model",
        "top_entropy_quantile",
        "transformers_continuous_batching_config",
        "use_adaptive_entropy",
        "use_bias_correction_kl",
        "use_transformers_continuous_batching",
        "use_transformers_paged",
        "use_vllm",
        "vespo_k_neg",
        "vespo_k_pos",
        "vespo_lambda_neg",
        "vespo_lambda_pos",
        "vllm_enable_sleep_mode",
        "vllm_gpu_memory_utilization",
        "vllm_group_port",
        "vllm_importance_sampling_cap",
        "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "vllm_max_model_length",
        "vllm_mode",
        "vllm_model_impl",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_structured_outputs_regex",
        "vllm_tensor_parallel_size",
    }
)

# Of those, the ones whose value changes the algorithm when it is not TRL's sync default: AsyncGRPOTrainer has no
# reference model (async_grpo_trainer.py:1174-1175), no multi-iteration updates, no reward weights (rewards are
# summed, async_grpo_trainer.py:956-957). Anything else in GRPO_NOT_ASYNC is a sync-only knob (vLLM placement,
# generation rhythm) the async plan replaces.
ALGORITHM_KEYS: dict[str, Any] = {
    "beta": 0.0,
    "num_iterations": 1,
    "loss_type": "dapo",
    "importance_sampling_level": "token",
    "scale_rewards": "group",
    "mask_truncated_completions": False,
    "delta": None,
    "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0,
    "sync_ref_model": False,
}
