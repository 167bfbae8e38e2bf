"""``grpo-launch ray-submit RECIPE --ray HOST:PORT``: plan on the live Ray cluster, write RUN_DIR/ray-job.sh and
submit it as one Ray job (backends/ray/submit.py)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

from grpo_launch.backends.ray.submit import dashboard_of
from grpo_launch.cli.common import VERB_HELP
from grpo_launch.cli.submitting import add_submit_args, emit_dry_run, plan_submission, write_submission
from grpo_launch.errors import ConfigError
from grpo_launch.spec import RunContext

DESCRIPTION = (
    "Plan on the Ray cluster at --ray (each node probed in a task pinned to it), write RUN_DIR/ray-job.sh and submit "
    "it as a Ray job through Ray's job SDK: the job runs that file by path (its command line is parsed once), and "
    "RAY_AUTH_TOKEN, when set here, is sent to a cluster with token authentication. The job's driver runs "
    "`grpo-launch run` on the head node: it reserves each host's GPUs in a placement group, runs the processes in "
    "actors on their planned nodes, supervises and tears down as `run --ray` does. The run directory, the Python "
    "environment and the recipe's paths must be the same on every node (a shared file system). Arguments after `--` "
    "are `ray job submit`'s options (--runtime-env-json, --entrypoint-num-cpus, …), read by Ray's own parser."
)


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "ray-submit",
        help=VERB_HELP["ray-submit"],
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_submit_args(p, "ray", "run directory on a file system all nodes share")
    p.add_argument("--dry-run", action="store_true", help="print the submission; submit nothing")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    def address(options, recipe):
        if options.gpus and not args.dry_run:
            raise ConfigError(
                "ray-submit --gpus plans without a cluster: it is for --dry-run",
                hint="Submit with --ray HOST:PORT (the live cluster is probed and planned on).",
            )
        if not options.address and ctx.environ.get("RAY_ADDRESS"):
            return dataclasses.replace(options, address=ctx.environ["RAY_ADDRESS"])
        return options

    planned = plan_submission(args, ctx, "ray", address)
    if args.dry_run:
        return emit_dry_run(planned, ctx)
    plan, submission = planned.plan, planned.submission
    for line in planned.summary:
        ctx.emit(line)
    write_submission(planned, plan.paths.relative(plan.paths.ray_job_script), ctx)
    job_id = planned.submitter.submit(submission, ctx)
    dashboard = dashboard_of(planned.options, planned.options.address)
    ctx.emit(f"submitted Ray job {job_id} (plan {plan.topology.describe()})")
    ctx.emit(f"  follow:  {shlex.join(['ray', 'job', 'logs', '-f', job_id, '--address', dashboard])}")
    status = shlex.join(["grpo-launch", "status", plan.run_dir])
    ctx.emit(f"  logs:    {shlex.quote(str(plan.paths.logs))}/ per process   status: {status}")
    ctx.emit(f"  stop:    {shlex.join(['ray', 'job', 'stop', job_id, '--address', dashboard])}")
    return 0
