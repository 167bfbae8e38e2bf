"""Supervision with real runs of the tiny recipe (real TRL GRPOTrainer, torchrun ranks in their own sessions): one
test per defect class of issue 15. Faults are injected by a reward function given by import path, acting on one
rank at one step (a kill, a hang, a raise, an out-of-memory error, ignoring SIGTERM), once per run directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import (
    ROOT,
    SLACK_S,
    alive,
    free_port,
    leftovers,
    metric_steps,
    processes_of,
    require_root_tool,
    tiny_overrides,
    wait_for_line,
)
from .helpers import TINY_RECIPE as RECIPE

pytestmark = pytest.mark.slow
GRACE_S = 3.0  # launch.grace_period_s of every run here

FAULTS = """
import os, signal, time
from pathlib import Path

def reward(completions, trainer_state=None, **kw):
    step = trainer_state.global_step + 1 if trainer_state is not None else 0  # the step being computed
    once = Path(os.environ["FAULT_ONCE"])
    mine = os.environ.get("RANK", "0") == os.environ.get("FAULT_RANK", "1")
    if mine and step == int(os.environ.get("FAULT_AT", "3")) and not once.exists():
        once.write_text("done")
        mode = os.environ["FAULT_MODE"]
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "hang":
            time.sleep(600)
        if mode == "ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            Path(str(once) + ".ignoring").write_text(str(os.getpid()))
            time.sleep(600)
        if mode == "oom":
            import torch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.19 GiB total)")
        if mode == "raise":
            raise ValueError("the reward broke")
    return [float(len(c) % 3) for c in completions]
