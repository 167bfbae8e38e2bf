"""Handing a run to a batch system (``grpo-launch sbatch``, ``ray-submit``, ``sky``): the Submitter protocol and what
passes through it. Each submitting backend implements it in its own folder (``slurm/submit.py``, ``ray/submit.py``,
``skypilot/``); this module is the protocol, as :mod:`.base` is the Backend's. Imported by the submitting verbs
only: planning and running a plan never need it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.machines.topology import Topology
    from grpo_launch.planning.types import Plan
    from grpo_launch.spec import RunContext


@frozen
class Submission:
    """What a Submitter would submit: the script text (``--dry-run`` prints it) and where it is written."""

    text: str
    path: str
    summary: str = ""


@frozen
class SubmitJob:
    """What ``grpo-launch sbatch`` asks a Submitter to run: the recipe (absolute path) and its overrides, the
    arguments passed to the batch system unchanged."""

    recipe: str
    overrides: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()


class Submitter(Protocol):
    """A backend that hands the run to a batch system (``grpo-launch sbatch``)."""

    Options: ClassVar[type]

    @classmethod
    def requested_topology(cls, options: Any, local: Topology) -> Topology:
        """The machines the submission asks for, to plan before submitting."""
        ...

    def request(self, job: SubmitJob, plan: Plan, options: Any, ctx: RunContext) -> Submission:
        """The submission as data (pure)."""
        ...

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        """Submit; returns the job id."""
        ...
