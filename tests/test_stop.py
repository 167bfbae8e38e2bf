"""A stop loses at most the step in flight (issue 36): real CPU GRPO runs of the tiny recipe (two torchrun ranks),
signalled as a user or a platform would. The first Ctrl-C or SIGTERM asks the trainers to save a checkpoint at the
end of the step in flight; the same command then resumes from it with the weights it saved. A second Ctrl-C, or the
grace running out, stops at once without one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import (
    ROOT,
    SLACK_S,
    ensure_tiny_assets,
    free_port,
    leftovers,
    metric_steps,
    processes_of,
    tiny_overrides,
    wait_for_line,
)
from .helpers import TINY_RECIPE as RECIPE

pytestmark = pytest.mark.slow

# A reward given by import path: on its first call in rank 0 it saves the policy's weights as they are then (the
# weights the attempt started from: no update has happened yet), and from step SLOW_FROM on it can sleep, so that
# a signal lands in the middle of a step.
REWARDS = """
import gc, os, time
from pathlib import Path

_seen = []

def reward(completions, trainer_state=None, **kw):
    step = trainer_state.global_step + 1 if trainer_state is not None else 0  # the step being computed
    out = os.environ.get("WEIGHTS_OUT")
    if out and not _seen and os.environ.get("RANK", "0") == "0":
        _seen.append(True)
        import torch
        from transformers import PreTrainedModel
        model = next(o for o in gc.get_objects() if isinstance(o, PreTrainedModel))
        Path(out).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(state, Path(out) / f"first-weights-step-{step}.pt")
    if step >= int(os.environ.get("SLOW_FROM") or 10**9):
        time.sleep(float(os.environ["SLOW_S"]))
    return [float(sum(ch.isdigit() for ch in str(c))) for c in completions]
"""


def argv(run: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpo_launch",
        RECIPE,
        *tiny_overrides(run.parent),
        "reward_funcs=[stoprewards:reward]",
        "launch.grace_period_s=3",
        *overrides,
        "--run-dir",
        str(run),
    ]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "stoprewards.py").write_text(REWARDS)
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra}


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)


def attempts(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "control" / "attempts.jsonl").read_text().splitlines()]


def checkpoints(run: Path) -> list[str]:
    out = run / "output"
    return sorted(p.name for p in out.glob("checkpoint-*")) if out.is_dir() else []


def load_weights(path: Path) -> dict:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path)


def test_ctrl_c_saves_the_step_in_flight_and_the_same_command_resumes_with_its_weights(tmp_path):
    """Ctrl-C after step 3 of 10: the trainers save a checkpoint at the end of the step in flight, the launcher
    exits 130 and says so; the same command resumes there: steps 1..10 each once, the same trainer recipe, and
    the resumed attempt's first weights are the checkpoint's (not the base model's)."""
    run = tmp_path / "run"
    cmd = argv(run, "max_steps=10", f"launch.main_process_port={free_port()}")
    proc = start(cmd, env_for(tmp_path, WEIGHTS_OUT=str(tmp_path / "w1")))
    wait_for_line(proc, "step 3/10 done")
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-3000:]
    asked = re.search(r"\[grpo-launch\] SIGINT: checkpoint at the end of step (\d+) requested; Ctrl-C again to stop "
                      r"now \(waiting up to 300 s: launch\.stop_grace_s's default\)", rest)  # fmt: skip
    assert asked, rest[-3000:]
    step = int(re.search(r"\[grpo-launch\] stopped after saving checkpoint-(\d+); the same command resumes", rest)[1])
    assert step == int(asked[1]) and 4 <= step < 10, rest[-3000:]
    assert checkpoints(run) == [f"checkpoint-{step}"]
    assert metric_steps(run) == list(range(1, step + 1))
    (record,) = attempts(run)
    assert (record["state"], record["exit_code"]) == ("interrupted", 130)
    assert record["message"] == f"interrupted by SIGINT: stopped after saving checkpoint-{step}"
    assert processes_of(run) == []
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run), "--json"],
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    state = json.loads(status.stdout)
    assert state["state"] == "interrupted" and f"checkpoint-{step}" in state["detail"], state
    assert state["resume"], state  # how to go on
    recipe_before = (run / "trainer_recipe.yaml").read_text()

    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                           env=env_for(tmp_path, WEIGHTS_OUT=str(tmp_path / "w2")))  # fmt: skip
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert f"checkpoint-{step}" in out and "step 10/10 done" in out
    assert (run / "trainer_recipe.yaml").read_text() == recipe_before  # the same recipe values
    assert metric_steps(run) == list(range(1, 11)), "a step lost or repeated"
    # Weights continue: the resumed attempt started from the checkpoint's weights, which training had moved away
    # from the base model's.
    saved = load_weights(run / "output" / f"checkpoint-{step}" / "model.safetensors")
    first = load_weights(tmp_path / "w2" / f"first-weights-step-{step + 1}.pt")
    base = load_weights(ensure_tiny_assets() / "model" / "model.safetensors")
    assert saved.keys() <= first.keys()
    assert all(bool((first[k] == saved[k]).all()) for k in saved)
    assert any(not bool((base[k] == saved[k]).all()) for k in saved if k in base)


