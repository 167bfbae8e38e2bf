"""Checkpoints spaced by what they cost: where the recipe leaves save_steps unset the plan chooses Young/Daly's
interval √(2 · C · M) (Young 1974; Daly 2006) from the checkpoint's size over the disk's write speed and the GPUs'
failure rate (Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs), says what it costs a day against
TRL's 500, keeps a recipe's own save_steps (with a notice when it loses more than twice the optimum's time) and bounds
the disk with save_total_limit."""

from __future__ import annotations

import math

import pytest

from grpo_launch.planning.cost.checkpoints import DAY_S, TRL_SAVE_STEPS, off_the_optimum, run_mtbf_s, save_interval
from grpo_launch.planning.cost.constants import CONSTANTS

from .helpers import ROOT, plan_recipe

QWEN = ROOT / "recipes" / "qwen1.5b.yaml"


def _unset(*keys: str) -> dict:
    """The qwen1.5b recipe without ``keys``."""
    import yaml

    values = yaml.safe_load(QWEN.read_text())
    for key in keys:
        values.pop(key, None)
    return values


def test_the_failure_rate_is_llama_3s():
    """54 days × 24 h × 16,384 GPUs ÷ 419 unexpected interruptions."""
    assert CONSTANTS["gpu_hours_between_failures"].value == pytest.approx(54 * 24 * 16384 / 419, rel=0.01)
    # at Llama 3's own scale: one every 3.1 hours, as the report says
    assert run_mtbf_s(16384, None)[0] / 3600 == pytest.approx(3.1, abs=0.05)
    assert run_mtbf_s(8, 12.0) == (12 * 3600, "launch.mtbf_hours=12")


def test_the_interval_is_youngs_and_its_waste_is_least_there():
    """τ = √(2CM); the day's waste D·C/τ + D/M·(τ/2 + R) is least at τ (a derivative of zero), and the figures add
    up: saving plus lost equals the waste formula at any interval."""
    interval = save_interval(10e9, 1e9, "a test", 64, None, step_s=20.0, restart_s=120.0, recipe_steps=None)
    tau = math.sqrt(2 * 10.0 * interval.mtbf_s)
    assert interval.optimum_steps == round(tau / 20.0) and interval.steps == interval.optimum_steps
    best = sum(interval.waste_per_day_s(interval.optimum_steps))
    for steps in (interval.optimum_steps // 2, interval.optimum_steps * 2, TRL_SAVE_STEPS):
        assert sum(interval.waste_per_day_s(steps)) > best
    lost, saving = interval.waste_per_day_s(100)
    assert saving == pytest.approx(DAY_S / (100 * 20.0) * 10.0)
    assert lost == pytest.approx(DAY_S / interval.mtbf_s * (100 * 20.0 / 2 + 120.0))
    kept = save_interval(10e9, 1e9, "a test", 64, None, step_s=20.0, restart_s=120.0, recipe_steps=10)
    assert kept.steps == 10 and kept.recipes and off_the_optimum(kept) > 2


def test_a_plan_without_save_steps_chooses_its_interval_and_says_so():
    """8 and 64 H100s: more GPUs fail more often, so the interval shrinks (as √(1/N))."""
    eight = plan_recipe(_unset("save_steps", "save_total_limit"), "8xH100-80GB")
    sixty_four = plan_recipe(_unset("save_steps", "save_total_limit"), "8x8xH100-80GB")
    for plan in (eight, sixty_four):
        steps = plan.trainer_values["save_steps"]
        assert any(n.startswith(f"save_steps={steps} (a checkpoint every") for n in plan.notices), plan.notices
        assert any(line.startswith("checkpoint interval (Young/Daly)") for line in plan.estimate.explain)
        assert plan.trainer_values["save_total_limit"] == 2
    a, b = eight.estimate.save_interval, sixty_four.estimate.save_interval
    assert a.mtbf_s == pytest.approx(8 * b.mtbf_s) and a.steps * a.step_s > b.steps * b.step_s


def test_a_recipes_own_save_steps_is_kept_with_the_cost_said():
    plan = plan_recipe(QWEN, "8xH100-80GB", "save_steps=100")
    assert plan.trainer_values["save_steps"] == 100
    said = [n for n in plan.notices if n.startswith("save_steps=100 (the recipe's) loses about")]
    assert said and "kept" in said[0]
    close = plan.estimate.save_interval.optimum_steps
    quiet = plan_recipe(QWEN, "8xH100-80GB", f"save_steps={close}")
    assert not [n for n in quiet.notices if "(the recipe's) loses about" in n]


def test_a_measured_disk_speed_sets_the_save_time_and_mtbf_hours_overrides_the_rate():
    from grpo_launch.machines.calibrated_speed import MeasuredTerms
    from grpo_launch.planning.cost.workload import Calibration

    cal = Calibration(measured=MeasuredTerms(device="NVIDIA H100 80GB HBM3", save_bytes_per_s=4e9))
    plan = plan_recipe(_unset("save_steps"), "8xH100-80GB", "launch.mtbf_hours=2", calibration=cal)
    interval = plan.estimate.save_interval
    assert "measured by calibrate" in interval.save_why and interval.mtbf_s == 7200
    assumed = plan_recipe(_unset("save_steps"), "8xH100-80GB").estimate.save_interval
    assert interval.save_s == pytest.approx(assumed.save_s / 4)


def test_no_interval_where_the_run_saves_no_steps_or_runs_on_cpu():
    assert "save_steps" not in plan_recipe(_unset("save_steps"), "8xH100-80GB", "save_strategy=no").trainer_values
    cpu = plan_recipe(ROOT / "recipes" / "tiny-cpu.yaml", "cpu")
    assert cpu.trainer_values["save_steps"] == 30
    assert cpu.estimate is None or cpu.estimate.save_interval is None
