"""The parts of a stop on a signal (issue 36) that need no GRPO run: Slurm's grace read from scontrol's text, the
stop request and its reason, the shim's held SIGTERM (real processes), and the session's first and second signal
with a stand-in trainer that honours the request as the training entry does (tests/test_stop.py runs GRPO)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from grpo_launch.backends.slurm.preempt import AT_ONCE, grace_time_of, kill_wait_of, stop_grace, stops_at_once
from grpo_launch.enums import RunState
from grpo_launch.execute.session import SessionSpec, Stopping, supervise
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
# entry does (rank 0 writes the step it stopped at, exits 0). SLOW makes step 3 last 60 s.
TRAINER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {src!r})
    from grpo_launch.rundir import control
    from grpo_launch.rundir.layout import RunPaths
    run = sys.argv[1]
    for step in range(1, 1000):
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
    stopping = Stopping(request=lambda: control.request_stop(paths.root), grace_s=20.0, grace_why="a test",
                        step_in_flight=lambda: 7, requested=lambda: control.stop_reason(paths.root))  # fmt: skip
    return session, stopping, paths


def _signal_after(seconds: float, *signums: int) -> None:
    def send() -> None:
        for signum in signums:
            os.kill(os.getpid(), signum)
            time.sleep(0.3)

    threading.Timer(seconds, send).start()


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
    _signal_after(1.0, signum)
    result = supervise(session, environ=dict(os.environ), emit=lines.append, stopping=stopping)
    name = signal.Signals(signum).name
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 128 + signum), lines
    assert f"[grpo-launch] {name}: checkpoint at the end of step 7 requested; Ctrl-C again to stop now (waiting up " \
           "to 20 s: a test)" in lines  # fmt: skip
    assert control.stopped_at(paths.root) is not None and result.message == f"interrupted by {name}"


def test_a_second_signal_stops_at_once(tmp_path):
    session, stopping, paths = _session(tmp_path, SLOW="1")
    lines: list[str] = []
    _signal_after(1.5, signal.SIGINT, signal.SIGINT)
    t0 = time.monotonic()
    result = supervise(session, environ=dict(os.environ), emit=lines.append, stopping=stopping)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 130), lines
    assert time.monotonic() - t0 < 10 and control.stopped_at(paths.root) is None
    assert any("SIGINT: stopping every process" in line for line in lines), lines


def test_without_a_run_directory_a_signal_stops_at_once(tmp_path):
    session, _, paths = _session(tmp_path)
    _signal_after(1.0, signal.SIGTERM)
    result = supervise(session, environ=dict(os.environ), emit=lambda line: None)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 143)
    assert control.stopped_at(paths.root) is None


def test_a_request_the_trainers_made_on_their_own_signal_is_announced_and_ends_as_a_stop(tmp_path):
    """Slurm's preemption signals the trainers, not grpo-launch: their request (reason SIGTERM) is announced, and
    the attempt ends as a checkpoint-and-stop (the backend may requeue), not as an interruption."""
    session, stopping, paths = _session(tmp_path)
    threading.Timer(1.0, lambda: control.request_stop(paths.root, "SIGTERM")).start()
    lines: list[str] = []
    result = supervise(session, environ=dict(os.environ), emit=lines.append, stopping=stopping)
    assert (result.state, result.exit_code) == (RunState.SUCCEEDED, 0), lines
    assert control.stopped_at(paths.root) is not None
    assert any("the trainers received SIGTERM (a preemption's warning)" in line for line in lines), lines


def test_the_grace_running_out_stops_without_a_checkpoint(tmp_path):
    session, stopping, paths = _session(tmp_path, SLOW="1")
    stopping = Stopping(request=stopping.request, grace_s=2.0, grace_why="a test")
    lines: list[str] = []
    _signal_after(1.5, signal.SIGTERM)
    result = supervise(session, environ=dict(os.environ), emit=lines.append, stopping=stopping)
    assert (result.state, result.exit_code) == (RunState.INTERRUPTED, 143), lines
    assert "[grpo-launch] grace of 2 s ran out: stopped without a checkpoint" in lines
    assert control.stopped_at(paths.root) is None