# The same stop as Ctrl-C above; SIGTERM's own notice and exit code: test_stop_signals.py, with a stand-in trainer
@pytest.mark.extended
def test_sigterm_saves_the_step_in_flight_and_exits_143(tmp_path):
    """SIGTERM (a platform's stop: Slurm, SkyPilot, a Ray drain reaching the launcher) is the first Ctrl-C."""
    run = tmp_path / "run"
    proc = start(argv(run, "max_steps=50", f"launch.main_process_port={free_port()}"), env_for(tmp_path))
    wait_for_line(proc, "step 2/50 done")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, rest[-3000:]
    assert re.search(r"SIGTERM: checkpoint at the end of step \d+ requested; SIGTERM again to stop now", rest), rest
    step = int(re.search(r"stopped after saving checkpoint-(\d+)", rest)[1])
    assert (run / "output" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert metric_steps(run) == list(range(1, step + 1))
    assert attempts(run)[-1]["message"] == f"interrupted by SIGTERM: stopped after saving checkpoint-{step}"
    assert processes_of(run) == []


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(tmp_path):
    """Step 3 takes 60 s (a slow reward): the first Ctrl-C asks for its checkpoint, the second stops every process
    at once (the teardown of old: SIGINT, grace_period_s, SIGKILL), and nothing is saved."""
    run = tmp_path / "run"
    env = env_for(tmp_path, SLOW_FROM="3", SLOW_S="60")
    proc = start(argv(run, "max_steps=50", f"launch.main_process_port={free_port()}"), env)
    wait_for_line(proc, "step 2/50 done")
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    wait_for_line(proc, "Ctrl-C again to stop now", timeout=30)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, rest[-3000:]
    assert "SIGINT: stopping every process" in rest and "stopped after saving" not in rest, rest[-3000:]
    assert took < 3 + SLACK_S, took
    assert checkpoints(run) == []
    # no plotting after a stop (seconds more of waiting): the console says how to write the report
    assert (
        f"run report: not written after an interrupt (Ctrl-C, SIGTERM, SIGHUP); grpo-launch report {run} writes it"
        in rest
    )
    assert not (run / "report").exists()
    lost = "no complete checkpoint: steps 1–2 will be trained again"  # step 3 was in flight
    assert attempts(run)[-1]["message"] == f"interrupted by SIGINT: {lost}" and f"[grpo-launch] {lost}" in rest
    assert processes_of(run) == []


@pytest.mark.extended
def test_the_grace_running_out_stops_without_a_checkpoint(tmp_path):
    """launch.stop_grace_s=2 and a step that takes 60 s, signalled as it begins: after 2 s the launcher says so and
    stops everything (before the step has run long enough to count as one that cannot end)."""
    run = tmp_path / "run"
    env = env_for(tmp_path, SLOW_FROM="3", SLOW_S="60")
    proc = start(argv(run, "max_steps=50", "launch.stop_grace_s=2", f"launch.main_process_port={free_port()}"), env)
    wait_for_line(proc, "step 2/50 done")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, rest[-3000:]
    assert "(waiting up to 2 s: launch.stop_grace_s)" in rest, rest[-3000:]
    assert "[grpo-launch] grace of 2 s ran out: stopped without a checkpoint" in rest, rest[-3000:]
    assert 2 <= took < 2 + 3 + SLACK_S, took
    assert checkpoints(run) == [] and processes_of(run) == []


# A reward that hangs at step 3 and ignores SIGTERM and SIGINT in every rank: the step in flight can never end.
HANG = """
import signal, time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)

def reward(completions, trainer_state=None, **kw):
    if trainer_state is not None and trainer_state.global_step + 1 >= 3:
        time.sleep(3600)
    return [float(sum(ch.isdigit() for ch in str(c))) for c in completions]
"""


def test_a_stop_does_not_wait_for_a_step_that_cannot_end(tmp_path):
    """The reproduction: a reward hangs at step 3 and ignores SIGTERM and SIGINT; 10 s into the hang (steps of a
    tenth of a second before it), SIGTERM. Before: "checkpoint at the end of step 3 requested", then 180 s and more
    of waiting for it, and once the launcher was killed, 4 processes left. Now the step's time against every step
    measured says no checkpoint can come: it stops at once, within launch.grace_period_s (5 s) + 10 s, names why,
    and leaves nothing running."""
    run = tmp_path / "run"
    (tmp_path / "hangrewards.py").write_text(HANG)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "grpo_launch", RECIPE, *tiny_overrides(run.parent),
           "reward_funcs=[hangrewards:reward]", "launch.grace_period_s=5", "max_steps=50",
           f"launch.main_process_port={free_port()}", "--run-dir", str(run)]  # fmt: skip
    proc = start(cmd, env)
    seen = wait_for_line(proc, "step 2/50 done")
    # 10 s into the hang, and past five times step 2 (the bound: a loaded machine's steps are slower)
    time.sleep(max(10.0, 5 * float(re.search(r"step 2/50 done in ([\d.]+) s", seen[-1])[1]) + 2))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, rest[-3000:]
    said = re.search(r"\[grpo-launch\] SIGTERM: step 3 has run (\d+) s, (\d+)× the median: no checkpoint possible; "
                     r"stopping now", rest)  # fmt: skip
    assert said and int(said[1]) >= 9, rest[-3000:]  # the watchdog reads the step's record within a second
    assert "checkpoint at the end of step 3 requested" not in rest
    assert took < 5 + 10, (took, rest[-3000:])
    assert checkpoints(run) == [] and leftovers(run, within=5.0) == []
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run), "--json"],
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    grace = json.loads(status.stdout)["stop_grace"]
    assert grace == {"seconds": 300.0, "source": "launch.stop_grace_s's default"}, grace
