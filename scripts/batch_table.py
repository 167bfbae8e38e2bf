"""The batch each shipped recipe and open-r1's five GRPO recipes set, beside the batch the planner plans for them.

    .venv/bin/python scripts/batch_table.py [--gpus 8xH100-80GB --gpus 2x8xH100-80GB]

Prints one markdown table: for each recipe and topology, the recipe's per-device batch, gradient accumulation,
steps per generation and group size (``-``: not set, TRL's default or the planner's choice), the planned ones, the
prompts and completions per optimizer step, the trainer processes, and every value the plan changed (and whether
a notice says so). Planning only: nothing is downloaded (model shapes come from the built-in table) and nothing starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grpo_launch.errors import GrpoLaunchError  # noqa: E402
from grpo_launch.machines.topology import parse_gpu_spec  # noqa: E402
from grpo_launch.models.builtin import find_model_shape  # noqa: E402
from grpo_launch.planning import make_plan  # noqa: E402
from grpo_launch.recipe import build_recipe, load_recipe  # noqa: E402

# open-r1's GRPO recipes as published (github.com/huggingface/open-r1, recipes/ at commit 1416fa0): the batch keys and
# what sizes them (the same values as tests/test_open_r1_recipes.py).
OPEN_R1: dict[str, dict[str, Any]] = {
    "open-r1 Qwen2.5-1.5B config_demo": {
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 16, "max_prompt_length": 512,
        "max_completion_length": 1024},
    "open-r1 Qwen2.5-1.5B config_demo_code": {
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 14, "max_prompt_length": 1024,
        "max_completion_length": 2048},
    "open-r1 Qwen2.5-1.5B config_demo_code_ioi": {
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 14, "max_prompt_length": 1024,
        "max_completion_length": 2048},
    "open-r1 DeepSeek-R1-Distill-Qwen-1.5B config_demo": {
        "model_name_or_path": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4, "num_generations": 16, "max_prompt_length": 512,
        "max_completion_length": 1024, "vllm_gpu_memory_utilization": 0.7},
    "open-r1 Qwen2.5-Coder-7B config_codeforces": {
        "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 32, "num_generations": 16, "max_prompt_length": 2000,
        "max_completion_length": 8192, "vllm_gpu_memory_utilization": 0.7},
}  # fmt: skip
COMMON = {"bf16": True, "gradient_checkpointing": True, "use_vllm": True}
KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_generations")
SHORT = {"per_device_train_batch_size": "pd", "gradient_accumulation_steps": "GA", "steps_per_generation": "spg",
         "num_generations": "k"}  # fmt: skip


def _recipes() -> list[tuple[str, Any]]:
    shipped = [(f"recipes/{p.name}", load_recipe(p, [])) for p in sorted((ROOT / "recipes").glob("*.yaml"))]
    return shipped + [(name, build_recipe({**COMMON, **values}, [])) for name, values in OPEN_R1.items()]


def _cell(values: dict[str, Any]) -> str:
    return " ".join(f"{SHORT[k]} {values.get(k, '-') if values.get(k) is not None else '-'}" for k in KEYS)


def _row(name: str, recipe: Any, gpus: str) -> str:
    asked = {k: recipe.values.get(k) for k in KEYS}
    if "cpu" in name and gpus != "cpu":
        return ""
    try:
        plan = make_plan(parse_gpu_spec(gpus), recipe, find_model_shape(str(recipe.values.get("model_name_or_path"))))
    except GrpoLaunchError as exc:
        return f"| {name} | {gpus} | {_cell(asked)} | refused: {exc.message[:80]} | | | | |"
    layout = plan.layout
    planned = {k: getattr(layout, k) for k in KEYS}
    changed = [f"{SHORT[k]} {asked[k]}→{planned[k]}" for k in KEYS if asked[k] is not None and asked[k] != planned[k]]
    prompts = layout.completions_per_optimizer_step // layout.num_generations
    noticed = [k for k in KEYS if asked[k] is not None and asked[k] != planned[k] and any(k in n for n in plan.notices)]
    said = "" if not changed else (" (in a notice)" if len(noticed) == len(changed) else " (**no notice**)")
    return (
        f"| {name} | {gpus} | {_cell(asked)} | {_cell(planned)} | {prompts} | {layout.completions_per_optimizer_step} "
        f"| {layout.num_processes} | {', '.join(changed) + said if changed else '—'} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", action="append", help="topologies (default: 8xH100-80GB and 2x8xH100-80GB)")
    args = parser.parse_args(argv)
    print("| recipe | GPUs | the recipe sets | planned | prompts/step | completions/step | trainers | changed |")
    print("|---|---|---|---|---:|---:|---:|---|")
    for name, recipe in _recipes():
        for gpus in args.gpus or ["8xH100-80GB", "2x8xH100-80GB"]:
            row = _row(name, recipe, gpus)
            if row:
                print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
