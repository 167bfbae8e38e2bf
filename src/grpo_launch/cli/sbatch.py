"""``grpo-launch sbatch RECIPE --nodes N``: plan for the requested allocation, write RUN_DIR/job.sbatch, submit."""

from __future__ import annotations

import argparse

from grpo_launch.backends import RunContext
from grpo_launch.backends import load_submitter as _load_submitter
from grpo_launch.cli.common import add_recipe_args, load

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
    _load_submitter("slurm").add_arguments(p)
    p.add_argument("--run-dir", help="run directory on a file system all nodes share (default: grpo_runs/NAME)")
    p.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    from grpo_launch.cli.tables import summary_lines
    from grpo_launch.planning import make_plan
    from grpo_launch.probe import probe_local, resolve_model_shape
    from grpo_launch.render import render_files
    from grpo_launch.run import preflight
    from grpo_launch.rundir import write_run_files

    submitter_cls = _load_submitter("slurm")
    recipe = load(args, ctx)
    if recipe.values.get("use_cpu") is True and args.gpus_per_node is None:
        args.gpus_per_node = 0  # the recipe asks for CPU nodes
    topology = submitter_cls.requested_topology(args, probe_local(ctx.environ))
    model, warning = resolve_model_shape(recipe.get("model_name_or_path"), ctx.environ)
    if warning:
        ctx.emit(f"warning: {warning}")
    # Refuse before submitting what cannot run.
    plan = make_plan(topology, recipe, model, run_dir=recipe.launch.run_dir, python=ctx.python)
    preflight(plan, ctx.workdir)
    submitter = submitter_cls()
    submission = submitter.request(recipe, plan, args, ctx)
    summary = summary_lines(plan)
    if args.dry_run:
        ctx.emit(submission.text.rstrip("\n"))
        ctx.emit("\n".join("# " + line for line in summary))  # after the script's #! line: comments
        return 0
    for line in summary:
        ctx.emit(line)
    write_run_files(plan.run_dir, {**render_files(plan), submission.path.rsplit("/", 1)[-1]: submission.text})
    job = submitter.submit(submission, ctx)
    ctx.emit(f"submitted Slurm job {job}: {submission.summary}")
    ctx.emit(f"  log:     {plan.run_dir}/slurm-{job}.out (and {plan.run_dir}/logs/ per process)")
    ctx.emit(f"  script:  {submission.path}")
    ctx.emit(f"  follow:  tail -f {plan.run_dir}/slurm-{job}.out   cancel: scancel {job}")
    return 0