"""


def fault_env(tmp_path: Path, mode: str, *, at: int = 3, rank: int = 1) -> dict[str, str]:
    (tmp_path / "faultmod.py").write_text(FAULTS)
    return {
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "FAULT_MODE": mode,
        "FAULT_AT": str(at),
        "FAULT_RANK": str(rank),
        "FAULT_ONCE": str(tmp_path / f"fault-{mode}.done"),
    }


def argv(run: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpo_launch",
        RECIPE,
        *tiny_overrides(run.parent),
        f"launch.main_process_port={free_port()}",
        f"launch.grace_period_s={GRACE_S:g}",
        *overrides,
        "--run-dir",
        str(run),
    ]


def run_cli(run: Path, *overrides: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv(run, *overrides),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start(run: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        argv(run, *overrides), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_sigkill_of_the_launcher_leaves_no_process(tmp_path):
    """SIGKILL gives grpo-launch no chance to tear down: its guard notices and stops every rank (torchrun starts
    them in their own sessions), within a few seconds."""
    run = tmp_path / "run"
    proc = start(run, "max_steps=500")
    wait_for_line(proc, "step 2/500 done")
    assert len(processes_of(run)) >= 3  # the accelerate launcher and two ranks
    proc.kill()
    proc.wait()
    assert leftovers(run, within=10) == []


@pytest.mark.extended
def test_a_rank_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    run = tmp_path / "run"
    proc = start(run, "max_steps=50", "reward_funcs=[faultmod:reward]", env=fault_env(tmp_path, "ignore-term", at=2))
    wait_for_line(proc, "step 1/50 done")
    ignoring = Path(fault_env(tmp_path, "ignore-term")["FAULT_ONCE"] + ".ignoring")
    deadline = time.monotonic() + 120
    while not ignoring.exists():  # rank 1 is in its reward, ignoring SIGTERM, once this file is written
        assert time.monotonic() < deadline and proc.poll() is None, "the fault was never reached"
        time.sleep(0.1)
    rank = int(ignoring.read_text())
    # The first SIGTERM asks for a checkpoint at the end of the step (issue 36); the second stops now.
    proc.send_signal(signal.SIGTERM)
    wait_for_line(proc, "SIGTERM again to stop now", timeout=30)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "[grpo-launch] train still running after 3 s grace: SIGKILL" in out, out[-3000:]
    assert GRACE_S <= took < GRACE_S + SLACK_S  # the whole grace period, then SIGKILL: not sooner, not much later
    # SIGKILLed in a session of its own, the rank is not the launcher's child: the launcher waits until it is gone
    assert not alive(rank)
    assert leftovers(run, within=5) == []


@pytest.mark.extended
def test_two_runs_in_one_run_dir(tmp_path):
    run = tmp_path / "run"
    first = start(run, "max_steps=500")
    try:
        wait_for_line(first, "step 1/500 done")
        plan_before = (run / "plan.json").read_text()
        second = run_cli(run, "max_steps=500", "learning_rate=0.5")
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"is in use by another grpo-launch run (pid {first.pid} on " in second.stderr
        planned = subprocess.run(
            [sys.executable, "-m", "grpo_launch", "plan", RECIPE, *tiny_overrides(tmp_path), "--run-dir", str(run)],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert planned.returncode == 1 and "in use" in planned.stderr
        assert (run / "plan.json").read_text() == plan_before  # nothing of the running run was overwritten
        status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run), "--json"],
                                capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        state = json.loads(status.stdout)
        assert state["state"] == "running" and state["launcher"].startswith(f"pid {first.pid} on ")
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert leftovers(run, within=10) == []
    # Stopped by SIGTERM: status shows that end and how to resume, not "silent … (stopped, or hung)" and an ETA.
    status = subprocess.run([sys.executable, "-m", "grpo_launch", "status", str(run), "--json"],
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    state = json.loads(status.stdout)
    assert (state["state"], state["eta_s"], state["launcher"]) == ("interrupted", None, None), state
    assert "SIGTERM" in state["detail"] and state["resume"] == shlex.join(["grpo-launch", "resume", str(run)])
    # The launcher's own lines outlive the console: RUN_DIR/logs/launcher.log, time-stamped, with both launchers'.
    log = (run / "logs" / "launcher.log").read_text()
    assert re.search(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \[pid {first.pid}\] \[grpo-launch\] plan: ", log, re.M), log
    assert "run ended: interrupted, exit code 143: interrupted by SIGTERM" in log
    assert "learning_rate" not in log  # the second launcher, refused before it started, wrote nothing


@pytest.mark.extended
def test_a_closed_stdout_does_not_stop_the_run(tmp_path):
    """The console reader goes away (``| head``, a lost tee): the run goes on to the end, its log complete."""
    run = tmp_path / "run"
    proc = start(run, "max_steps=6")
    wait_for_line(proc, "step 1/6 done")
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.wait(timeout=180) == 0
    log = "".join(p.read_text() for p in (run / "logs").glob("train-*.log"))
    assert "step 6/6 done" in log and (run / "output" / "model.safetensors").is_file()


@pytest.mark.extended
def test_rerunning_a_completed_run_says_so_and_trains_nothing(tmp_path):
    run = tmp_path / "run"
    assert run_cli(run, "max_steps=2").returncode == 0
    model = run / "output" / "model.safetensors"
    stamp = model.stat().st_mtime_ns
    again = run_cli(run, "max_steps=2")
    assert again.returncode == 0 and "this run is already complete (step 2/2" in again.stdout
    assert "[train]" not in again.stdout and model.stat().st_mtime_ns == stamp
    never = run_cli(run, "max_steps=2", "--resume", "never")
    assert never.returncode == 0 and "starting fresh" in never.stdout and metric_steps(run)[-2:] == [1, 2]
    must = run_cli(tmp_path / "other", "max_steps=2", "--resume", "must")
    assert must.returncode == 2 and "--resume must: no complete checkpoint" in must.stderr


def test_a_hang_is_stopped_with_every_ranks_stack(tmp_path):
    run = tmp_path / "run"
    t0 = time.monotonic()
    done = run_cli(
        run, "max_steps=50", "reward_funcs=[faultmod:reward]", "launch.hang_timeout_s=8",
        env=fault_env(tmp_path, "hang", at=3),
    )  # fmt: skip
    took = time.monotonic() - t0
    assert done.returncode == 1, done.stdout[-3000:]
    assert "no progress: no optimizer step for" in done.stderr
    assert "where each rank was" in done.stderr
    assert "train rank 1: reward (" in done.stderr and "faultmod.py" in done.stderr
    assert took < 90
    assert leftovers(run, within=5) == []


def test_out_of_memory_prints_the_plans_next_memory_fix_then_replans(tmp_path):
    run = tmp_path / "run"
    env = fault_env(tmp_path, "oom", at=2, rank=0)
    failed = run_cli(run, "max_steps=4", "reward_funcs=[faultmod:reward]", env=env)
    assert failed.returncode == 1
    assert "root cause: [train rank 0] torch.OutOfMemoryError: CUDA out of memory" in failed.stderr
    assert "the plan's next memory fix: gradient_checkpointing=true" in failed.stderr
    Path(env["FAULT_ONCE"]).unlink()
    healed = run_cli(run, "max_steps=4", "reward_funcs=[faultmod:reward]", "launch.on_oom=replan", env=env)
    out = healed.stdout + healed.stderr
    assert healed.returncode == 0, out[-3000:]
    assert "out of memory: replanned with gradient_checkpointing=true" in out
    assert "gradient_checkpointing: true" in (run / "trainer_recipe.yaml").read_text()


def test_a_killed_rank_restarts_and_no_step_is_lost_or_repeated(tmp_path):
    run = tmp_path / "run"
    done = run_cli(
        run, "max_steps=6", "save_steps=1", "reward_funcs=[faultmod:reward]", "launch.max_restarts=1",
        "launch.restart_backoff_s=0", env=fault_env(tmp_path, "kill", at=3),
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "restart 1/1 in 0 s after an infra failure ([train rank 1] killed by SIGKILL)" in out
    assert f"resuming from {run / 'output' / 'checkpoint-2'}" in out
    assert metric_steps(run) == [1, 2, 3, 4, 5, 6]
    attempts = [json.loads(x) for x in (run / "control" / "attempts.jsonl").read_text().splitlines()]
    assert [(a["attempt"], a["state"], a["failure"]) for a in attempts] == [
        (1, "failed", "infra"),
        (2, "succeeded", None),
    ]


@pytest.mark.extended
def test_the_users_own_error_is_not_retried(tmp_path):
    run = tmp_path / "run"
    done = run_cli(run, "max_steps=6", "reward_funcs=[faultmod:reward]", "launch.max_restarts=3",
                   env=fault_env(tmp_path, "raise", at=2))  # fmt: skip
    assert done.returncode == 1 and "root cause: [train rank 1] ValueError: the reward broke" in done.stderr
    assert "restart" not in done.stdout
    assert len((run / "control" / "attempts.jsonl").read_text().splitlines()) == 1


@pytest.mark.extended
def test_nohup_is_respected(tmp_path):
    """Started with SIGHUP ignored (nohup), a hangup does not stop the run."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        argv(run, "max_steps=4"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )  # fmt: skip
    wait_for_line(proc, "step 1/4 done")
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "training done" in out


