"""``grpo-launch sbatch RECIPE --nodes N``: plan for the requested allocation, write RUN_DIR/job.sbatch, submit."""

from __future__ import annotations

import argparse

from grpo_launch.backends import load_submitter as _load_submitter
from grpo_launch.cli.common import add_launch_flags, add_recipe_args, flag_overrides, load, plan_on
from grpo_launch.cli.options import add_options, read_options
from grpo_launch.spec import RunContext

DESCRIPTION = (
    "Plan for N nodes × G GPUs, write RUN_DIR/job.sbatch and submit it. Inside the job grpo-launch plans for the real "
    "allocation, starts the vLLM server and one trainer step per node with srun, and tears everything down on "
    "failure, scancel or the time limit. 90 s before the limit (SIGUSR2) the trainers save a checkpoint and the job "
    "requeues itself; the requeued run resumes from it. Arguments after `--` go to sbatch unchanged."
)


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "sbatch",
        help="plan for a Slurm allocation, write the batch script into the run dir and submit it",
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    add_recipe_args(p)
    add_options(p, _load_submitter("slurm").Options)
    p.add_argument("--run-dir", help="run directory on a file system all nodes share (default: grpo_runs/NAME)")
    add_launch_flags(p)
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restarts inside the job after a failure that is not the recipe's code (same as launch.max_restarts=N)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    import dataclasses
    import os

    from grpo_launch.backends.submit import SubmitJob
    from grpo_launch.cli.tables import summary_lines
    from grpo_launch.execute.preflight import preflight
    from grpo_launch.probe.local import probe_local
    from grpo_launch.render import render_files
    from grpo_launch.rundir.files import run_record, write_run_files

    submitter_cls = _load_submitter("slurm")
    options = read_options(args, submitter_cls.Options)
    recipe = load(args)
    if recipe.values.get("use_cpu") is True and options.gpus_per_node is None:
        options = dataclasses.replace(options, gpus_per_node=0)  # the recipe asks for CPU nodes
    topology = submitter_cls.requested_topology(options, probe_local(ctx.environ))
    # Refuse before submitting what cannot run.
    plan = plan_on(topology, recipe, args, ctx)
    preflight(plan, ctx.workdir)
    submitter = submitter_cls()
    job = SubmitJob(os.path.abspath(args.recipe), tuple(flag_overrides(args)), tuple(args.extra))
    submission = submitter.request(job, plan, options, ctx)
    summary = summary_lines(plan)
    if args.dry_run:
        ctx.emit(submission.text.rstrip("\n"))
        ctx.emit("\n".join("# " + line for line in summary))  # after the script's #! line: comments
        return 0
    for line in summary:
        ctx.emit(line)
    files = {plan.paths.relative(plan.paths.sbatch_script): submission.text}
    if record := run_record(plan.run_dir):  # the job resumes that run and writes its files when it starts
        names = " and ".join(p.name for p in record)
        ctx.emit(f"notice: {plan.run_dir} holds a run's record ({names}): only job.sbatch is written; the job "
                 "resumes that run (another --run-dir starts a new one)")  # fmt: skip
    else:
        files |= render_files(plan)
    write_run_files(plan.run_dir, files)
    job_id = submitter.submit(submission, ctx)
    ctx.emit(f"submitted Slurm job {job_id}: {submission.summary}")
    ctx.emit(f"  log:     {plan.run_dir}/slurm-{job_id}.out (and {plan.paths.logs}/ per process)")
    ctx.emit(f"  script:  {submission.path}")
    ctx.emit(f"  follow:  tail -f {plan.run_dir}/slurm-{job_id}.out   cancel: scancel {job_id}")
    return 0
