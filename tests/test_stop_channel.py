"""One stop channel and one decision after an attempt (execute/stop_channel.py, execute/policy.py).

Every way the launcher asks the trainers for a checkpoint and stop goes through the run's StopChannel, made once by
the attempt loop and handed to each part that asks (the signal handlers, the progress watchdog, launch.adapt, a
server given up, a backend's drain). What follows an attempt, a re-split included, is next_action's decision."""

from __future__ import annotations

import ast
import time

from grpo_launch.enums import FailureKind, RunState
from grpo_launch.execute.policy import Action, Spent, next_action
from grpo_launch.execute.stop_channel import StopChannel
from grpo_launch.execute.watchdog import Watchdog
from grpo_launch.rundir import control
from grpo_launch.spec import Failure, RunResult

from .helpers import ROOT, TINY_RECIPE, plan_recipe

SRC = ROOT / "src" / "grpo_launch"


def _imports_control(path) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "grpo_launch.rundir"
            and any(a.name == "control" for a in node.names)
        ):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "grpo_launch.rundir.control" in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        ):
            return True
    return False


def test_on_the_launchers_side_only_the_channel_touches_the_control_files():
    """The launcher's side (execute/, backends/) reaches the control directory only through StopChannel: a change to
    what a stop means is made in one module. The trainers' side (train/, node/) writes its answers there itself."""
    launcher_side = [*sorted((SRC / "execute").rglob("*.py")), *sorted((SRC / "backends").rglob("*.py"))]
    touching = [str(p.relative_to(SRC)) for p in launcher_side if _imports_control(p)]
    assert touching == ["execute/stop_channel.py"], touching


def test_the_channel_asks_once_keeps_the_first_reason_and_reads_the_answer(tmp_path):
    said: list[str] = []
    stop = StopChannel(tmp_path / "run", said.append)
    stop.reset()
    assert stop.reason() is None and stop.stopped_at() is None
    stop.request("the allocation ends in 90 s: saving a checkpoint now")
    stop.request(reason="Ray: node n2 is being drained")  # a second asker: the first reason stands
    assert stop.reason() == control.LAUNCHER
    assert said == ["[grpo-launch] the allocation ends in 90 s: saving a checkpoint now"]
    control.mark_stopped(tmp_path / "run", 12)  # the trainers' answer (rank 0, at the end of step 12)
    assert stop.stopped_at() == 12
    stop.reset()  # the next attempt starts clean
    assert stop.reason() is None and stop.stopped_at() is None


def test_the_watchdogs_deadline_asks_through_the_channel(tmp_path):
    """The allocation's end drawing near: the watchdog's deadline stop is the channel's request, said once."""
    said: list[str] = []
    stop = StopChannel(tmp_path / "run", said.append)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    dog = Watchdog(metrics, deadline=time.time() + 10, on_deadline=stop.request)
    assert dog() is None and dog() is None
    assert stop.reason() == control.LAUNCHER
    assert len(said) == 1 and "before the time limit" in said[0], said


def test_a_pending_resplit_is_next_actions_decision():
    """launch.adapt's move is decided with everything else after an attempt: a checkpoint-and-stop with a re-split
    pending is a RESPLIT (not the end of the run); the same stop without one ends the run; a failure with one
    pending is judged as a failure (the move waits for a stop it asked for)."""
    plan = plan_recipe(TINY_RECIPE, "cpu")
    stopped = RunResult(RunState.STOPPED_FOR_CHECKPOINT, 0, stopped_at_step=6)
    step = next_action(plan, stopped, Spent(), max_restarts=0, resplit="vLLM 1 GPU + train 3")
    assert step.action == Action.RESPLIT and step.note == "adapt: resuming from step 6 on vLLM 1 GPU + train 3"
    assert next_action(plan, stopped, Spent(), max_restarts=0).action == Action.STOP
    lost = RunResult(RunState.FAILED, 1, message="lost", failure=Failure(FailureKind.INFRA, "lost"))
    assert next_action(plan, lost, Spent(), max_restarts=1, resplit="x").action == Action.RESTART
    assert next_action(plan, lost, Spent(), max_restarts=0, resplit="x").action == Action.STOP
