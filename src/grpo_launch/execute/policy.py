"""What follows an attempt: stop, restart from the newest complete checkpoint, or replan more frugally and
restart. Pure: the attempt's result and what has been spent so far in, the next action out.

- A success, a checkpoint-and-stop or an interruption ends the run, except a checkpoint-and-stop that launch.adapt
  asked for to move to another split (a re-split: the run resumes from that checkpoint on the new layout) or that the
  backend asked for because its machines are being taken away (a Ray node drain): that is a restart, on the
  machines there are.
- An out-of-memory failure: the plan's next memory fix (:mod:`grpo_launch.planning.after_run.oom`, on the
  side that ran out). With ``launch.on_oom: replan`` it is applied and the run restarts (at most
  :data:`MAX_OOM_REPLANS` times: each is one step more frugal, and there are only a few); otherwise the fix is
  named in the failure.
- A failure a restart may get past (a lost process, host or network; a hang) restarts up to
  ``launch.max_restarts`` times, with a backoff that doubles.
- Anything else (the recipe's own code, a full disk) ends the run.
"""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import FailureKind, OnOom, Role, RunState, StrEnum
from grpo_launch.planning.after_run.oom import next_frugal_plan
from grpo_launch.planning.plan_types import Plan
from grpo_launch.rundir.shown_text import with_article
from grpo_launch.spec import RunResult, frozen

MAX_OOM_REPLANS = 4  # launch.on_oom: replan, at most this many times in a run


class Action(StrEnum):
    STOP = "stop"
    RESTART = "restart"
    REPLAN = "replan"
    RESPLIT = "resplit"  # launch.adapt's pending move: resume from the checkpoint just saved, on the new layout


@frozen
class Spent:
    """What a run has used of its budgets so far."""

    restarts: int = 0
    replans: int = 0
    resplits: int = 0  # launch.adapt's moves to another split (their own budget: launch.adapt_max_resplits)

    @property
    def attempts(self) -> int:
        return self.restarts + self.replans + self.resplits


@frozen
class Next:
    """The next action, the result to end with (STOP), the plan to run next (REPLAN; a RESPLIT's is the adapter's
    pending one), how long to wait first, and what the launcher says about it."""

    action: Action
    result: RunResult
    plan: Plan | None = None
    wait_s: float = 0.0
    note: str | None = None


def _with_detail(result: RunResult, line: str) -> RunResult:
    return dataclasses.replace(result, detail=f"{result.detail or ''}\n{line}".strip())


def next_action(
    plan: Plan,
    result: RunResult,
    spent: Spent,
    *,
    max_restarts: int,
    disk_advice: str | None = None,
    leaving: str | None = None,
    resplit: str | None = None,
) -> Next:
    """What follows ``result``, an attempt of ``plan``. ``disk_advice`` is added to a full-disk failure;
    ``leaving``: why the backend had the attempt checkpoint and stop (its machines are being taken away, e.g. a Ray
    node drain), which makes the stop a restart; ``resplit``: the split launch.adapt decided to move to during the
    attempt (it asked for the checkpoint), which makes the stop a re-split (its own budget,
    launch.adapt_max_resplits, was counted when it was decided)."""
    if resplit is not None and result.state == RunState.STOPPED_FOR_CHECKPOINT:
        return Next(Action.RESPLIT, result, note=f"adapt: resuming from step {result.stopped_at_step} on {resplit}")
    if leaving and result.state == RunState.STOPPED_FOR_CHECKPOINT:
        return _restart_after_leaving(result, spent, max_restarts, leaving)
    failure = result.failure
    if result.ok or result.state == RunState.INTERRUPTED or failure is None:
        return Next(Action.STOP, result)
    if failure.kind == FailureKind.DISK_FULL and disk_advice:
        result = _with_detail(result, disk_advice)
    if failure.kind == FailureKind.OOM:
        frugal = next_frugal_plan(plan, vllm_side=failure.side == Role.VLLM, cause=failure.cause or "")
        if frugal is not None and plan.recipe.launch.on_oom == OnOom.REPLAN and spent.replans < MAX_OOM_REPLANS:
            new_plan, why = frugal
            return Next(Action.REPLAN, result, plan=new_plan, note=f"out of memory: replanned with {why}; restarting")
        if frugal is not None and plan.recipe.launch.on_oom != OnOom.REPLAN:
            line = f"the plan's next memory fix: {frugal[1]} (or set launch.on_oom: replan to apply it and restart)"
            result = _with_detail(result, line)
        return Next(Action.STOP, result)
    if not failure.retryable:
        return Next(Action.STOP, result)
    if spent.restarts >= max_restarts:
        note = f"no restart left (launch.max_restarts={max_restarts})" if max_restarts else None
        return Next(Action.STOP, result, note=note)
    restart = spent.restarts + 1
    wait = plan.recipe.launch.restart_backoff_s * 2 ** (restart - 1)
    startup = plan.estimate.startup_s if plan.estimate is not None else None
    again = f" (about {startup:.0f} s to the first step again)" if startup else ""
    note = (
        f"restart {restart}/{max_restarts} in {wait:.0f} s after {with_article(failure.kind)} failure "
        f"({result.cause or result.message}); resuming from the newest complete checkpoint{again}"
    )
    return Next(Action.RESTART, result, wait_s=wait, note=note)


def _restart_after_leaving(result: RunResult, spent: Spent, max_restarts: int, leaving: str) -> Next:
    """A stop with a checkpoint because machines are being taken away: a restart on the machines there are, at once
    (within launch.max_restarts: else the run ends stopped, and resuming it continues from the checkpoint)."""
    saved = f"checkpoint-{result.stopped_at_step}" if result.stopped_at_step is not None else "the newest checkpoint"
    if spent.restarts >= max_restarts:
        return Next(Action.STOP, result, note=f"{leaving}: no restart left (launch.max_restarts={max_restarts})")
    note = f"restart {spent.restarts + 1}/{max_restarts} after {leaving}: resuming from {saved}"
    return Next(Action.RESTART, result, note=note)