@pytest.mark.extended
def test_a_local_time_limit_saves_a_checkpoint_before_it(tmp_path):
    """launch.time_limit_s: the run stops with a checkpoint when the time left no longer covers a step and a save
    (and the processes' exit), as measured; the next run resumes from it."""
    run = tmp_path / "run"
    t0 = time.time()
    done = run_cli(run, "max_steps=500", "save_steps=1000", "launch.time_limit_s=45")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    (attempt,) = [json.loads(x) for x in (run / "control" / "attempts.jsonl").read_text().splitlines()]
    took = attempt["ended"] - t0  # to the attempt's end: the run report is plotted after the limit's stop
    assert took < 45 + SLACK_S, out[-3000:]  # it ended by the limit (the slack: this test's clock starts earlier)
    assert "before the time limit" in out and "saving a checkpoint now" in out
    step = int((run / "control" / "stopped-at-step").read_text())
    assert 1 <= step < 500 and (run / "output" / f"checkpoint-{step}" / "trainer_state.json").is_file()


@pytest.mark.extended
def test_an_unwritable_output_dir_fails_before_anything_starts(tmp_path):
    run = tmp_path / "run"
    done = run_cli(run, "output_dir=/proc/grpo-launch-test/out")
    assert done.returncode == 1 and "output_dir '/proc/grpo-launch-test/out' cannot be written" in done.stderr
    assert not (run / "logs").exists()  # nothing started: not even the launcher's log


def test_a_full_disk_is_named_and_the_damaged_checkpoint_skipped_after(tmp_path):
    """output_dir on an 8 MB tmpfs: a checkpoint (about 4 MB of weights and optimizer state for the tiny model in
    float32) fills it. The failure names the full disk; after the file system grows, the rerun sets the damaged
    checkpoint aside and resumes from the complete one."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True).returncode
        == 0
    )
    require_root_tool(mounted, "GRPO_LAUNCH_REQUIRE_MOUNT", "mounting a small tmpfs (root; CI runs as root)")
    try:
        run = tmp_path / "run"
        overrides = (f"output_dir={mnt / 'out'}", "max_steps=6", "save_steps=1")
        full = run_cli(run, *overrides)
        assert full.returncode == 1, full.stdout[-3000:]
        assert "the disk is full: output_dir" in full.stderr, full.stderr[-3000:]
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        again = run_cli(run, *overrides)
        out = again.stdout + again.stderr
        assert again.returncode == 0, out[-3000:]
        import re

        damaged = int(re.search(r"skipped damaged checkpoint-(\d+) \(", out).group(1))
        assert f"resuming from {mnt / 'out' / f'checkpoint-{damaged - 1}'}" in out
        assert any(p.name.startswith(f"damaged-checkpoint-{damaged}-") for p in (mnt / "out").iterdir())
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.extended
def test_a_killed_torchrun_agent_fails_the_run_and_leaves_no_rank(tmp_path):
    """SIGKILL to accelerate's launcher (the torchrun agent) leaves its ranks running in their own sessions; the
    supervisor sees the launcher fail, names it as infrastructure, and stops the ranks too."""
    run = tmp_path / "run"
    proc = start(run, "max_steps=500")
    wait_for_line(proc, "step 2/500 done")
    agents = [line.split()[0] for line in processes_of(run) if "accelerate.commands.launch" in line]
    assert len(agents) == 1
    os.kill(int(agents[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out[-3000:]
    assert "train failed (killed by SIGKILL)" in out
    assert leftovers(run, within=5) == []
