"""Issue 50 §1: ``sbatch`` without ``--gpu-type`` changed the recipe's accumulation. The submission pinned the
prompts per step of the split it planned without the GPU model (a server on one host: 8 trainers, 16 prompts),
and the job, which found 16 trainers on the real H100s, ran that pin at accumulation 2 instead of the recipe's 4.

The batch the job plans in its allocation is the recipe's, by the same rule as at submission: a recipe that sets its
own batch (gradient_accumulation_steps, steps_per_generation or generation_batch_size) is pinned as those values,
never as a prompts per step, so the job's plan on the same GPUs is the submission's plan; without the GPU model a
notice says the split (and with it the global batch) is the allocation's to choose.
"""

from __future__ import annotations

import shlex

import pytest

from grpo_launch.cli import main

from .helpers import ROOT, plan_recipe

ENV = {"HF_HUB_OFFLINE": "1"}


def _submit(capsys, recipe: str, *args: str) -> tuple[list[str], str]:
    """``sbatch --dry-run``: the overrides the job's command carries (after the recipe), and everything printed."""
    assert main(["sbatch", recipe, *args, "--dry-run"], environ=dict(ENV)) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("exec "))
    argv = shlex.split(line)
    start = argv.index("--slurm") + 2
    return argv[start : argv.index("--run-dir")], out


def _layout(plan) -> tuple[int, int, int, int]:
    lay = plan.layout
    return (lay.num_processes, lay.per_device_train_batch_size, lay.gradient_accumulation_steps,
            lay.completions_per_optimizer_step)  # fmt: skip


def test_sbatch_without_gpu_type_keeps_the_recipes_accumulation_on_the_allocation(capsys, monkeypatch):
    """The README's qwen7b-math example: the job on a real 2 × 8 H100 allocation runs accumulation 4 (the recipe's)
    and 32 prompts per step, the plan `grpo-launch run` makes on those GPUs; before, 16 prompts at accumulation 2."""
    monkeypatch.chdir(ROOT)
    pins, out = _submit(capsys, "recipes/qwen7b-math.yaml", "--nodes", "2", "--gpus-per-node", "8")
    assert not any(p.startswith("launch.prompts_per_step=") for p in pins), pins
    assert "gradient_accumulation_steps=4" in pins and "per_device_train_batch_size=4" in pins
    job = plan_recipe("recipes/qwen7b-math.yaml", "2x8xH100-80GB", *pins)  # what the job plans in its allocation
    assert job.layout.gradient_accumulation_steps == 4 and job.layout.per_device_train_batch_size == 4
    assert _layout(job) == _layout(plan_recipe("recipes/qwen7b-math.yaml", "2x8xH100-80GB"))
    assert job.layout.completions_per_optimizer_step // job.layout.num_generations == 32
    assert not any("gradient_accumulation_steps 4 (the recipe's)" in n for n in job.notices)
    # The submission says that its split is a default and that the job's may differ, keeping the recipe's values.
    notice = next(x for x in out.splitlines() if x.startswith("# notice: the GPU model is unknown"))
    assert "the recipe's values are kept on every split" in notice and "--gpu-type H100-80GB)" in notice
    assert "# batch pinned: gradient_accumulation_steps=4 num_generations=8 per_device_train_batch_size=4" in out


CASES = [
    ("qwen7b-math", 2, "H100-80GB"),
    ("qwen1.5b", 2, "H100-80GB"),
    ("llama70b", 4, "L40S-48GB"),
    # Before: the pin (40 prompts, from 20 trainers at accumulation 4) let the job's search at that pinned batch pick
    # another split, 16 trainers at accumulation 5, on the very GPUs the submission planned for.
    ("qwen3-30b-a3b", 4, "L40S-48GB"),
]


@pytest.mark.parametrize(("name", "nodes", "gpu"), CASES)
def test_the_job_plans_the_submissions_batch_on_the_same_gpus(name, nodes, gpu, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    recipe = f"recipes/{name}.yaml"
    pins, out = _submit(capsys, recipe, "--nodes", str(nodes), "--gpus-per-node", "8", "--gpu-type", gpu)
    submitted = plan_recipe(recipe, f"{nodes}x8x{gpu}")
    job = plan_recipe(recipe, f"{nodes}x8x{gpu}", *pins)
    assert _layout(job) == _layout(submitted) and job.split == submitted.split
    asked = plan_recipe(recipe, f"{nodes}x8x{gpu}").recipe.values["gradient_accumulation_steps"]
    assert job.layout.gradient_accumulation_steps == asked
    assert "the GPU model is unknown" not in out


def test_a_recipe_with_its_own_generation_batch_is_not_refused_in_the_allocation(capsys, monkeypatch):
    """Before: the pin added launch.prompts_per_step beside the recipe's generation_batch_size, which the job's
    planner refuses ("both pin the batch") after the queue wait."""
    monkeypatch.chdir(ROOT)
    recipe, overrides = "recipes/qwen1.5b.yaml", ["generation_batch_size=256"]
    args = ["--nodes", "2", "--gpus-per-node", "8", "--gpu-type", "H100-80GB"]
    pins, _ = _submit(capsys, recipe, *overrides, *args)
    assert "generation_batch_size=256" in pins and not any(p.startswith("launch.prompts_per_step") for p in pins)
    job = plan_recipe(recipe, "2x8xH100-80GB", *pins)
    assert job.layout.generation_batch_size == 256
    assert _layout(job) == _layout(plan_recipe(recipe, "2x8xH100-80GB", *overrides))


def test_a_pinned_batch_is_still_pinned_as_prompts_per_step(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    pins, _ = _submit(capsys, "recipes/qwen7b-math.yaml", "launch.prompts_per_step=16", "--nodes", "2",
                      "--gpus-per-node", "8")  # fmt: skip
    assert "launch.prompts_per_step=16" in pins and "num_generations=8" in pins
