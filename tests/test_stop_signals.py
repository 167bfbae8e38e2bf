"""The parts of a stop on a signal (issue 36) that need no GRPO run: Slurm's grace read from scontrol's text, the
stop request and its reason, the shim's held SIGTERM (real processes), and the session's first and second signal
with a stand-in trainer that honours the request as the training entry does (tests/test_stop.py runs GRPO)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from grpo_launch.backends.slurm.preempt import AT_ONCE, grace_time_of, kill_wait_of, stop_grace, stops_at_once
from grpo_launch.enums import RunState
from grpo_launch.execute.session import SessionSpec, Stopping, supervise
from grpo_launch.execute.stop_channel import StopChannel
from grpo_launch.rundir import control
from grpo_launch.rundir.layout import HOLD_SIGTERM_ENV, RunPaths
from grpo_launch.spec import ProcessSpec

from .helpers import ROOT

SRC = str(ROOT / "src")


def test_slurm_grace_prefers_the_partitions_gracetime_then_killwait():
    config = "Configuration data as of 2026-11-26T12:00:00\nKillWait                = 30 sec\nMinJobAge = 300 sec\n"
    assert kill_wait_of(config) == 30.0 and kill_wait_of("nothing here") is None
    part = "PartitionName=debug AllowGroups=ALL GraceTime=120 Hidden=NO PreemptMode=REQUEUE State=UP"
    assert grace_time_of(part) == 120.0 and grace_time_of("PartitionName=x Hidden=NO") is None
    assert stop_grace(120.0, 30.0) == (115.0, "the partition's GraceTime 120 s, less 5 s to stop")
    assert stop_grace(0.0, 30.0) == (25.0, "the cluster's KillWait 30 s, less 5 s to stop")
    assert stop_grace(None, 3.0) == (1.0, "the cluster's KillWait 3 s, less 5 s to stop")
    assert stop_grace(None, None) is None


def test_under_slurm_only_sigterm_to_the_launcher_stops_at_once():
    assert stops_at_once(signal.SIGTERM) == AT_ONCE and "srun step is killed at once" in AT_ONCE
    assert stops_at_once(signal.SIGINT) is None and stops_at_once(signal.SIGHUP) is None


def test_a_stop_request_keeps_its_first_reason(tmp_path):
    assert control.stop_reason(tmp_path) is None
    control.request_stop(tmp_path, "SIGTERM")
    control.request_stop(tmp_path)  # the launcher's, later: the trainers' reason stays
    assert control.stop_reason(tmp_path) == "SIGTERM"
    control.reset(tmp_path)
    control.request_stop(tmp_path)
    assert control.stop_reason(tmp_path) == control.LAUNCHER


# What a trainer rank under `node.shim --hold-term` sees, and does with SIGTERM once the training entry installed
# its handler (train/callbacks.py): it reports its mask, installs the handler, tells the test, and waits.
RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {src!r})
    from grpo_launch.rundir import control
    blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    print("blocked", blocked, "env", os.environ.get({env!r}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # pending while blocked: no effect yet
    time.sleep(0.2)
    control.request_stop_on_sigterm(sys.argv[1])  # unblocks: the pending SIGTERM becomes the request
    time.sleep(0.2)
    print("alive, request:", control.stop_reason(sys.argv[1]), flush=True)
    """
)


