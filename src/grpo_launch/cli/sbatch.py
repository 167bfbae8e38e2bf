"""``grpo-launch sbatch RECIPE --nodes N``: plan for the requested allocation, write RUN_DIR/job.sbatch, submit."""

from __future__ import annotations

import argparse
import dataclasses

from grpo_launch.cli.common import VERB_HELP
from grpo_launch.cli.submitting import add_submit_args, emit_dry_run, plan_submission, write_submission
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.spec import RunContext

DESCRIPTION = (
    "Plan for N nodes × G GPUs, write RUN_DIR/job.sbatch and submit it. Inside the job grpo-launch plans for the real "
    "allocation, starts the vLLM server and one trainer step per node with srun, and tears everything down on "
    "failure, scancel or the time limit. 90 s before the limit (SIGUSR2) the trainers save a checkpoint and the job "
    "requeues itself; the requeued run resumes from it. A preemption (PreemptMode=REQUEUE) sends SIGTERM to the "
    "trainers within the partition's GraceTime: they save a checkpoint at the end of the step and the job requeues "
    "itself the same way (give the partition a GraceTime that covers a step and a save). Arguments after `--` go to "
    "sbatch unchanged."
)


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "sbatch",
        help=VERB_HELP["sbatch"],
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_submit_args(p, "slurm", "run directory on a file system all nodes share")
    p.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")


def _cpu_nodes(options, recipe):
    if recipe.values.get("use_cpu") is True and options.gpus_per_node is None:
        return dataclasses.replace(options, gpus_per_node=0)  # the recipe asks for CPU nodes
    return options


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    planned = plan_submission(args, ctx, "slurm", _cpu_nodes)
    if args.dry_run:
        return emit_dry_run(planned, ctx)
    plan, submission = planned.plan, planned.submission
    for line in planned.summary:
        ctx.emit(line)
    write_submission(planned, plan.paths.relative(plan.paths.sbatch_script), ctx)
    job_id = planned.submitter.submit(submission, ctx)
    ctx.emit(f"submitted Slurm job {job_id}: {submission.summary}")
    ctx.emit(f"  log:     {plan.run_dir}/slurm-{job_id}.out (and {plan.paths.logs}/ per process)")
    ctx.emit(f"  script:  {submission.path}")
    follow = command_line(["tail", "-f", f"{plan.run_dir}/slurm-{job_id}.out"])
    ctx.emit(f"  follow:  {follow}   cancel: {command_line(['scancel', job_id])}")
    return 0
