"""``grpo-launch ray-submit RECIPE --ray HOST:PORT``: plan on the live Ray cluster, write RUN_DIR/ray-job.sh and
submit it as one Ray job."""

from __future__ import annotations

import argparse

from grpo_launch.backends import load_submitter as _load_submitter
from grpo_launch.cli.common import add_launch_flags, add_recipe_args, flag_overrides, load, plan_on
from grpo_launch.cli.options import add_options, read_options
from grpo_launch.spec import RunContext

DESCRIPTION = (
    "Plan on the Ray cluster at --ray (each node probed in a task pinned to it), write RUN_DIR/ray-job.sh and submit "
    "it with `ray job submit`. The job's driver runs `grpo-launch run` on the head node: it reserves each host's GPUs "
    "in a placement group, runs the processes in actors on their planned nodes, supervises and tears down as `run "
    "--ray` does. The run directory, the Python environment and the recipe's paths must be the same on every node "
    "(a shared file system). Arguments after `--` go to `ray job submit` unchanged."
)


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "ray-submit",
        help="plan on a Ray cluster and submit the run as a Ray job (ray job submit)",
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_recipe_args(p)
    add_options(p, _load_submitter("ray").Options)
    p.add_argument("--run-dir", help="run directory on a file system all nodes share (default: grpo_runs/NAME)")
    add_launch_flags(p)
    p.add_argument("--dry-run", action="store_true", help="print the submission; submit nothing")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    import dataclasses
    import os

    from grpo_launch.backends.submit import SubmitJob
    from grpo_launch.cli.tables import summary_lines
    from grpo_launch.execute.preflight import preflight
    from grpo_launch.probe.local import probe_local
    from grpo_launch.render import render_files
    from grpo_launch.rundir.files import run_record, write_run_files

    submitter_cls = _load_submitter("ray")
    options = read_options(args, submitter_cls.Options)
    if not options.address and ctx.environ.get("RAY_ADDRESS"):
        options = dataclasses.replace(options, address=ctx.environ["RAY_ADDRESS"])
    recipe = load(args)
    topology = submitter_cls.requested_topology(options, probe_local(ctx.environ))
    plan = plan_on(topology, recipe, args, ctx)  # refuse before submitting what cannot run
    preflight(plan, ctx.workdir)
    submitter = submitter_cls()
    job = SubmitJob(os.path.abspath(args.recipe), tuple(flag_overrides(args)), tuple(args.extra))
    submission = submitter.request(job, plan, options, ctx)
    summary = summary_lines(plan)
    if args.dry_run:
        ctx.emit(submission.text.rstrip("\n"))
        ctx.emit("\n".join("# " + line for line in summary))
        return 0
    for line in summary:
        ctx.emit(line)
    files = {"ray-job.sh": submission.text}
    if record := run_record(plan.run_dir):
        names = " and ".join(p.name for p in record)
        ctx.emit(f"notice: {plan.run_dir} holds a run's record ({names}): only ray-job.sh is written; the job "
                 "resumes that run (another --run-dir starts a new one)")  # fmt: skip
    else:
        files |= render_files(plan)
    write_run_files(plan.run_dir, files)
    job_id = submitter.submit(submission, ctx)
    ctx.emit(f"submitted Ray job {job_id} (plan {plan.topology.describe()})")
    ctx.emit(f"  follow:  ray job logs -f {job_id} --address {submission.text.split('--address ')[1].split()[0]}")
    ctx.emit(f"  logs:    {plan.paths.logs}/ per process   status: grpo-launch status --run-dir {plan.run_dir}")
    ctx.emit(f"  stop:    ray job stop {job_id}")
    return 0
