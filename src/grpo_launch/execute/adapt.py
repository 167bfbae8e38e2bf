"""``launch.adapt`` in a running run, the side that acts: after each layout's warm-up, read its steps and ask
:func:`grpo_launch.planning.after_run.adapt.decide`; on a re-split (or a revert) ask the trainers to save a
checkpoint and stop at the end of the step, and hand the new plan to the attempt loop (:mod:`.run`), which resumes
from that checkpoint on the new layout: no optimizer step is lost or repeated (the resume path is the one SIGUSR2
and the time limit use). The course from layout to layout is :mod:`grpo_launch.planning.after_run.adapt`'s.

Every decision is kept with the attempt it was made in (``attempts.jsonl``, as
:class:`~grpo_launch.rundir.records.AdaptRecord`: ``status`` and the report show them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from grpo_launch.analysis.step_means import read_run
from grpo_launch.execute.stop_channel import StopChannel
from grpo_launch.planning.adapt_terms import why_not_adaptable
from grpo_launch.planning.after_run.adapt import Adaptation, Course, decide, decision_due
from grpo_launch.planning.plan_types import Plan
from grpo_launch.rundir.records import AdaptRecord


@dataclass
class Adapter:
    """The adaptation state of one run: its course of re-splits, the decision waiting for the attempt to stop
    (``pending``) and this attempt's decisions, for its record."""

    plan: Plan
    emit: Callable[[str], None]
    stop: StopChannel  # a move asks for the checkpoint it resumes from through the run's stop channel
    course: Course = field(default_factory=Course)
    pending: Adaptation | None = None
    decisions: list[AdaptRecord] = field(default_factory=list)
    _after: int = 0  # the last step before this layout started
    _decided: bool = False

    def begin(self, plan: Plan, after_step: int) -> None:
        """A new attempt of ``plan`` starts; its steps follow ``after_step``, the newest the run recorded."""
        self.plan, self.pending, self.decisions, self._decided = plan, None, [], False
        self._after = after_step
        self.course = self.course.starting(plan)

    def on_step(self, new_steps: int) -> None:
        """Called by the watchdog after each new step of the attempt: decides once, when the decision is due."""
        if self._decided or not decision_due(self.plan, new_steps):
            return
        self._decided = True
        measured = read_run(self.plan.run_dir, after_step=self._after)
        course = self.course
        adaptation = decide(self.plan, measured, tried=course.tried, resplits=course.resplits, previous=course.previous)
        self.decisions.append(adaptation.record())
        self.emit(f"[grpo-launch] adapt at step {adaptation.at_step}: {adaptation.action}: {adaptation.reason}")
        if adaptation.action.moves and adaptation.plan is not None:
            self.pending = adaptation
            self.stop.request(
                f"adapt: saving a checkpoint at the end of this step, then resuming on {adaptation.new_split}"
            )

    def move(self) -> Plan:
        """Take the pending decision: the plan to resume on."""
        assert self.pending is not None
        self.course, plan = self.course.after(self.plan, self.pending)
        self.pending = None
        return plan


def adapter_for(plan: Plan, emit: Callable[[str], None], stop: StopChannel) -> Adapter | None:
    """launch.adapt's state for this run, when it is asked for and the plan can adapt (else it says why not)."""
    if not plan.recipe.launch.adapt:
        return None
    why = why_not_adaptable(plan)
    if why is not None:
        emit(f"[grpo-launch] launch.adapt: off for this run: {why}")
        return None
    return Adapter(plan, emit, stop)
