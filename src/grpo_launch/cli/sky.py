"""``grpo-launch sky RECIPE --accelerators H100:8 --nodes 2``: plan for the cluster, write RUN_DIR/sky-task.yaml,
and with ``--launch`` hand it to ``sky launch``."""

from __future__ import annotations

import argparse
import dataclasses
import os

from grpo_launch.cli.common import VERB_HELP
from grpo_launch.cli.submitting import add_submit_args, emit_dry_run, plan_submission
from grpo_launch.errors import ConfigError
from grpo_launch.rundir.files import write_run_files
from grpo_launch.rundir.invocation import write_invocation
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.spec import RunContext

DESCRIPTION = (
    "Plan for N nodes × the GPUs --accelerators names and write a SkyPilot task (RUN_DIR/sky-task.yaml); "
    "--launch runs `sky launch` on it, --dry-run prints it. SkyPilot copies this directory (the workdir) to every "
    "node; setup installs grpo-launch with its extras; the run section starts a Ray cluster of its own on port 6379 "
    "(SkyPilot's is 6380): node 0 is the head and, once every node has joined, runs `grpo-launch run --ray`, whose "
    "exit code is the task's. Secrets are declared by name only and passed from this environment with sky launch "
    "--secret: HF_TOKEN, HUGGING_FACE_HUB_TOKEN and WANDB_API_KEY where set here (WANDB_API_KEY always when "
    "report_to names wandb), the recipe's launch.pass_env names, and RAY_AUTH_TOKEN, the task's Ray cluster's token "
    "(--launch draws one when it is not exported). Needs "
    "the sky extra (pip install '.[sky]' in grpo-launch's checkout) and a cloud SkyPilot can use (sky check). "
    "--managed writes a managed job (sky jobs launch): SkyPilot relaunches it after a preemption and it resumes from "
    "its run directory, which --bucket or --volume keeps off the nodes."
)


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "sky",
        help=VERB_HELP["sky"],
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_submit_args(
        p,
        "skypilot",
        "run directory on the nodes; a relative one is in the copy of this directory",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the task YAML; write and launch nothing")
    mode.add_argument("--launch", action="store_true", help="write the task and run sky launch -c CLUSTER on it")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    def cpu_or_gpus(options, recipe):
        if options.accelerators is None and recipe.values.get("use_cpu") is not True:
            raise ConfigError(
                "which GPUs? --accelerators is missing, and the recipe does not ask for CPU (use_cpu: true)",
                hint="e.g. grpo-launch sky RECIPE --accelerators H100:8 --nodes 2 (`sky show-gpus` lists the names)",
            )
        if options.accelerators is not None and recipe.values.get("use_cpu") is True:
            ctx.emit("notice: the recipe sets use_cpu: true, so the task asks for CPU nodes (--accelerators ignored)")
            return dataclasses.replace(options, accelerators=None)
        return options

    planned = plan_submission(args, ctx, "skypilot", cpu_or_gpus)
    if args.dry_run:
        return emit_dry_run(planned, ctx)
    submitter, submission, plan = planned.submitter, planned.submission, planned.plan
    if args.launch:
        submitter.launch_argv(submission, ctx)  # refuse before writing: no sky command, or a secret not set
    for line in planned.summary:
        ctx.emit(line)
    write_run_files(plan.run_dir, {os.path.basename(submission.path): submission.text})
    ctx.emit(f"wrote {submission.path}: {submission.summary}")
    verb = ["sky", "jobs", "launch", "-n"] if submitter.managed else ["sky", "launch", "-c"]
    launch = command_line(
        [*verb, submitter.cluster, submission.path, *(a for s in submitter.secrets for a in ("--secret", s))]
    )
    if not args.launch:
        ctx.emit(f"  launch:  {launch}   (or grpo-launch sky … --launch)")
        return 0
    write_invocation(planned.invocation)  # `grpo-launch resume` launches it again
    cluster = submitter.submit(submission, ctx)
    if submitter.managed:
        ctx.emit(
            f"launched the SkyPilot managed job {cluster}: after a preemption SkyPilot relaunches it and it "
            "resumes from its run directory"
        )
        follow, stop = (
            command_line(["sky", "jobs", "logs", "-n", cluster]),
            command_line(["sky", "jobs", "cancel", "-n", cluster]),
        )
        ctx.emit(f"  follow:  {follow}   status: sky jobs queue   stop: {stop}")
        return 0
    ctx.emit(f"launched on SkyPilot cluster {cluster}")
    follow, status, down = (command_line(["sky", verb, cluster]) for verb in ("logs", "status", "down"))
    ctx.emit(f"  follow:  {follow}   status: {status}   stop paying: {down}")
    return 0
