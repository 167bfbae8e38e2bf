"""launch.adapt's re-split from layout to layout: the course a run keeps (the splits tried, the re-splits made, the
split the last one replaced), when a layout's decision is due, and what a move makes of it (the course after it and
the plan to resume on). Pure: :mod:`grpo_launch.execute.resplit` reads the measurements, asks
:func:`.decision.decide`, records the decisions and stops the trainers; the attempt loop resumes on the plan
:meth:`Course.after` returns."""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import AdaptAction
from grpo_launch.planning.adapt_terms import warmup_steps
from grpo_launch.planning.after_run.decision import Adaptation, Previous, split_key
from grpo_launch.planning.types import Plan
from grpo_launch.spec import frozen


def decision_due(plan: Plan, new_steps: int) -> bool:
    """Whether a layout's decision is due once ``new_steps`` of its steps are recorded: the first (which compiles and
    warms up, so it is left out) and :func:`~grpo_launch.planning.adapt_terms.warmup_steps` more."""
    return new_steps >= warmup_steps(plan) + 1


@frozen
class Course:
    """What a run's re-splits so far bind the next decision to (:func:`.decision.decide`'s ``tried``,
    ``resplits`` and ``previous``)."""

    tried: tuple[str, ...] = ()  # every split the run has run, in order
    resplits: int = 0  # moves made (reverts do not count: launch.adapt_max_resplits bounds the moves)
    previous: Previous | None = None  # the split the last re-split replaced, whose measured time decides a revert

    def starting(self, plan: Plan) -> Course:
        """The course once ``plan``'s layout starts: its split counts as tried."""
        key = split_key(plan)
        return self if key in self.tried else dataclasses.replace(self, tried=(*self.tried, key))

    def after(self, running: Plan, adaptation: Adaptation) -> tuple[Course, Plan]:
        """The course after a move away from ``running``, and the plan to resume on. A re-split counts and remembers
        what it replaced; a revert returns to a measured split, which leaves nothing to compare it with."""
        if not adaptation.action.moves or adaptation.plan is None:
            raise ValueError(f"a {adaptation.action} decision has no plan to move to")
        if adaptation.action == AdaptAction.RESPLIT:
            previous = Previous(running, adaptation.measured_s)
            return dataclasses.replace(self, resplits=self.resplits + 1, previous=previous), adaptation.plan
        return dataclasses.replace(self, previous=None), adaptation.plan
