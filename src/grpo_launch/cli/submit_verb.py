"""``grpo-launch VERB RECIPE …`` for a verb that hands the run to a batch system: ``sbatch``, ``ray-submit``, ``sky``
and another package's backend's ``submit_verb``. The verb is the backend's, the work its ``Submitter``'s
(grpo_launch.backends.submission): plan for the machines the submitter requests (refusing what cannot run), and with
``--dry-run`` print the submission; without, the submitter's ``finish`` (BaseSubmitter's: write it into the run
directory with the command's record, which ``grpo-launch resume`` submits again, submit it and say how to follow the
job; ``sky`` writes the task and launches it only with ``--launch``)."""

from __future__ import annotations

import argparse

from grpo_launch.backends import load_submitter, submit_verb
from grpo_launch.cli.submitting import add_submit_args, emit_dry_run, plan_submission
from grpo_launch.spec import RunContext, frozen


@frozen
class SubmitCommand:
    """The submit verb ``verb``: what grpo_launch.cli asks of a verb, ``register`` and ``command``."""

    verb: str

    def register(self, sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
        submitter = load_submitter(self.verb)
        entry = submit_verb(self.verb)
        assert entry is not None  # load_submitter found it
        p = sub.add_parser(
            self.verb,
            help=entry.help,
            description=submitter.description
            or f"Plan for the machines the {entry.recorded_as} backend's submitter asks for, write its submission into "
            "the run directory and submit it. Arguments after `--` go to it unchanged.",
            epilog=epilog,
            formatter_class=formatter,
        )
        add_submit_args(p, self.verb, submitter.run_dir_help)
        p.add_argument("--dry-run", action="store_true", help="print the submission; write and submit nothing")

    def command(self, args: argparse.Namespace, ctx: RunContext) -> int:
        planned = plan_submission(args, ctx, self.verb)
        if args.dry_run:
            return emit_dry_run(planned, ctx)
        planned.submitter.finish(planned, ctx)
        return 0