def test_the_shims_held_sigterm_becomes_a_stop_request_in_the_rank(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(src=SRC, env=HOLD_SIGTERM_ENV))
    env = {**os.environ, "PYTHONPATH": SRC}
    argv = [sys.executable, "-m", "grpo_launch.node.shim", "--hold-term", "--", sys.executable, str(script)]
    done = subprocess.run([*argv, str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["blocked True env 1", "alive, request: SIGTERM"]
    plain = subprocess.run([*argv[:3], *argv[4:], str(tmp_path / "other")], capture_output=True, text=True,
                           env=env, timeout=60)  # fmt: skip
    assert plain.returncode == -signal.SIGTERM  # without --hold-term SIGTERM kills it, as before


# A stand-in trainer: one "step" every 0.3 s; at a step's end it honours the run's stop request as the training
# entry does (rank 0 writes the step it stopped at, exits 0). SLOW (a file's path) makes step 3 last 60 s, and the
# file says step 3 began: a signal meant for that step waits for it (a loaded machine may start the trainer late).
TRAINER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {src!r})
    from grpo_launch.rundir import control
    from grpo_launch.rundir.layout import RunPaths
    run = sys.argv[1]
    for step in range(1, 1000):
        if step == 3 and os.environ.get("SLOW"):
            open(os.environ["SLOW"], "w").close()
        time.sleep(60 if step == 3 and os.environ.get("SLOW") else 0.3)
        print(f"step {{step}} done", flush=True)
        if RunPaths(run).stop_request.exists():
            control.mark_stopped(run, step)
            sys.exit(0)
    """
)


def _session(tmp_path, **env: str):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(src=SRC))
    paths = RunPaths(tmp_path / "run")
    control.reset(paths.root)
    trainer = ProcessSpec("train", (sys.executable, str(script), str(paths.root)), env=env)
    session = SessionSpec(None, [trainer], tmp_path / "logs", grace_s=2.0, paths=paths)
    stopping = Stopping(grace_s=20.0, grace_why="a test", step_in_flight=lambda: 7)
    return session, stopping, paths


def _supervise(session, stopping, paths, lines):
    """The session supervised with a stop on the first signal, through the run's stop channel."""
    channel = StopChannel(paths.root, lines.append)
    return supervise(session, environ=dict(os.environ), emit=lines.append, stopping=stopping, channel=channel)


def _signal_after(seconds: float, *signums: int, slow: Path | None = None, lines: list[str] | None = None) -> list:
    """Send ``signums`` to this process ``seconds`` from now, or from when the trainer's slow step began (``slow``,
    its file), and once ``lines`` (given) hold the trainer's first step; a second signal once the first was
    announced in ``lines`` (two signals sent before the handler ran would be one). Returns the list its sending
    times go to."""
    sent: list[float] = []

    def send() -> None:
        time.sleep(seconds)
        deadline = time.monotonic() + 60
        while slow is not None and not slow.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        # and once the trainer is running under the supervisor (its handlers in place): its first step's line
        while lines is not None and not any("step 1 done" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.02)
        for signum in signums:
            while sent and lines is not None and not any("again" in line for line in lines):
                time.sleep(0.02)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()
    return sent


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_first_signal_asks_for_a_checkpoint_and_ends_interrupted(tmp_path, signum):
    # A hangup is delivered, as to a launcher on a terminal: under nohup (SIGHUP ignored, inherited) the launcher
    # keeps ignoring it on purpose (README: "under nohup a hangup is ignored"), and this test would test nohup.
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        _first_signal(tmp_path, signum)
    finally:
        signal.signal(signal.SIGHUP, previous)


def _first_signal(tmp_path, signum):
    session, stopping, paths = _session(tmp_path)
    lines: list[str] = []
    _signal_after(0.0, signum, lines=lines)
    result = _supervise(session, stopping, paths, lines)
    name = signal.Signals(signum).name
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 128 + signum), lines
    again = "Ctrl-C again" if signum == signal.SIGINT else f"{name} again"  # the signal received, a second time
    assert f"[grpo-launch] {name}: checkpoint at the end of step 7 requested; {again} to stop now (waiting up " \
           "to 20 s: a test)" in lines  # fmt: skip
    assert control.stopped_at(paths.root) is not None and result.message == f"interrupted by {name}"


def test_a_second_signal_stops_at_once(tmp_path):
    session, stopping, paths = _session(tmp_path, SLOW=str(tmp_path / "slow"))
    lines: list[str] = []
    sent = _signal_after(0.3, signal.SIGINT, signal.SIGINT, slow=tmp_path / "slow", lines=lines)
    result = _supervise(session, stopping, paths, lines)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 130), lines
    assert len(sent) == 2 and time.monotonic() - sent[1] < 10 and control.stopped_at(paths.root) is None
    assert any("SIGINT: stopping every process" in line for line in lines), lines


