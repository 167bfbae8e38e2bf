"""What the verbs that hand a run to another system share (``sbatch``, ``ray-submit``, ``sky``): their arguments,
and planning the submission before anything is written (refuse what cannot run; in a run's directory, say where it
continues and refuse what ``resume`` refuses), then ``--dry-run``'s output, and the files written at submission with
the command's record (RUN_DIR/invocation.json: ``grpo-launch resume`` submits it again)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpo_launch.backends import load_submitter
from grpo_launch.backends.submission import SubmitJob
from grpo_launch.cli.common import (
    RUN_DIR_DEFAULT,
    add_launch_flags,
    add_recipe_args,
    flag_overrides,
    invocation_of,
    load,
    plan_on,
)
from grpo_launch.cli.options import add_options, read_options
from grpo_launch.cli.resume import check_continuity
from grpo_launch.cli.tables import summary_lines
from grpo_launch.errors import ConfigError
from grpo_launch.execute.preflight import Stage, preflight
from grpo_launch.planning.splits.batch_target import batch_pins
from grpo_launch.probe.local import probe_local
from grpo_launch.render import render_files
from grpo_launch.rundir.files import run_record, write_run_files
from grpo_launch.rundir.invocation import write_invocation
from grpo_launch.spec import RunContext, frozen

if TYPE_CHECKING:
    from grpo_launch.backends.submission import Submission
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.recipe import Recipe
    from grpo_launch.rundir.invocation import Invocation


def add_submit_args(p: argparse.ArgumentParser, submitter: str, run_dir_help: str) -> None:
    """RECIPE and its overrides, the submitter's options, --run-dir, the launch flags and --max-restarts."""
    add_recipe_args(p)
    p.set_defaults(invocation_parser=p)  # its flags are recorded as given (common.invocation_of)
    add_options(p, load_submitter(submitter).Options)
    p.add_argument("--run-dir", help=f"{run_dir_help} {RUN_DIR_DEFAULT}")
    add_launch_flags(p)
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restarts after a failure that is not the recipe's code (same as launch.max_restarts=N)",
    )


@frozen
class Planned:
    """A submission planned and rendered, not yet written or submitted."""

    submitter: Any
    options: Any
    plan: Plan
    submission: Submission
    summary: tuple[str, ...]
    invocation: Invocation  # the command, for RUN_DIR/invocation.json once submitted


def plan_submission(
    args: argparse.Namespace,
    ctx: RunContext,
    submitter_name: str,
    adjust: Callable[[Any, Recipe], Any] | None = None,
) -> Planned:
    """Plan for what the submission asks for and render it (pure past the submitter's own probe). ``adjust`` may
    change the options once the recipe is read (e.g. CPU nodes for a recipe that sets use_cpu)."""
    submitter_cls = load_submitter(submitter_name)
    options = read_options(args, submitter_cls.Options)
    recipe = load(args)
    if adjust is not None:
        options = adjust(options, recipe)
    topology = submitter_cls.requested_topology(options, probe_local(ctx.environ))
    plan = plan_on(topology, recipe, args, ctx)  # refuse before submitting what cannot run
    prefix = "# " if getattr(args, "dry_run", False) else ""
    # launch.pass_env said, not refused: the job's own `grpo-launch run` refuses it where its environment lacks it.
    preflight(plan, ctx, Stage.SUBMIT, warn=lambda w: ctx.emit(f"{prefix}warning: {w}"))
    check_continuity(plan, args, ctx, prefix)
    resuming = getattr(args, "resuming", None)
    invocation = resuming.record if resuming else invocation_of(args, submitter_name, plan.run_dir, ctx)
    if invocation.redacted:  # the job's script holds the command as given: it cannot be redacted and still run
        raise ConfigError(
            f"the command holds a secret ({', '.join(invocation.redacted)}), which the submission would write into "
            "the run directory (the job's script runs the command as given)",
            hint="Export it and name it in `launch.pass_env` (the job gets it from the environment, by name).",
        )
    submitter = submitter_cls()
    # The batch is the user's algorithm: the job plans again inside its allocation at this batch, or refuses.
    pins = [] if plan.train.device == "cpu" else batch_pins(plan.layout)
    job = SubmitJob(os.path.abspath(args.recipe), (*flag_overrides(args), *pins), tuple(getattr(args, "extra", ())))
    submission = submitter.request(job, plan, options, ctx)
    pinned = [f"batch pinned: {' '.join(pins)} (the job plans again in its allocation at this batch, or stops)"]
    lines = tuple(summary_lines(plan) + (pinned if pins else []))
    return Planned(submitter, options, plan, submission, lines, invocation)


def emit_dry_run(planned: Planned, ctx: RunContext) -> int:
    """The submission as it would be written, then the plan's summary as comments."""
    ctx.emit(planned.submission.text.rstrip("\n"))
    ctx.emit("\n".join("# " + line for line in planned.summary))
    return 0


def write_submission(planned: Planned, name: str, ctx: RunContext) -> None:
    """The submission into the run directory, with the plan's files unless it holds a run's record (the job then
    resumes that run)."""
    plan = planned.plan
    files = {name: planned.submission.text}
    if record := run_record(plan.run_dir):
        names = " and ".join(p.name for p in record)
        ctx.emit(
            f"notice: {plan.run_dir} holds a run's record ({names}): only {name} is written; the job resumes "
            "that run (another --run-dir starts a new one)"
        )
    else:
        files |= render_files(plan)
    write_run_files(plan.run_dir, files)
    write_invocation(planned.invocation)  # `grpo-launch resume` submits it again
