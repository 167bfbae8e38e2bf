"""`grpo-launch plan --calibrate-from RUN_DIR`: a previous run's measurements scale the next plan's estimate.

The run directories here hold a real plan.json written by `grpo-launch plan` for GPUs, and a metrics.jsonl whose
step lines are written by the test: no GPU run can happen on this machine, and a CPU plan predicts no time to
compare with (tests/test_run.py shows a real CPU run's metrics.jsonl read back and refused for that reason)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from grpo_launch.analysis.step_means import read_run
from grpo_launch.errors import ConfigError
from grpo_launch.machines.gpus import GIB
from grpo_launch.planning.measured_scales import calibration_from
from grpo_launch.render import render_files
from grpo_launch.rundir.files import write_run_files

from .helpers import ROOT, plan_recipe

VALUES = {
    "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct",
    "num_generations": 8,
    "max_prompt_length": 512,
    "max_completion_length": 2048,
    "per_device_train_batch_size": 4,
    "launch": {"vllm": "colocate"},
}


def _plan(calibration=None, **launch):
    values = {**VALUES, "launch": {**VALUES["launch"], **launch}}
    return plan_recipe(values, "8xH100-80GB", calibration=calibration)


def _run_dir(tmp_path, *, gen=1.0, train=1.0, memory=1.0, mean_length=None, steps=4):
    """A run dir whose plan.json is the real plan's, and whose step lines are the plan's own prediction × the
    given factors (the first step slower: it is left out as warm-up)."""
    plan = _plan()
    run = tmp_path / "run"
    write_run_files(run, render_files(plan))
    s = plan.estimate.step
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            warm = 5.0 if step == 1 else 1.0
            g = (s.generation_s + s.old_logprobs_s * train + s.sync_s) * gen * warm
            t = s.training_s * train * warm
            peak = int(plan.estimate.train_memory.total * memory)
            line = {"step": step, "max_steps": 100, "time": 1e9 + step, "step_s": g + t, "generation_s": g,
                    "training_s": t, "num_tokens": step * 1000, "peak_memory_bytes": [peak, peak - 1],
                    "memory_kind": "cuda_max_allocated"}  # fmt: skip
            f.write(json.dumps(line) + "\n")
            if mean_length is not None:
                f.write(json.dumps({"step": step, "log": {"completions/mean_length": mean_length}}) + "\n")
        f.write('{"step": 9, "step_s": 1.0, "generat')  # a line cut short by a crash is skipped
    return plan, run


def test_a_run_that_matched_its_plan_changes_nothing(tmp_path):
    plan, run = _run_dir(tmp_path)
    cal, rows = calibration_from(read_run(run))
    assert (cal.generation, cal.training, cal.memory) == pytest.approx((1.0, 1.0, 1.0), rel=1e-6)
    again = _plan(cal)
    assert again.estimate.step.total_s == pytest.approx(plan.estimate.step.total_s, rel=1e-6)
    assert {r.term.split(" ")[0]: r.ratio for r in rows}["step"] == pytest.approx(1.0, rel=1e-6)


def test_slower_generation_and_training_are_carried_into_the_next_plan(tmp_path):
    plan, run = _run_dir(tmp_path, gen=2.0, train=1.5)
    cal, _ = calibration_from(read_run(run))
    assert cal.training == pytest.approx(1.5, rel=1e-6)
    assert cal.generation == pytest.approx(2.0 + (2.0 - 1.0) * plan.estimate.step.old_logprobs_s * 1.5
                                           / plan.estimate.step.generation_s, rel=1e-6)  # fmt: skip
    again = _plan(cal).estimate.step
    assert again.training_s == pytest.approx(1.5 * plan.estimate.step.training_s, rel=1e-6)
    assert again.generation_s == pytest.approx(cal.generation * plan.estimate.step.generation_s, rel=1e-6)


def test_the_measured_mean_length_replaces_the_maximum(tmp_path):
    """Completions averaged 500 of 2048 tokens: the next plan trains over shorter padded batches, and the
    training scale is measured against the prediction at that length, not at the maximum."""
    plan, run = _run_dir(tmp_path, mean_length=500.0)
    cal, _ = calibration_from(read_run(run))
    assert cal.mean_completion_len == 500.0
    assert cal.training > 1.0  # the run took as long as predicted for 2048-token completions: slower than modelled
    again = _plan(cal)
    assert again.estimate.workload.mean_completion_len == 500.0
    # The next prediction is the run's measured training time: the two corrections cancel.
    assert again.estimate.step.training_s == pytest.approx(plan.estimate.step.training_s, rel=1e-6)
    assert "measured" in again.estimate.explain[0]


def test_measured_memory_changes_what_fits(tmp_path):
    """A run that peaked 60 % above its estimate: the same recipe now needs a cheaper memory setting."""
    plan, run = _run_dir(tmp_path, memory=1.6)
    cal, _ = calibration_from(read_run(run))
    assert cal.memory == pytest.approx(1.6, rel=1e-3)
    again = _plan(cal)
    assert again.estimate.train_memory.scale == pytest.approx(1.6, rel=1e-3)
    assert (again.train.backend, again.train.offload, again.train.gradient_checkpointing) != (
        plan.train.backend, plan.train.offload, plan.train.gradient_checkpointing)  # fmt: skip
    assert again.estimate.train_memory.total <= 0.9 * 80 * GIB


def test_missing_metrics_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"metrics\.jsonl"):
        read_run(tmp_path)


def test_cli_prints_predicted_against_measured(tmp_path):
    _, run = _run_dir(tmp_path, gen=1.2, mean_length=700.0)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps(VALUES))
    base = [sys.executable, "-m", "grpo_launch", "plan", str(recipe), "--gpus", "8xH100-80GB", "--no-write"]
    out = subprocess.run([*base, "--calibrate-from", str(run)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "Calibrated from" in out.stdout and "mean completion length" in out.stdout and "700 tokens" in out.stdout
    data = json.loads(
        subprocess.run([*base, "--calibrate-from", str(run), "--json"], capture_output=True, text=True, cwd=ROOT).stdout
    )
    terms = {t["term"]: t for t in data["calibrated_from"]["terms"]}
    assert terms["mean completion length"]["measured"] == 700.0
    assert data["estimate"]["calibration"]["mean_completion_len"] == 700.0
    bad = subprocess.run([*base, "--calibrate-from", str(tmp_path / "nowhere")], capture_output=True, text=True,
                         cwd=ROOT)  # fmt: skip
    assert bad.returncode != 0 and "metrics.jsonl" in bad.stderr and "Traceback" not in bad.stderr


def test_progress_states_and_eta(tmp_path):
    """`grpo-launch status`: the ETA from the measured mean step time (warm-up step left out) and from the plan's."""
    from grpo_launch.analysis.step_means import progress

    plan, run = _run_dir(tmp_path, gen=2.0)
    m = read_run(run)
    assert m.steps == 4 and m.last_step == 4 and m.max_steps == 100
    running = progress(m, now=m.last_time + 1.0)
    assert running.state == "running" and running.remaining_steps == 96
    assert running.eta_s == pytest.approx(96 * m.step_s) and m.step_s < 2.5 * plan.estimate.step.total_s
    assert running.planned_eta_s == pytest.approx(96 * plan.estimate.step.total_s)
    assert progress(m, now=m.last_time + 10 * m.step_s + 120).state == "silent"
    assert progress(m, now=m.last_time, stopped_at=4).state == "stopped"
    done = progress(dataclasses.replace(m, max_steps=4), now=m.last_time)
    assert (done.state, done.eta_s) == ("finished", 0.0)