def test_without_a_run_directory_a_signal_stops_at_once(tmp_path):
    session, _, paths = _session(tmp_path)
    lines: list[str] = []
    _signal_after(0.0, signal.SIGTERM, lines=lines)
    result = supervise(session, environ=dict(os.environ), emit=lines.append)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 143)
    assert control.stopped_at(paths.root) is None


def test_a_request_the_trainers_made_on_their_own_signal_is_announced_and_ends_as_a_stop(tmp_path):
    """Slurm's preemption signals the trainers, not grpo-launch: their request (reason SIGTERM) is announced, and
    the attempt ends as a checkpoint-and-stop (the backend may requeue), not as an interruption."""
    session, stopping, paths = _session(tmp_path)
    threading.Timer(1.0, lambda: control.request_stop(paths.root, "SIGTERM")).start()
    lines: list[str] = []
    result = _supervise(session, stopping, paths, lines)
    assert (result.state, result.exit_code) == (RunState.SUCCEEDED, 0), lines
    assert control.stopped_at(paths.root) is not None
    assert any("the trainers received SIGTERM (a preemption's warning)" in line for line in lines), lines


def test_the_grace_running_out_stops_without_a_checkpoint(tmp_path):
    session, stopping, paths = _session(tmp_path, SLOW=str(tmp_path / "slow"))
    stopping = Stopping(grace_s=2.0, grace_why="a test")
    lines: list[str] = []
    _signal_after(0.3, signal.SIGTERM, slow=tmp_path / "slow")
    result = _supervise(session, stopping, paths, lines)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 143), lines
    assert "[grpo-launch] grace of 2 s ran out: stopped without a checkpoint" in lines
    assert control.stopped_at(paths.root) is None


def test_a_step_that_cannot_end_is_not_waited_for(tmp_path):
    """The progress watchdog's evidence says the step in flight cannot reach its end: the first signal stops at once
    and says why, with no checkpoint requested."""
    session, stopping, paths = _session(tmp_path, SLOW=str(tmp_path / "slow"))
    why = "step 7 has run 12 s, 40× the median: no checkpoint possible"
    stopping = dataclasses.replace(stopping, stuck=lambda: why)
    lines: list[str] = []
    sent = _signal_after(0.3, signal.SIGTERM, slow=tmp_path / "slow")
    result = _supervise(session, stopping, paths, lines)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 143), lines
    assert "[grpo-launch] SIGTERM: step 7 has run 12 s, 40× the median: no checkpoint possible; stopping now" in lines
    assert time.monotonic() - sent[0] < 10
    assert control.stop_reason(paths.root) is None and control.stopped_at(paths.root) is None


def test_a_step_that_stops_ending_while_the_stop_waits_ends_the_wait(tmp_path):
    """Asked for a checkpoint, the trainers' step then runs past every step measured: the wait ends there, not at the
    grace's end."""
    session, stopping, paths = _session(tmp_path, SLOW=str(tmp_path / "slow"))
    lines: list[str] = []
    sent = _signal_after(0.3, signal.SIGTERM, slow=tmp_path / "slow")

    def stuck() -> str | None:  # 2.8 s after the stop was asked for, the step in flight is found stuck
        return (
            "step 3 has run 9 s, 30× the median: no checkpoint possible"
            if sent and time.monotonic() > sent[0] + 2.8
            else None
        )

    stopping = dataclasses.replace(stopping, grace_s=60.0, stuck=stuck)
    result = _supervise(session, stopping, paths, lines)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 143), lines
    assert any("checkpoint at the end of step 7 requested" in line for line in lines), lines
    assert "[grpo-launch] step 3 has run 9 s, 30× the median: no checkpoint possible; stopping now" in lines
    assert time.monotonic() - sent[0] < 15 and control.stopped_at(paths.root) is None


