"""What follows an attempt (planning/after_run/): the course of launch.adapt's re-splits from layout to layout
(resplit.py) and the more frugal plan after an out-of-memory failure (oom.py), with the real planner on real
recipes. The decision itself is tests/test_adapt.py's; a run that moves is tests/test_adapt_run.py's."""

from __future__ import annotations

import pytest

from grpo_launch.enums import AdaptAction, DistBackend, Offload
from grpo_launch.planning.adapt_terms import warmup_steps
from grpo_launch.planning.after_run.adapt import Adaptation, Course, decision_due, split_key
from grpo_launch.planning.after_run.oom import next_frugal_plan
from grpo_launch.planning.cost.workload import Calibration

from .helpers import ROOT, plan_recipe

QWEN7B = ROOT / "recipes" / "qwen7b-math.yaml"
QWEN15B = ROOT / "recipes" / "qwen1.5b.yaml"


def two_splits(tmp_path):
    one = plan_recipe(QWEN7B, "8xH100-80GB", "launch.vllm=server", "launch.vllm_gpus=1", run_dir=tmp_path / "a")
    two = plan_recipe(QWEN7B, "8xH100-80GB", "launch.vllm=server", "launch.vllm_gpus=2", run_dir=tmp_path / "b")
    assert split_key(one) != split_key(two)
    return one, two


def move(action: AdaptAction, running, to, measured_s: float = 2.0) -> Adaptation:
    return Adaptation(action, "test", at_step=5, split=split_key(running), measured_s=measured_s,
                      new_split=split_key(to), plan=to)  # fmt: skip


def test_a_resplit_counts_and_remembers_what_it_replaced_and_a_revert_forgets_it(tmp_path):
    one, two = two_splits(tmp_path)
    course = Course().starting(one)
    assert course.tried == (split_key(one),) and course.starting(one) == course  # a split is tried once
    course, resumed = course.after(one, move(AdaptAction.RESPLIT, one, two))
    assert resumed is two and course.resplits == 1
    assert course.previous is not None and course.previous.plan is one and course.previous.measured_s == 2.0
    course = course.starting(two)
    assert course.tried == (split_key(one), split_key(two))
    course, resumed = course.after(two, move(AdaptAction.REVERT, two, one))
    assert resumed is one and course.resplits == 1 and course.previous is None  # a revert is not a re-split


def test_a_keep_moves_nowhere(tmp_path):
    one, _ = two_splits(tmp_path)
    with pytest.raises(ValueError, match="keep decision has no plan"):
        Course().after(one, Adaptation(AdaptAction.KEEP, "same split", at_step=5, split=split_key(one), measured_s=1.0))


def test_the_decision_is_due_after_the_first_step_and_the_warmup(tmp_path):
    one, _ = two_splits(tmp_path)
    due = warmup_steps(one) + 1
    assert not decision_due(one, due - 1) and decision_due(one, due)


def test_after_an_oom_each_next_plan_is_one_step_more_frugal_and_plans():
    """Training side, in the module's order, each one change from the plan before and each planned: gradient
    checkpointing, ZeRO-3, then optimizer and parameter offload (a per-device batch of 1 has no half);
    tests/test_healing.py applies the first on a real run."""
    plan = plan_recipe(QWEN15B, "8xH100-80GB", "gradient_checkpointing=false")
    assert plan.train.backend == DistBackend.DDP and plan.layout.per_device_train_batch_size == 1
    said, found = [], next_frugal_plan(plan, vllm_side=False)
    while found is not None:
        plan, why = found
        said.append(why.split(" (")[0])
        found = next_frugal_plan(plan, vllm_side=False)
    zero3 = "launch.backend=zero3"
    assert said == ["gradient_checkpointing=true", zero3, f"{zero3} launch.offload=optimizer",
                    f"{zero3} launch.offload=optimizer+params"]  # fmt: skip
    assert plan.train.gradient_checkpointing is True and plan.train.offload == Offload.OPTIMIZER_PARAMS


def test_an_oom_re_plan_prices_its_candidates_with_the_plan_s_calibration():
    """A plan made with a calibration (a run's measured scales, on top of a stored calibrate file's) re-plans after
    an out-of-memory failure with the same calibration: the new plan says it, and its step time is the calibrated
    one, not the table's."""
    slow = Calibration(generation=2.0, training=3.0, source="a run measured slower")
    plan = plan_recipe(QWEN15B, "8xH100-80GB", "gradient_checkpointing=false", calibration=slow)
    assert plan.calibration == slow
    new, _ = next_frugal_plan(plan, vllm_side=False) or (None, "")
    assert new is not None and new.calibration == slow
    same_change = plan_recipe(QWEN15B, "8xH100-80GB", "gradient_checkpointing=true")
    assert new.estimate.step.training_s > 2 * same_change.estimate.step.training_s
