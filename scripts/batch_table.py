"""The batch each shipped recipe and open-r1's five GRPO recipes set, beside the batch the planner plans for them.

    .venv/bin/python scripts/batch_table.py [--gpus 8xH100-80GB --gpus 2x8xH100-80GB]

Prints one markdown table: for each recipe and topology, the recipe's per-device batch, gradient accumulation,
steps per generation and group size (``-``: not set, TRL's default or the planner's choice), the planned ones, the
prompts and completions per optimizer step, the trainer processes, and every value the plan changed (and whether
a notice says so). Planning only: nothing is downloaded (model shapes come from the built-in table) and nothing starts.
"""

from __future__ import annotations

import argparse
import json
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

# open-r1's five GRPO recipes as published, whole (tests/golden/open_r1_grpo_recipes.json names the commit).
OPEN_R1 = ROOT / "tests" / "golden" / "open_r1_grpo_recipes.json"
KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_generations")
SHORT = {"per_device_train_batch_size": "pd", "gradient_accumulation_steps": "GA", "steps_per_generation": "spg",
         "num_generations": "k"}  # fmt: skip


def _recipes() -> list[tuple[str, Any]]:
    shipped = [(f"recipes/{p.name}", load_recipe(p, [])) for p in sorted((ROOT / "recipes").glob("*.yaml"))]
    published = json.loads(OPEN_R1.read_text())["recipes"]
    return shipped + [(f"open-r1 {path}", build_recipe(values, [])) for path, values in published.items()]


def _cell(values: dict[str, Any], pinned: int | None = None) -> str:
    cell = " ".join(f"{SHORT[k]} {values.get(k, '-') if values.get(k) is not None else '-'}" for k in KEYS)
    return cell + (f" prompts_per_step {pinned}" if pinned is not None else "")


def _row(name: str, recipe: Any, gpus: str) -> str:
    asked = {k: recipe.values.get(k) for k in KEYS}
    pinned = recipe.launch.prompts_per_step
    if "cpu" in name and gpus != "cpu":
        return ""
    try:
        plan = make_plan(parse_gpu_spec(gpus), recipe, find_model_shape(str(recipe.values.get("model_name_or_path"))))
    except GrpoLaunchError as exc:
        return f"| {name} | {gpus} | {_cell(asked, pinned)} | refused: {exc.message[:80]} | | | | |"
    layout = plan.layout
    planned = {k: getattr(layout, k) for k in KEYS}
    changed = [f"{SHORT[k]} {asked[k]}→{planned[k]}" for k in KEYS if asked[k] is not None and asked[k] != planned[k]]
    prompts = layout.completions_per_optimizer_step // layout.num_generations
    noticed = [k for k in KEYS if asked[k] is not None and asked[k] != planned[k] and any(k in n for n in plan.notices)]
    said = "" if not changed else (" (in a notice)" if len(noticed) == len(changed) else " (**no notice**)")
    completions = layout.completions_per_optimizer_step
    return (
        f"| {name} | {gpus} | {_cell(asked, pinned)} | {_cell(planned)} | {prompts} | {completions} "
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
