"""Handing a run to a batch system (``grpo-launch sbatch``, ``ray-submit``, ``sky``, another package's verb): the
Submitter protocol, what passes through it, and writing a submission into the run directory. Each submitting
backend implements it in its own folder (``slurm/submit.py``, ``ray/submit.py``, ``skypilot/``); this module is the
protocol, as :mod:`.base` is the Backend's. Imported by the submitting verbs only: planning and running a plan never
need it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from grpo_launch.backends.base import BackendOptions
from grpo_launch.errors import LaunchError
from grpo_launch.render import render_files
from grpo_launch.rundir.files import run_record, write_run_files
from grpo_launch.rundir.invocation import write_invocation
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.machines.topology import Topology
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.recipe import Recipe
    from grpo_launch.rundir.invocation import Invocation
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
SubmitOptionsT = TypeVar("SubmitOptionsT", bound=BackendOptions)


@frozen
class Planned:
    """A submission planned and rendered, not yet written or submitted (grpo_launch.cli.submitting plans it)."""

    submitter: Submitter[Any]
    options: Any  # the submitter's Options, as the command line and :meth:`Submitter.adjusted` left them
    plan: Plan
    submission: Submission
    summary: tuple[str, ...]  # the plan's summary lines, and the batch it pins
    invocation: Invocation  # the command, for RUN_DIR/invocation.json once submitted


class Submitter(Protocol[SubmitOptionsT]):
    """A backend's way of handing the run to a batch system, with options of type ``SubmitOptionsT``: its verb
    (``grpo-launch sbatch``) plans for :meth:`requested_topology`, refuses what cannot run, and with ``--dry-run``
    prints :meth:`request`'s submission; without, :meth:`finish` writes and submits it. Each derives from
    ``BaseSubmitter[ItsOptions]``."""

    Options: ClassVar[type[BackendOptions]]
    description: ClassVar[str]  # the verb's --help text
    run_dir_help: ClassVar[str]  # what --run-dir must be for its job
    passes_args: ClassVar[bool]  # arguments after `--` go to the batch system (else they are refused)

    @classmethod
    def adjusted(cls, options: SubmitOptionsT, recipe: Recipe, ctx: RunContext, *, dry_run: bool) -> SubmitOptionsT:
        """The options once the recipe is read (CPU nodes for a recipe that sets use_cpu), or a refusal."""
        ...

    @classmethod
    def requested_topology(cls, options: SubmitOptionsT, local: Topology) -> Topology:
        """The machines the submission asks for, to plan before submitting."""
        ...

    def request(self, job: SubmitJob, plan: Plan, options: SubmitOptionsT, ctx: RunContext) -> Submission:
        """The submission as data (pure)."""
        ...

    def finish(self, planned: Planned, ctx: RunContext) -> None:
        """Write the submission into the run directory with the command's record, submit it and say how to follow
        the job."""
        ...

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        """Submit; returns the job id."""
        ...

    def submitted(self, job_id: str, planned: Planned) -> list[str]:
        """What to print once submitted: the job, where it logs, how to follow and stop it."""
        ...


class BaseSubmitter(Generic[SubmitOptionsT]):
    """Defaults for a :class:`Submitter`: it writes the submission with the plan's files and the command's record,
    submits it and prints its job id."""

    Options: ClassVar[type[BackendOptions]] = BackendOptions
    description: ClassVar[str] = ""
    run_dir_help: ClassVar[str] = "run directory the job can reach"
    passes_args: ClassVar[bool] = True

    @classmethod
    def adjusted(cls, options: SubmitOptionsT, recipe: Recipe, ctx: RunContext, *, dry_run: bool) -> SubmitOptionsT:
        return options

    def finish(self, planned: Planned, ctx: RunContext) -> None:
        for line in planned.summary:
            ctx.emit(line)
        write_submission(planned, ctx)
        job_id = self.submit(planned.submission, ctx)
        for line in self.submitted(job_id, planned):
            ctx.emit(line)

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        raise NotImplementedError

    def submitted(self, job_id: str, planned: Planned) -> list[str]:
        return [f"submitted job {job_id}: {planned.submission.summary}", f"  submission: {planned.submission.path}"]


def write_submission(planned: Planned, ctx: RunContext, *, with_plan: bool = True) -> None:
    """The submission into the run directory and the command's record (``grpo-launch resume`` submits it again);
    ``with_plan``: the plan's files too, unless the directory holds a run's record (the job then resumes that
    run)."""
    plan, submission = planned.plan, planned.submission
    name = _in_run_dir(submission.path, plan.run_dir, ctx.workdir)
    files = {name: submission.text}
    if with_plan and (record := run_record(plan.run_dir)):
        names = " and ".join(p.name for p in record)
        ctx.emit(
            f"notice: {plan.run_dir} holds a run's record ({names}): only {name} is written; the job resumes "
            "that run (another --run-dir starts a new one)"
        )
    elif with_plan:
        files |= render_files(plan)
    write_run_files(plan.run_dir, files)
    write_invocation(planned.invocation)


def _in_run_dir(path: str, run_dir: str, workdir: str) -> str:
    """``path`` relative to the run directory (both relative to ``workdir`` unless absolute); refused outside it."""
    where = os.path.normpath(os.path.join(workdir, path))
    root = os.path.normpath(os.path.join(workdir, run_dir))
    relative = os.path.relpath(where, root)
    if relative == os.curdir or relative.split(os.sep)[0] == os.pardir:
        raise LaunchError(
            f"the submission would be written to {path}, outside the run directory {run_dir}",
            hint="A Submitter's request must return a path in the plan's run directory (plan.paths.root).",
        )
    return relative
