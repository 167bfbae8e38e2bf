"""``launch.adapt`` in a running run: after each layout's warm-up, ask :func:`grpo_launch.planning.adapt.decide`;
on a re-split (or a revert) ask the trainers to save a checkpoint and stop at the end of the step, and hand the new
plan to the attempt loop (:mod:`.run`), which resumes from that checkpoint on the new layout: no optimizer step is
lost or repeated (the resume path is the one SIGUSR2 and the time limit use).

Every decision is kept with the attempt it was made in (``attempts.jsonl``: ``status`` and the report show them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from grpo_launch.planning.adapt import Adaptation, split_key, warmup_steps
from grpo_launch.planning.replan import Previous, decide
from grpo_launch.planning.types import Plan
from grpo_launch.rundir import control
from grpo_launch.rundir.measured import read_run
from grpo_launch.rundir.records import StepRecord, read_metrics


def last_step(plan: Plan) -> int:
    """The newest optimizer step the run's metrics record (0 before the first)."""
    try:
        steps = [r.step for r in read_metrics(plan.paths.metrics) if isinstance(r, StepRecord)]
    except OSError:
        return 0
    return max(steps, default=0)


@dataclass
class Adapter:
    """The adaptation state of one run: the splits tried, the re-splits made, the split the last one replaced, and
    the decision waiting for the attempt to stop (``pending``)."""

    plan: Plan
    emit: Callable[[str], None]
    tried: list[str] = field(default_factory=list)
    resplits: int = 0
    previous: Previous | None = None
    pending: Adaptation | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)  # this attempt's, for its record
    _after: int = 0  # the last step before this layout started
    _decided: bool = False

    def begin(self, plan: Plan) -> None:
        """A new attempt of ``plan`` starts (its steps follow the ones already recorded)."""
        self.plan, self.pending, self.decisions, self._decided = plan, None, [], False
        self._after = last_step(plan)
        key = split_key(plan)
        if key not in self.tried:
            self.tried.append(key)

    def on_step(self, new_steps: int) -> None:
        """Called by the watchdog after each new step of the attempt: decides once, after the warm-up (the first
        step, which compiles and warms up, plus :func:`warmup_steps`)."""
        if self._decided or new_steps < warmup_steps(self.plan) + 1:
            return
        self._decided = True
        measured = read_run(self.plan.run_dir, after_step=self._after)
        adaptation = decide(self.plan, measured, tried=self.tried, resplits=self.resplits, previous=self.previous)
        self.decisions.append(adaptation.to_json())
        self.emit(f"[grpo-launch] adapt at step {adaptation.at_step}: {adaptation.action}: {adaptation.reason}")
        if adaptation.action != "keep" and adaptation.plan is not None:
            self.pending = adaptation
            self.emit("[grpo-launch] adapt: saving a checkpoint at the end of this step, then resuming on "
                      f"{adaptation.new_split}")  # fmt: skip
            control.request_stop(self.plan.run_dir)

    def move(self) -> Plan:
        """Take the pending decision: the plan to resume on."""
        assert self.pending is not None and self.pending.plan is not None
        adaptation, self.pending = self.pending, None
        if adaptation.action == "resplit":
            self.resplits += 1
            self.previous = Previous(self.plan, adaptation.measured_s)
        else:
            self.previous = None  # a revert returns to a measured split: nothing left to compare it with
        return cast("Plan", adaptation.plan)  # a move or a revert always carries its plan
