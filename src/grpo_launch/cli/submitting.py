"""What the submit verbs share (cli/submit_verb.py: ``sbatch``, ``ray-submit``, ``sky``, another package's): their
arguments, and planning the submission before anything is written (refuse what cannot run; in a run's directory, say
where it continues and refuse what ``resume`` refuses), then ``--dry-run``'s output. Writing and submitting it is the
submitter's (grpo_launch.backends.submission)."""

from __future__ import annotations

import argparse
import os

from grpo_launch.backends import load_submitter, submit_verb
from grpo_launch.backends.submission import Planned, SubmitJob
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
from grpo_launch.spec import RunContext


def add_submit_args(p: argparse.ArgumentParser, verb: str, run_dir_help: str) -> None:
    """RECIPE and its overrides, the verb's submitter's options, --run-dir, the launch flags and --max-restarts."""
    add_recipe_args(p)
    p.set_defaults(invocation_parser=p)  # its flags are recorded as given (common.invocation_of)
    add_options(p, load_submitter(verb).Options)
    p.add_argument("--run-dir", help=f"{run_dir_help} {RUN_DIR_DEFAULT}")
    add_launch_flags(p)
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restarts after a failure that is not the recipe's code (same as launch.max_restarts=N)",
    )


def plan_submission(args: argparse.Namespace, ctx: RunContext, verb: str) -> Planned:
    """Plan for what the submit verb's submitter asks for and render it (pure past the submitter's own probe)."""
    submitter_cls = load_submitter(verb)
    extra, dry_run = tuple(getattr(args, "extra", ())), bool(getattr(args, "dry_run", False))
    if extra and not submitter_cls.passes_args:
        raise ConfigError(
            f"{verb} takes no arguments after `--` (given: {' '.join(extra)})",
            hint=f"Its options are its flags: grpo-launch {verb} --help.",
        )
    options = read_options(args, submitter_cls.Options)
    recipe = load(args)
    options = submitter_cls.adjusted(options, recipe, ctx, dry_run=dry_run)
    topology = submitter_cls.requested_topology(options, probe_local(ctx.environ))
    plan = plan_on(topology, recipe, args, ctx)  # refuse before submitting what cannot run
    prefix = "# " if dry_run else ""
    # launch.pass_env said, not refused: the job's own `grpo-launch run` refuses it where its environment lacks it.
    preflight(plan, ctx, Stage.SUBMIT, warn=lambda w: ctx.emit(f"{prefix}warning: {w}"))
    check_continuity(plan, args, ctx, prefix)
    resuming = getattr(args, "resuming", None)
    entry = submit_verb(verb)
    assert entry is not None  # load_submitter found it
    invocation = resuming.record if resuming else invocation_of(args, entry.recorded_as, plan.run_dir, ctx)
    if invocation.redacted:  # the job's script holds the command as given: it cannot be redacted and still run
        raise ConfigError(
            f"the command holds a secret ({', '.join(invocation.redacted)}), which the submission would write into "
            "the run directory (the job's script runs the command as given)",
            hint="Export it and name it in `launch.pass_env` (the job gets it from the environment, by name).",
        )
    submitter = submitter_cls()
    # The batch is the user's algorithm: the job plans again inside its allocation at this batch, or refuses.
    pins = [] if plan.train.device == "cpu" else batch_pins(plan.layout)
    job = SubmitJob(os.path.abspath(args.recipe), (*flag_overrides(args), *pins), extra)
    submission = submitter.request(job, plan, options, ctx)
    pinned = [f"batch pinned: {' '.join(pins)} (the job plans again in its allocation at this batch, or stops)"]
    lines = tuple(summary_lines(plan) + (pinned if pins else []))
    return Planned(submitter, options, plan, submission, lines, invocation)


def emit_dry_run(planned: Planned, ctx: RunContext) -> int:
    """The submission as it would be written, then the plan's summary as comments."""
    ctx.emit(planned.submission.text.rstrip("\n"))
    ctx.emit("\n".join("# " + line for line in planned.summary))
    return 0
