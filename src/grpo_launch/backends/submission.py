"""Handing a run to a batch system (``grpo-launch sbatch``, ``ray-submit``, ``sky``): the Submitter protocol and what
passes through it. Each submitting backend implements it in its own folder (``slurm/submit.py``, ``ray/submit.py``,
``skypilot/``); this module is the protocol, as :mod:`.base` is the Backend's. Imported by the submitting verbs
only: planning and running a plan never need it."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

from grpo_launch.backends.base import BackendOptions
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.machines.topology import Topology
    from grpo_launch.planning.plan_types import Plan
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


# A submitter's own options class (``Options`` names it at run time: tests/test_backends.py checks they agree).
SubmitOptionsT = TypeVar("SubmitOptionsT", bound=BackendOptions, contravariant=True)


class Submitter(Protocol[SubmitOptionsT]):
    """A backend that hands the run to a batch system (``grpo-launch sbatch``), with options of type
    ``SubmitOptionsT``; each derives from ``Submitter[ItsOptions]``."""

    Options: ClassVar[type[BackendOptions]]

    @classmethod
    def requested_topology(cls, options: SubmitOptionsT, local: Topology) -> Topology:
        """The machines the submission asks for, to plan before submitting."""
        ...

    def request(self, job: SubmitJob, plan: Plan, options: SubmitOptionsT, ctx: RunContext) -> Submission:
        """The submission as data (pure)."""
        ...

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        """Submit; returns the job id."""
        ...