def _watchdog_at(tmp_path, steps: list[float]):
    """A watchdog over metrics holding ``steps`` (seconds each) of this attempt, and its clock to move."""
    from grpo_launch.execute.watchdog import Watchdog
    from grpo_launch.rundir.records import StepRecord, append

    now = [1000.0]
    metrics = tmp_path / "metrics.jsonl"
    dog = Watchdog(metrics, clock=lambda: now[0])
    for i, s in enumerate(steps, start=1):
        append(metrics, StepRecord(i, s, s / 2, s / 2, max_steps=50))
    dog()
    return dog, now


def test_the_watchdog_says_when_the_step_in_flight_cannot_end(tmp_path):
    """STUCK_FACTOR × the longest step measured after the attempt's first (its warm-up), and at least STUCK_FLOOR_S:
    short steps are judged by the floor, long ones by the longest (a step with a generation round every few steps
    is not taken for a hang), and a slow first step does not widen the bound."""
    from grpo_launch.execute.watchdog import STUCK_FACTOR, STUCK_FLOOR_S

    dog, now = _watchdog_at(tmp_path, [30.0, 0.08, 0.08])
    now[0] += STUCK_FLOOR_S - 0.5
    assert dog.stuck() is None
    now[0] += 5.5
    assert dog.stuck() == "step 4 has run 10 s, 125× the median: no checkpoint possible"
    long, now = _watchdog_at(tmp_path / "b", [3.0, 20.0, 2.0, 2.0])
    now[0] += STUCK_FACTOR * 20.0 - 1
    assert long.stuck() is None  # 99 s: within five of its longest step
    now[0] += 2
    assert long.stuck() is not None
    only, now = _watchdog_at(tmp_path / "c", [4.0])  # one step: it is all there is to judge by
    now[0] += STUCK_FACTOR * 4.0 + 1
    assert only.stuck() is not None


def test_the_watchdog_does_not_judge_the_first_step(tmp_path):
    """Before this attempt's first step the step in flight loads, compiles and warms up: unknown, never stuck."""
    from grpo_launch.execute.watchdog import Watchdog

    now = [1000.0]
    dog = Watchdog(tmp_path / "metrics.jsonl", clock=lambda: now[0])
    now[0] += 600
    assert dog.stuck() is None


def test_a_spot_task_declares_the_reclaim_notice_and_the_stop_fits_it():
    """A SkyPilot spot task: the shortest of the clouds' reclaim notices (30 s) is in the task's environment, and a
    stop there waits 25 s for its checkpoint; without it the default; launch.stop_grace_s wins over both."""
    import yaml

    from grpo_launch.backends.skypilot.task import SPOT_NOTICE_S, SkyTaskRequest, render_task
    from grpo_launch.execute.run import notice_grace
    from grpo_launch.rundir.layout import STOP_NOTICE_ENV

    spot = SkyTaskRequest(name="grpo-x", recipe="r.yaml", workdir="/w", run_dir="runs/x", use_spot=True)
    envs = yaml.safe_load(render_task(spot))["envs"]
    assert envs[STOP_NOTICE_ENV] == f"{SPOT_NOTICE_S:g} a spot instance's reclaim"
    assert notice_grace(envs) == (25.0, "a spot instance's reclaim's notice 30 s, less 5 s to stop")
    plain = SkyTaskRequest(name="grpo-x", recipe="r.yaml", workdir="/w", run_dir="runs/x")
    assert STOP_NOTICE_ENV not in yaml.safe_load(render_task(plain))["envs"]
    assert notice_grace({}) is None and notice_grace({STOP_NOTICE_ENV: "soon"}) is None


def test_every_hosts_guard_stops_within_the_runs_grace(tmp_path):
    """ssh and Ray hosts: the shim's guard is given the run's launch.grace_period_s, not a fixed 10 s."""
    from grpo_launch.backends.ssh import remote_command
    from grpo_launch.rundir.layout import GRACE_ENV, RUN_ID_ENV
    from grpo_launch.spec import ProcessSpec

    spec = ProcessSpec("train@h1", ("python", "-c", "pass"), host="h1", env={RUN_ID_ENV: "r1@h1", GRACE_ENV: "7"})
    line = remote_command(spec, python="python3", workdir=str(tmp_path), gpu_positions=None, stdin_env=False)
    assert "--guard r1@h1 --grace 7 --" in line
