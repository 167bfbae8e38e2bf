"""Issue 50 §1: more GPUs predicted less throughput at a pinned batch. On 8 × 8 H100 with launch.prompts_per_step=16,
qwen7b-math got a server split at 15.3 s per step, while 4 × 8 H100 colocates at 14.4 s: 16 prompts × 8 at 4 per
device keep at most 32 trainers busy, and the search never tried colocating on a subset of the hosts.

Now a fixed batch (pinned or default: decided before the search) that colocating on every host cannot take evenly is
also tried colocated on the most hosts whose trainers take it; the search picks it only where it predicts faster,
and the plan says which GPUs idle, why, and how to use them (neither applied: the batch is the user's).
"""

from __future__ import annotations

import pytest

from grpo_launch.enums import GpuUse

from .helpers import ROOT, plan_recipe

MATH = str(ROOT / "recipes" / "qwen7b-math.yaml")


def _prompts(plan) -> int:
    return plan.layout.completions_per_optimizer_step // plan.layout.num_generations


@pytest.mark.parametrize("prompts", [8, 16, 24])
def test_more_hosts_never_predict_a_slower_step_at_a_pinned_batch(prompts):
    pin = f"launch.prompts_per_step={prompts}"
    four, eight = plan_recipe(MATH, "4x8xH100-80GB", pin), plan_recipe(MATH, "8x8xH100-80GB", pin)
    assert _prompts(four) == _prompts(eight) == prompts  # the same batch: the user's
    assert eight.estimate.step.total_s <= four.estimate.step.total_s + 1e-9, (eight.split, four.split)


def test_64_gpus_colocate_on_4_hosts_and_say_why_the_others_idle():
    pin = "launch.prompts_per_step=16"
    four, eight = plan_recipe(MATH, "4x8xH100-80GB", pin), plan_recipe(MATH, "8x8xH100-80GB", pin)
    assert four.split == "colocate (8 engine(s) × TP 4)" and not any("idle" in n for n in four.notices)
    assert eight.split == "colocate on 4 of 8 hosts (8 engine(s) × TP 4)"
    assert eight.estimate.step.total_s == pytest.approx(four.estimate.step.total_s)
    assert eight.layout == four.layout  # 32 trainers at accumulation 1 on both
    idle = sorted({r.host for r in eight.roles if r.role == GpuUse.IDLE})
    assert idle == ["node4", "node5", "node6", "node7"]
    notice = next(n for n in eight.notices if n.startswith("32 GPUs idle"))
    assert "(node4, node5, node6, node7)" in notice and "keep at most 32 of the 64 GPUs training" in notice
    assert "4 whole host(s) serve" in notice  # the fastest split that uses every GPU, and by how much it loses
    assert "32 is the least that colocating on every host takes evenly" in notice
    assert "the same plan runs on 4 hosts" in notice
    assert next(d for d in eight.decisions if d.what == "idle_gpus").value == 32


def test_a_batch_every_host_can_take_tries_no_subset():
    """The recipe's own batch (its accumulation, on each split's trainers), and a pinned batch that every host's
    trainers take: no split on fewer hosts is compared, so none can change the batch or idle a GPU."""
    for plan in (plan_recipe(MATH, "8x8xH100-80GB"), plan_recipe(MATH, "8x8xH100-80GB", "launch.prompts_per_step=32")):
        assert not any(" of 8 hosts" in c.label for c in plan.candidates), plan.split
        assert not any(r.role == GpuUse.IDLE for r in plan.roles)


def test_without_an_estimate_no_host_is_left_idle():
    plan = plan_recipe(MATH, "8x8xH100-80GB", "launch.prompts_per_step=16", model=None)
    assert " of 8 hosts" not in plan.split and not any(r.role == GpuUse.IDLE for r in plan.roles)


def test_colocate_pinned_on_64_gpus_runs_on_the_hosts_the_batch_can_use():
    """launch.vllm=colocate leaves no split that uses every GPU at 16 prompts (64 trainers cannot take 128
    completions at 4 per device): the most hosts that can take it colocate, and the notice says the rest idle."""
    plan = plan_recipe(MATH, "8x8xH100-80GB", "launch.prompts_per_step=16", "launch.vllm=colocate")
    assert plan.split == "colocate on 4 of 8 hosts (8 engine(s) × TP 4)" and _prompts(plan) == 16
    notice = next(n for n in plan.notices if n.startswith("32 GPUs idle"))
    assert "no split that uses every GPU plans" in notice
