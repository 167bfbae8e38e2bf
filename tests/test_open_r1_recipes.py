"""open-r1's five GRPO recipes keep their algorithm on every topology: one generation per optimizer step (they set
gradient_accumulation_steps and leave steps_per_generation to TRL, which makes them equal), their group size and
per-device batch, or a refusal with fixes. Never a silent off-policy layout.

The batch and generation keys of each recipe as published (github.com/huggingface/open-r1, recipes/ at commit
1416fa0), with the model and lengths that size them.
"""

from __future__ import annotations

import pytest

from grpo_launch.errors import PlanError

from .helpers import plan_recipe

OPEN_R1 = {
    "Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml": {
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 16, "max_prompt_length": 512,
        "max_completion_length": 1024},
    "Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml": {
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 14, "max_prompt_length": 1024,
        "max_completion_length": 2048},
    "Qwen2.5-1.5B-Instruct/grpo/config_demo_code_ioi.yaml": {
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 14, "max_prompt_length": 1024,
        "max_completion_length": 2048},
    "DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml": {
        "model_name_or_path": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 16, "max_prompt_length": 512,
        "max_completion_length": 1024, "vllm_gpu_memory_utilization": 0.7},
    "Qwen2.5-Coder-7B-Instruct/grpo/config_codeforces.yaml": {
        "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 32, "num_generations": 16, "max_prompt_length": 2000,
        "max_completion_length": 8192, "vllm_gpu_memory_utilization": 0.7},
}  # fmt: skip
COMMON = {"bf16": True, "gradient_checkpointing": True, "use_vllm": True}
TOPOLOGIES = ("1xH100-80GB", "2xH100-80GB", "4xL20-48GB", "8xH100-80GB", "8xA100-40GB", "2x8xH100-80GB",
              "4x8xH100-80GB")  # fmt: skip


@pytest.mark.parametrize("gpus", TOPOLOGIES)
@pytest.mark.parametrize("name", OPEN_R1)
def test_open_r1_recipe_keeps_one_generation_per_step(name, gpus):
    values = {**COMMON, **OPEN_R1[name]}
    try:
        plan = plan_recipe(values, gpus, model=values["model_name_or_path"])
    except PlanError as exc:
        assert exc.fixes or exc.hint, f"{name} on {gpus} refused without a fix: {exc.render()}"
        return
    layout = plan.layout
    assert layout.steps_per_generation == layout.gradient_accumulation_steps, (name, gpus, layout)
    assert layout.num_generations == values["num_generations"]
    assert layout.per_device_train_batch_size == values["per_device_train_batch_size"]
    assert layout.generation_batch_size == layout.completions_per_optimizer_step


def test_the_demo_code_recipe_plans_on_8_h100_without_a_lag():
    """The issue's case: config_demo_code on 8 × H100 was planned with steps_per_generation 28 against
    gradient_accumulation_steps 4 (one generation for 7 optimizer steps)."""
    values = {**COMMON, **OPEN_R1["Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml"]}
    plan = plan_recipe(values, "8xH100-80GB", model=values["model_name_or_path"])
    assert plan.layout.steps_per_generation == plan.layout.gradient_accumulation_steps
    assert not any("off policy" in n for n in plan.notices)
