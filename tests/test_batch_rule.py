"""The batch is the user's algorithm (issue 36; DESIGN.md, "The batch rule"): the real planner, TRL's GRPOConfig as
the oracle of every layout checked.

- a recipe that sets its batch keeps it on every split (splits with fewer trainers run a smaller batch, compared per
  completion);
- ``launch.prompts_per_step`` pins the global batch; a GA it changes is said in a notice;
- a free recipe gets one default batch that does not depend on the splits compared;
- every value the recipe set is in the plan unchanged or named in a notice;
- ``sbatch``, ``sky`` and ``ray-submit`` pin the planned batch into what they submit.
"""

from __future__ import annotations

import json

import pytest

from grpo_launch.cli import main
from grpo_launch.errors import PlanError
from grpo_launch.recipe import load_recipe

from .helpers import ROOT, plan_recipe
from .trl_oracle import grpo_config

QWEN = str(ROOT / "recipes" / "qwen1.5b.yaml")
PUBLISHED = json.loads((ROOT / "tests" / "golden" / "open_r1_grpo_recipes.json").read_text())["recipes"]
KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_generations",
        "generation_batch_size")  # fmt: skip


def _open_r1(name: str, tmp_path, **extra):
    import yaml

    path = tmp_path / name.replace("/", "_")
    path.write_text(yaml.safe_dump({**PUBLISHED[name], **extra}))
    return load_recipe(str(path))


def _prompts(plan) -> int:
    return plan.layout.completions_per_optimizer_step // plan.layout.num_generations


def _trl_accepts(plan) -> None:
    grpo_config({k: v for k, v in plan.layout.trl_values().items()}, plan.layout.num_processes)


def test_the_default_batch_does_not_move_when_a_pinned_tp_size_changes():
    """qwen1.5b with its batch left free (gradient_accumulation_steps=auto) on 8 × H100: colocated at TP 1, 2, 4 and
    unpinned, the same prompts per step: the default batch (TRL's 1 per device on all 8 GPUs, rounded up to a
    whole group of 8) depends on the recipe and the topology only."""
    free = "gradient_accumulation_steps=auto"
    plans = [plan_recipe(QWEN, "8xH100-80GB", free, "launch.vllm=colocate", f"launch.vllm_tensor_parallel_size={tp}")
             for tp in (1, 2, 4)] + [plan_recipe(QWEN, "8xH100-80GB", free)]  # fmt: skip
    assert {_prompts(p) for p in plans} == {1}
    for p in plans:
        _trl_accepts(p)
        (why,) = [d.why for d in p.decisions if d.what == "prompts_per_step"]
        assert why.startswith("the default batch:") and "lcm(8, 8)" in why


def test_llama70b_on_l40s_keeps_its_accumulation():
    plan = plan_recipe(str(ROOT / "recipes" / "llama70b.yaml"), "4x8xL40S-48GB")
    lay = plan.layout
    assert lay.gradient_accumulation_steps == 8 and lay.per_device_train_batch_size == 1
    _trl_accepts(plan)


def test_open_r1_codeforces_keeps_ga_32_on_two_nodes(tmp_path):
    plan = plan_recipe(_open_r1("Qwen2.5-Coder-7B-Instruct/grpo/config_codeforces.yaml", tmp_path), "2x8xH100-80GB")
    lay = plan.layout
    assert (lay.per_device_train_batch_size, lay.gradient_accumulation_steps, lay.num_generations) == (4, 32, 16)
    assert lay.completions_per_optimizer_step == 4 * lay.num_processes * 32  # TRL's batch on the chosen trainers
    _trl_accepts(plan)


def test_a_group_of_seven_is_not_inflated():
    """num_generations=7 with 3 per device on 4 × L20: the recipe's batch is kept (TRL's 3 × trainers × GA, the
    accumulation the least that fills whole groups), not grown to suit a comparison."""
    plan = plan_recipe(QWEN, "4xL20-48GB", "num_generations=7", "per_device_train_batch_size=3",
                       "gradient_accumulation_steps=7")  # fmt: skip
    lay = plan.layout
    assert (lay.per_device_train_batch_size, lay.gradient_accumulation_steps) == (3, 7)
    assert lay.completions_per_optimizer_step == 3 * lay.num_processes * 7
    _trl_accepts(plan)
    free = plan_recipe(QWEN, "4xL20-48GB", "num_generations=7", "per_device_train_batch_size=3",
                       "gradient_accumulation_steps=auto")  # fmt: skip
    assert free.layout.completions_per_optimizer_step == 3 * 4 * 7  # the default: lcm(3 × 4 GPUs, 7) = 84
    _trl_accepts(free)


