"""launch.adapt's decision (planning/after_run/), the stale-weights watch (analysis/stale_weights.py) and the run's
timeline (analysis/timeline.py), with the real planner on real recipes. The measurements are written into a real run
directory with the records' own writer, as a run's rank 0 writes them: "generation took 4× the plan's prediction"
is what a GPU run of a plan whose cost model was 4× too fast on generation measures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from grpo_launch.analysis.stale_weights import FLOOR, GapWatch
from grpo_launch.analysis.step_means import read_run
from grpo_launch.analysis.timeline import adaptation_rows, adaptations, startup_terms
from grpo_launch.enums import AdaptAction
from grpo_launch.errors import ConfigError
from grpo_launch.planning.adapt_terms import MIN_GAIN, warmup_steps, why_not_adaptable
from grpo_launch.planning.after_run.adapt import (
    Adaptation,
    Previous,
    algorithm,
    decide,
    per_prompt_s,
    prompts_per_step,
    split_key,
)
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.measured_scales import calibration_from
from grpo_launch.recipe import load_recipe
from grpo_launch.render import render_files
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.records import (
    AdaptRecord,
    Attempt,
    LogRecord,
    StartupRecord,
    StepRecord,
    append,
    read_attempts,
    read_metrics,
)
from grpo_launch.rundir.startup_phases import critical_path_s

from .helpers import ROOT, plan_recipe

QWEN7B = ROOT / "recipes" / "qwen7b-math.yaml"


def server_plan(run_dir, calibration=None, *extra):
    # at one global batch, 12 prompts (the recipe's own batch is per device: splits with fewer trainers would run
    # fewer prompts, and launch.adapt compares like for like at the running plan's prompts per step)
    return plan_recipe(QWEN7B, "8xH100-80GB", "launch.vllm=server", "launch.adapt=true", "launch.prompts_per_step=12",
                       *extra,
                       run_dir=run_dir, calibration=calibration)  # fmt: skip


def measure(plan, *, generation=1.0, training=1.0, steps=6, first=0, max_steps=1000):
    """Write the plan's files and ``steps`` step records that took ``generation`` × and ``training`` × what the
    plan predicted (the trainers' generation includes the old log-probs and the sync, as TRL times it)."""
    write_run_files(plan.run_dir, render_files(plan))
    est = plan.estimate.step
    gen = est.generation_s * generation + est.old_logprobs_s * training + est.sync_s
    train = est.training_s * training
    for step in range(first + 1, first + steps + 1):
        append(plan.paths.metrics, StepRecord(step, gen + train, gen, train, max_steps=max_steps, time=float(step)))
    return read_run(plan.run_dir, after_step=first)


def test_generation_4x_slower_than_planned_moves_to_a_larger_server(tmp_path):
    plan = server_plan(tmp_path / "run")
    assert split_key(plan) == "server on 2 GPU(s) (TP 2)"
    decision = decide(plan, measure(plan, generation=4.0), tried=[split_key(plan)], resplits=0)
    assert decision.action == "resplit", decision.reason
    new = decision.plan
    assert decision.new_split == split_key(new) == "server on 4 GPU(s) (TP 4)"
    assert algorithm(new) == algorithm(plan)  # group size, prompts per step, generation rounds per step
    assert decision.new_s <= decision.calibrated_s * (1 - MIN_GAIN)
    # The running split re-predicted with the measurements is what it measured: the calibration closes the loop.
    assert decision.calibrated_s == pytest.approx(decision.measured_s, rel=0.05)
    assert decision.predicted_s == pytest.approx(per_prompt_s(plan))
    assert decision.measured_s > 2 * decision.predicted_s
    # The new plan was made with the measurements: its own calibration says generation × 4.
    assert new.estimate.workload.scale.generation == pytest.approx(4.0, rel=0.05)


def test_measurements_that_match_the_plan_keep_the_split(tmp_path):
    plan = server_plan(tmp_path / "run")
    decision = decide(plan, measure(plan), tried=[split_key(plan)], resplits=0)
    assert decision.action == "keep" and "same split" in decision.reason
    assert decision.plan is None


def test_a_split_already_tried_is_not_taken_again(tmp_path):
    plan = server_plan(tmp_path / "run")
    tried = [split_key(plan), "server on 4 GPU(s) (TP 4)"]
    decision = decide(plan, measure(plan, generation=4.0), tried=tried, resplits=1)
    assert decision.action == "keep" and "already tried" in decision.reason


def test_no_resplit_past_the_limit(tmp_path):
    plan = server_plan(tmp_path / "run", None, "launch.adapt_max_resplits=1")
    decision = decide(plan, measure(plan, generation=4.0), tried=[split_key(plan)], resplits=1)
    assert decision.action == "keep" and "adapt_max_resplits=1" in decision.reason


def test_a_resplit_measured_slower_is_reverted(tmp_path):
    before = server_plan(tmp_path / "before")
    # re-planned like for like, as launch.adapt re-plans: at the running plan's prompts per step (the batch is the
    # recipe's, so a split with fewer trainers would otherwise run a smaller batch)
    pinned = f"launch.prompts_per_step={prompts_per_step(before)}"
    after = server_plan(tmp_path / "after", Calibration(generation=4.0, source="test"), pinned)
    assert split_key(after) != split_key(before)
    measured = measure(after, generation=1.5)  # the new split turned out slower than the old one measured
    slower = Previous(before, measured.step_s / 12 * 0.5)
    decision = decide(after, measured, tried=[split_key(before), split_key(after)], resplits=1, previous=slower)
    assert decision.action == "revert" and decision.plan is before and decision.new_split == split_key(before)
    faster = Previous(before, measured.step_s / 12 * 2.0)
    assert decide(after, measured, tried=[], resplits=1, previous=faster).action != "revert"


def test_too_few_steps_left_to_pay_for_the_restart(tmp_path):
    plan = server_plan(tmp_path / "run")
    decision = decide(plan, measure(plan, generation=4.0, max_steps=7), tried=[split_key(plan)], resplits=0)
    assert decision.action == "keep" and "a restart takes" in decision.reason


def test_calibrating_a_calibrated_run_composes_the_scales(tmp_path):
    """The prediction of a calibrated plan already holds its calibration: measured ÷ predicted is relative to it
    (issue 28's drift 13.13 → 0.15 → 2.26 s came from not composing)."""
    truth = 3.0
    first = server_plan(tmp_path / "a", Calibration(generation=2.0, source="earlier"))
    scale, _ = calibration_from(measure(first, generation=truth / 2.0))
    assert scale.generation == pytest.approx(truth, rel=0.05)
    second = server_plan(tmp_path / "b", scale)
    again, _ = calibration_from(measure(second, generation=1.0))  # the calibrated plan was right
    assert again.generation == pytest.approx(truth, rel=0.05)


def test_warmup_comes_from_the_step_time_within_bounds(tmp_path):
    plan = server_plan(tmp_path / "run")
    step = plan.estimate.step.total_s
    assert warmup_steps(plan) == max(3, min(20, -(-120 // step)))
    pinned = server_plan(tmp_path / "run", None, "launch.adapt_warmup_steps=7")
    assert warmup_steps(pinned) == 7


def test_plans_that_cannot_adapt_say_why(tmp_path):
    assert "one split" in why_not_adaptable(server_plan(tmp_path / "r", None, "launch.vllm_gpus=2"))
    cpu = plan_recipe(ROOT / "recipes" / "tiny-cpu.yaml", "cpu", "launch.adapt=true", model=None)
    assert "CPU" in why_not_adaptable(cpu)
    assert why_not_adaptable(server_plan(tmp_path / "r")) is None


def test_launch_adapt_must_be_a_boolean():
    with pytest.raises(ConfigError) as err:
        load_recipe(QWEN7B, ["launch.adapt=often"])
    assert "launch.adapt must be true or false" in str(err.value.problems)


def test_only_this_layouts_steps_are_measured(tmp_path):
    plan = server_plan(tmp_path / "run")
    measure(plan, generation=9.0, steps=5)  # an earlier layout's steps 1-5
    m = measure(plan, generation=1.0, steps=4, first=5)
    assert (m.steps, m.last_step) == (4, 9)
    assert m.generation_s == pytest.approx(read_metrics(plan.paths.metrics)[-1].generation_s)


# Gaps measured on the CPU runs of tests/test_adapt_run.py (TRL's sampling/sampling_logp_difference/mean): identical
# weights, then one optimizer step with the server left on its start-up weights.
IN_SYNC = [0.0009, 0.0012, 0.0011, 0.0010, 0.0013]
STALE = 0.2176


def test_the_gap_jumping_after_a_sync_is_stale_weights():
    watch = GapWatch()
    assert all(watch.add(i, v) is None for i, v in enumerate(IN_SYNC, 1))
    said = watch.add(6, STALE)
    assert said and said.startswith("stale weights: at step 6") and "trl#3247" in said and "vLLM" in said


def test_the_gap_after_a_resume_is_judged_against_the_earlier_attempts():
    watch = GapWatch(list(IN_SYNC))
    assert "right after a resume" in watch.add(7, STALE, resumed=True)


def test_a_gap_that_drifts_or_stays_small_is_not_stale():
    watch = GapWatch()
    drift = [0.01 * 1.3**i for i in range(12)]  # grows 30 % per step: never a 10× jump
    assert all(watch.add(i, v) is None for i, v in enumerate(drift))
    quiet = GapWatch(list(IN_SYNC))
    assert quiet.add(9, FLOOR * 0.9) is None  # 70× the band, under the floor: noise at this scale


def test_timeline_pairs_each_move_with_what_came_after():
    move = {"action": "resplit", "at_step": 12, "split": "A", "new_split": "B", "measured_s": 2.0,
            "predicted_s": 1.0, "calibrated_s": 2.0, "new_s": 1.2, "reason": "faster"}  # fmt: skip
    keep = {"action": "keep", "at_step": 30, "split": "B", "new_split": "B", "measured_s": 1.3,
            "predicted_s": 1.2, "calibrated_s": 1.3, "new_s": 1.3, "reason": "same split"}  # fmt: skip
    attempts = [Attempt(1, 0.0, "stopped-for-checkpoint", 0, adaptations=(AdaptRecord.from_json(move),)),
                Attempt(2, 1.0, "succeeded", 0, adaptations=(AdaptRecord.from_json(keep),))]  # fmt: skip
    made = adaptations(attempts)
    assert [a["measured_after_s"] for a in made] == [1.3, None]
    assert made[0] == move | {"measured_after_s": 1.3}  # status --json shows the decision as the run keeps it
    rows = adaptation_rows(attempts)
    assert "step 12: resplit A → B" in rows[0][1] and "measured after 1.3 s" in rows[0][1]


def test_startup_terms_take_the_latest_attempt_and_its_critical_path():
    records = [StartupRecord("vllm_ready", 40.0), StartupRecord("model_load", 25.0),
               StartupRecord("first_sync", 1.0), StartupRecord("first_generation", 5.0),
               LogRecord(1, {}), StartupRecord("model_load", 20.0), StartupRecord("vllm_ready", 10.0)]  # fmt: skip
    assert startup_terms(records[:4]) == {"vllm_ready": 40.0, "model_load": 25.0, "first_sync": 1.0,
                                          "first_generation": 5.0}  # fmt: skip
    assert critical_path_s(startup_terms(records[:4])) == 46.0  # the server's start, not the load, then the rest
    assert startup_terms(records) == {"model_load": 20.0, "vllm_ready": 10.0}


def test_the_attempt_record_keeps_its_decisions(tmp_path):
    decision = AdaptRecord.from_json({"action": "keep", "at_step": 4, "split": "A", "measured_s": 1.0})
    append(tmp_path / "attempts.jsonl", Attempt(1, 0.0, "succeeded", 0, adaptations=(decision,)))
    from grpo_launch.rundir.records import read_attempts

    (back,) = read_attempts(tmp_path / "attempts.jsonl")
    assert back.adaptations == (decision,)
    assert dataclasses.replace(back, adaptations=()).adaptations == ()


@pytest.mark.parametrize("action", list(AdaptAction))
def test_each_adapt_action_round_trips_through_the_record(tmp_path, action):
    """The decision the planner makes, written as the attempt loop writes it and read back: the same record, its
    action the enum member, and the file's line the same keys and plain words as before the record was typed."""
    plan = server_plan(tmp_path / "run")
    made = Adaptation(action, "why", at_step=7, split=split_key(plan), measured_s=1.5, predicted_s=1.0,
                      calibrated_s=1.4, new_split="B", new_s=1.1, plan=plan)  # fmt: skip
    record = made.record()
    append(tmp_path / "attempts.jsonl", Attempt(1, 0.0, "succeeded", 0, adaptations=(record,)))
    line = json.loads((tmp_path / "attempts.jsonl").read_text())
    assert line["adaptations"] == [{"action": str(action), "reason": "why", "at_step": 7, "split": split_key(plan),
                                    "measured_s": 1.5, "predicted_s": 1.0, "calibrated_s": 1.4, "new_split": "B",
                                    "new_s": 1.1}]  # fmt: skip
    (back,) = read_attempts(tmp_path / "attempts.jsonl")
    assert back.adaptations == (record,) and back.adaptations[0].action is action
    assert AdaptRecord.from_json(record.to_json()) == record
    assert made.to_json() == record.to_json()  # the plan stays out of the file
    assert AdaptRecord(str(action), "", 0, "A", 1.0).action is action  # a plain word becomes the member


def test_an_unknown_adapt_action_in_the_run_directory_is_a_clear_error(tmp_path, capsys):
    """A decision this version does not know (a newer version's, or a hand edit): one message that names the file
    and the action, exit 2, no traceback; the same from ``status``."""
    from grpo_launch.cli import main

    run = tmp_path / "run"
    attempts = run / "control" / "attempts.jsonl"
    attempts.parent.mkdir(parents=True)
    decision = {"action": "shrink", "at_step": 4, "split": "A", "measured_s": 1.0}
    attempts.write_text(json.dumps({"attempt": 1, "ended": 1e9, "state": "succeeded", "adaptations": [decision]}))
    with pytest.raises(ConfigError) as caught:
        read_attempts(attempts)
    assert str(attempts) in caught.value.message and "'shrink'" in caught.value.message
    assert "keep, resplit, revert" in caught.value.message
    assert main(["status", str(run)], environ={}) == 2
    err = capsys.readouterr().err
    assert str(attempts) in err and "'shrink'" in err and "Traceback" not in err


def test_a_restart_says_what_it_costs_before_the_first_step_again(tmp_path):
    """The time to the first step is paid again on every restart: the restart note says how much."""
    from grpo_launch.enums import FailureKind, RunState
    from grpo_launch.execute.policy import Action, Spent, next_action
    from grpo_launch.spec import Failure, RunResult

    plan = server_plan(tmp_path / "run")
    lost = RunResult(RunState.FAILED, 1, message="a host went down", failure=Failure(FailureKind.INFRA, "lost"))
    step = next_action(plan, lost, Spent(), max_restarts=2)
    assert step.action == Action.RESTART
    assert f"about {plan.estimate.startup_s:.0f} s to the first step again" in step.note


def test_an_async_plan_does_not_adapt_and_says_why(tmp_path):
    """AsyncGRPO overlaps generation and training, so a step is not the sum the calibration splits: adapt is off for
    it (the plan says so), and a re-split would keep its staleness bound as part of the algorithm."""
    plan = server_plan(tmp_path / "run", None, "launch.mode=async")
    assert plan.asynchronous is not None and "async plan" in why_not_adaptable(plan)
    assert any(n.startswith("launch.adapt: off for this plan: an async plan") for n in plan.notices)
    assert algorithm(plan)[3] == plan.asynchronous.max_staleness


def test_status_shows_an_async_runs_signals_and_which_side_is_slower(tmp_path):
    """AsyncGRPOTrainer's logged signals (the keys of trl 1.16 async_grpo_trainer.py, as rank 0 writes them) reach
    ``status``: the last step's queue, wait and staleness, and the verdict as TRL's maintainers read them."""
    import json
    import subprocess
    import sys

    from grpo_launch.analysis.timeline import async_row

    run = tmp_path / "run"
    run.mkdir()
    from grpo_launch.render.plan_json import plan_to_dict

    plan = plan_to_dict(plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", "launch.mode=async"))
    plan["asynchronous"]["queue_maxsize"] = 96  # plan.json as the planner writes it, with this queue
    (run / "plan.json").write_text(json.dumps(plan, default=str))
    full = {"perf/rollout_wait_s": 0.0, "sample/rollout_queue_size": 90.0, "perf/step_s": 20.0,
            "sample/staleness_mean": 1.2, "rollout/backpressure_s": 4.0}  # fmt: skip
    for step in range(1, 6):
        append(run / "metrics.jsonl", StepRecord(step, 20.0, 0.0, 20.0, max_steps=100, time=float(step)))
        append(run / "metrics.jsonl", LogRecord(step, full))
    row = async_row(read_metrics(run / "metrics.jsonl"), 96)
    assert row and row[1].startswith("rollout wait 0.00 s, backpressure 4.00 s, queue 90, staleness 1.2")
    assert "training is the slower side" in row[1]
    synchronous = [LogRecord(1, {"reward": 0.5})]
    assert async_row(synchronous, None) is None
    shown = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "training is the slower side" in shown.stdout and "queue 90 of 96" in shown.stdout
