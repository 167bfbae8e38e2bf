"""The keys a recipe may hold: TRL's (generated into :mod:`grpo_launch.recipe.trl_schema`), the training entry's own and
open-r1's extras, with the value checks that apply to them."""

from __future__ import annotations

from grpo_launch.recipe import trl_schema

# Keys grpo-launch's training entry (python -m grpo_launch.train) reads itself, beyond TRL's script arguments.
TRAIN_ENTRY_KEYS: dict[str, str] = {
    "max_prompt_length": "int?",  # removed from GRPOConfig in TRL 0.26; the train entry truncates prompts
    "dataset_prompt_column": "str",
    "dataset_answer_column": "str?",
    "system_prompt": "str?",
    "chat_template": "str?",
    "reward_kwargs": "dict?",
}

# open-r1's own GRPOConfig / script-argument extras. Accepted so an open-r1 recipe runs unmodified; the ones the
# train entry does not use are listed in a notice rather than dropped silently.
OPEN_R1_KEYS: dict[str, str] = {
    "benchmarks": "list",
    "callbacks": "list",
    "hub_model_revision": "str?",
    "overwrite_hub_revision": "bool",
    "push_to_hub_revision": "bool",
    "wandb_entity": "str?",
    "wandb_project": "str?",
    "wandb_run_group": "str?",
    "cosine_min_value_wrong": "float",
    "cosine_max_value_wrong": "float",
    "cosine_min_value_correct": "float",
    "cosine_max_value_correct": "float",
    "cosine_max_len": "int",
    "repetition_n_grams": "int",
    "repetition_max_penalty": "float",
    "code_language": "str",
    "code_eval_test_batch_size": "int",
    "parallel_code_exec_per_proc": "int",
    "e2b_router_url": "str?",
    "morph_router_url": "str?",
    "code_provider": "str?",
    "ioi_provider": "str?",
}
OPEN_R1_UNUSED = frozenset(
    {"benchmarks", "callbacks", "hub_model_revision", "overwrite_hub_revision", "push_to_hub_revision"}
    | {k for k in OPEN_R1_KEYS if k.startswith(("code_", "parallel_code", "e2b_", "morph_", "ioi_"))}
)

RECIPE_KEYS: dict[str, str] = {
    **trl_schema.GRPO_CONFIG,
    **trl_schema.MODEL_CONFIG,
    **trl_schema.SCRIPT_ARGUMENTS,
    **TRAIN_ENTRY_KEYS,
    **OPEN_R1_KEYS,
}

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