def test_open_r1_demo_pinned_at_open_r1s_own_batch(tmp_path):
    """open-r1's README trains config_demo.yaml with `accelerate launch ... --num_processes=7` (one node: 1 GPU for
    vLLM, 7 trainers): 16 per device × 7 × 4 accumulation ÷ 16 per prompt = 28 prompts per step. Pinned there on
    2 × 8 H100, the plan runs exactly that batch (on any split whose trainers take it) and names the setting."""
    recipe = _open_r1("Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml", tmp_path, launch={"prompts_per_step": 28})
    plan = plan_recipe(recipe, "2x8xH100-80GB")
    assert plan.layout.completions_per_optimizer_step == 28 * 16
    assert plan.layout.per_device_train_batch_size == 16
    (decision,) = [d for d in plan.decisions if d.what == "prompts_per_step"]
    assert decision.value == 28 and "launch.prompts_per_step=28" in decision.why
    if plan.layout.gradient_accumulation_steps != 4:
        assert any("gradient_accumulation_steps 4 (the recipe's) →" in n and "launch.prompts_per_step=28" in n
                   for n in plan.notices)  # fmt: skip
    _trl_accepts(plan)
    for c in plan.candidates:  # no split ran another batch
        assert c.rejected or c.prompts_per_step == 28


def test_a_pinned_batch_a_split_cannot_take_is_refused_not_moved():
    """9 prompts of 8 at 8 per device over 8 colocated trainers: 9 completions each, not a whole per-device batch.
    The plan refuses with the reason and the nearest batches the trainers take (never planned at another)."""
    with pytest.raises(PlanError) as exc:
        plan_recipe(QWEN, "8xH100-80GB", "launch.vllm=colocate", "per_device_train_batch_size=8",
                    "launch.prompts_per_step=9")  # fmt: skip
    assert "72 completions over 8 processes are 9 each" in str(exc.value)
    fixes = {(f.setting, f.value) for f in exc.value.fixes}
    assert {("launch.prompts_per_step", 8), ("launch.prompts_per_step", 16)} <= fixes


RECIPES = [*(str(p) for p in sorted((ROOT / "recipes").glob("*.yaml")) if "cpu" not in p.name), *sorted(PUBLISHED)]


@pytest.mark.parametrize("gpus", ["8xH100-80GB", "2x8xH100-80GB", "4xL20-48GB"])
@pytest.mark.parametrize("name", RECIPES)
def test_every_batch_value_the_recipe_sets_is_kept_or_named_in_a_notice(name, gpus, tmp_path):
    recipe = load_recipe(name) if name.startswith("/") else _open_r1(name, tmp_path)
    try:
        plan = plan_recipe(recipe, gpus)
    except PlanError:
        return  # refused (memory): nothing planned, nothing changed
    planned = plan.layout.trl_values() | {"steps_per_generation": plan.layout.steps_per_generation,
                                          "generation_batch_size": plan.layout.generation_batch_size}  # fmt: skip
    for key in KEYS:
        asked = recipe.values.get(key)
        if asked is None or asked == "auto":
            continue
        assert planned[key] == asked or any(key in n for n in plan.notices), (key, asked, planned[key])
    _trl_accepts(plan)


# qwen1.5b sets its own batch (gradient_accumulation_steps: 8): pinned as its values, so the job plans by the same
# rule (issue 50: a prompts-per-step pin let the allocation's split change the accumulation).
PINS = "gradient_accumulation_steps=8 num_generations=8 per_device_train_batch_size=1"


def test_sbatch_and_sky_dry_runs_carry_the_pinned_batch(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["sbatch", QWEN, "--nodes", "2", "--gpus-per-node", "8", "--gpu-type", "H100-80GB", "--dry-run"],
                environ={}) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"{QWEN} {PINS} --run-dir" in out and f"# batch pinned: {PINS}" in out
    assert main(["sky", QWEN, "--accelerators", "H100:8", "--nodes", "2", "--dry-run"], environ={}) == 0
    out = capsys.readouterr().out
    assert f"recipes/qwen1.5b.yaml {PINS} --run-dir" in out and f"# batch pinned: {PINS}" in out


def test_ray_submit_dry_run_carries_the_pinned_batch(capsys, monkeypatch):
    """The cluster's topology is given (a fake: probing it needs a live Ray cluster of GPUs); the rest is real."""
    from grpo_launch.backends.ray.submit import RaySubmitter
    from grpo_launch.machines.topology import parse_gpu_spec

    monkeypatch.setattr(RaySubmitter, "requested_topology", classmethod(lambda cls, o, local: parse_gpu_spec(
        "2x8xH100-80GB")))  # fmt: skip
    assert main(["ray-submit", QWEN, "--ray", "10.0.0.1:6379", "--dry-run"], environ={}) == 0
    out = capsys.readouterr().out
    assert f"{QWEN} {PINS} --run-dir" in out and f"# batch pinned: {PINS}" in out


def test_two_pins_of_the_batch_are_refused_with_both_fixes():
    with pytest.raises(PlanError, match=r"launch\.prompts_per_step and generation_batch_size both pin") as exc:
        plan_recipe(QWEN, "8xH100-80GB", "launch.prompts_per_step=8", "generation_batch_size=64")
    assert {f.setting for f in exc.value.fixes} == {"generation_batch_size", "launch.prompts_per_step"}
