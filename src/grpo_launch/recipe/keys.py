"""The keys a recipe may hold: TRL's (generated into :mod:`grpo_launch.recipe.trl_schema`), the training entry's own and
open-r1's extras, with the value checks that apply to them."""

from __future__ import annotations

from grpo_launch.recipe import async_schema, open_r1_schema, trl_schema

# Keys grpo-launch's training entry (python -m grpo_launch.train) reads itself, beyond TRL's script arguments.
TRAIN_ENTRY_KEYS: dict[str, str] = {
    "max_prompt_length": "int?",  # removed from GRPOConfig in TRL 0.26; the train entry truncates prompts
    "dataset_prompt_column": "str",
    "dataset_answer_column": "str?",
    "system_prompt": "str?",
    "chat_template": "str?",
    "reward_kwargs": "dict?",
}

_TRL_AND_ENTRY = {
    **trl_schema.GRPO_CONFIG,
    **trl_schema.MODEL_CONFIG,
    **trl_schema.SCRIPT_ARGUMENTS,
    **TRAIN_ENTRY_KEYS,
    **async_schema.ASYNC_ONLY,  # AsyncGRPOConfig's own keys (launch.mode async; ignored by a sync run)
}
# open-r1's own GRPOConfig / script-argument fields beyond TRL's, generated from its dataclasses
# (scripts/gen_open_r1_schema.py). Accepted so an open-r1 recipe runs unmodified.
OPEN_R1_KEYS: dict[str, str] = {k: v for k, v in open_r1_schema.OPEN_R1_FIELDS.items() if k not in _TRL_AND_ENTRY}
# The ones only open-r1's reward functions read (open_r1.rewards.get_reward_funcs): used when a reward resolves
# through open-r1's registry.
OPEN_R1_REWARD_KEYS = frozenset(
    k for k in OPEN_R1_KEYS if k.startswith(("cosine_", "repetition_", "code_", "parallel_code", "e2b_", "morph_"))
) | {"ioi_provider", "max_completion_len", "soft_punish_cache"}
# Read by neither the training entry nor a reward: listed in a notice rather than dropped silently.
OPEN_R1_UNUSED = frozenset(
    {"benchmarks", "callbacks", "hub_model_revision", "overwrite_hub_revision", "push_to_hub_revision"}
    | {"wandb_log_unique_prompts", "wandb_entity", "wandb_project", "wandb_run_group"}
)

RECIPE_KEYS: dict[str, str] = {**_TRL_AND_ENTRY, **OPEN_R1_KEYS}

# Values that must be positive integers when given (the planner fills them when absent or "auto").
POSITIVE_INT_KEYS = frozenset(
    {
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "generation_batch_size",
        "num_generations",
        "num_generations_eval",
        "max_completion_length",
        "max_prompt_length",
        "vllm_tensor_parallel_size",
        "vllm_max_model_length",
        "num_iterations",
    }
)
# Keys the planner may choose; "auto" is accepted for them.
PLANNED_KEYS = frozenset(
    {
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "num_generations",
        "vllm_tensor_parallel_size",
        "vllm_mode",
        "use_vllm",
        "vllm_gpu_memory_utilization",
        "gradient_checkpointing",
    }
)
