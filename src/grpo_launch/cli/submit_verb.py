"""``grpo-launch VERB RECIPE …`` for a backend from another package that hands runs to its batch system: the verb is
its class's ``submit_verb``, the work its ``Submitter``'s. As ``grpo-launch sbatch`` does for Slurm, it plans for the
machines the submitter requests (refusing what cannot run), writes the submission and the command's record into the
run directory (``grpo-launch resume`` submits it again) and submits it; ``--dry-run`` prints it."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpo_launch.cli.submitting import add_submit_args, emit_dry_run, plan_submission, write_submission
from grpo_launch.errors import LaunchError
from grpo_launch.spec import RunContext, frozen


@frozen
class SubmitVerb:
    """The verb ``verb`` of the backend ``backend`` (another package's): what grpo_launch.cli asks of a verb's
    module, ``register`` and ``command``."""

    verb: str
    backend: str

    def register(self, sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
        p = sub.add_parser(
            self.verb,
            help=f"plan for the {self.backend} backend's machines and submit the run to them",
            description=f"Plan for the machines the {self.backend} backend's submitter asks for, write its "
            "submission into the run directory and submit it. Arguments after `--` go to it unchanged.",
            epilog=epilog,
            formatter_class=formatter,
        )
        add_submit_args(p, self.backend, "run directory the job can reach")
        p.add_argument("--dry-run", action="store_true", help="print the submission; submit nothing")

    def command(self, args: argparse.Namespace, ctx: RunContext) -> int:
        planned = plan_submission(args, ctx, self.backend)
        if args.dry_run:
            return emit_dry_run(planned, ctx)
        plan, submission = planned.plan, planned.submission
        for line in planned.summary:
            ctx.emit(line)
        where = Path(submission.path)
        if where.is_absolute() and not where.is_relative_to(plan.paths.root):
            raise LaunchError(
                f"the {self.backend} backend would write its submission to {where}, outside the run directory "
                f"{plan.run_dir}",
                hint="Its Submitter.request must return a path in the plan's run directory (plan.paths.root).",
            )
        write_submission(planned, plan.paths.relative(where) if where.is_absolute() else str(where), ctx)
        job_id = planned.submitter.submit(submission, ctx)
        ctx.emit(f"submitted {self.backend} job {job_id}: {submission.summary}")
        ctx.emit(f"  submission: {submission.path}")
        return 0
