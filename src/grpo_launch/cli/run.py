"""``grpo-launch run RECIPE`` (the default verb): plan, write the configs, start the vLLM server and the trainers,
supervise them to the end."""

from __future__ import annotations

import argparse
import dataclasses

from grpo_launch.cli.common import VERB_HELP, add_planning_args, invocation_of, pasteable, plan_for, record_invocation
from grpo_launch.cli.resume import check_continuity
from grpo_launch.cli.tables import summary_lines
from grpo_launch.enums import ResumeMode
from grpo_launch.errors import ConfigError, GrpoLaunchError
from grpo_launch.execute.run import run_plan
from grpo_launch.rundir.files import LauncherLog
from grpo_launch.spec import RunContext, RunResult


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "run",
        help=VERB_HELP["run"],
        epilog=epilog,
        formatter_class=formatter,
    )
    add_planning_args(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the commands that would run (per host); start none of them (what runs: the hosts' "
        "probes and an isolated import check, python -I; nothing of the recipe's)",
    )
    p.add_argument(
        "--resume",
        choices=[str(m) for m in ResumeMode],
        default=str(ResumeMode.AUTO),
        help="auto: from the newest complete checkpoint in output_dir, or fresh; a completed run is not trained "
        "again (default). never: fresh (earlier checkpoints are set aside, not deleted). must: fail without one",
    )
    p.add_argument(
        "--adapt",
        action="store_true",
        help="after a warm-up, re-plan with the run's own step times and move to a split predicted at least 15%% "
        "faster per prompt: checkpoint, stop, resume on the new layout (same as launch.adapt=true)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restart after a failure that is not the recipe's code (a lost process or host, a network error, a "
        "hang) up to N times, from the newest complete checkpoint (default: launch.max_restarts, 0)",
    )


def command(args: argparse.Namespace, ctx: RunContext) -> RunResult:
    if args.dry_run:  # pasted into a shell: each comment line stays one, whatever the recipe's path holds
        ctx = dataclasses.replace(ctx, emit=pasteable(ctx.emit))
    plan, backend = plan_for(args, ctx, starts=not args.dry_run)
    prefix = "# " if args.dry_run else "[grpo-launch] "
    check_continuity(plan, args, ctx, prefix)  # in a run's directory: where it continues; resume refuses a change
    log = None
    if not args.dry_run:  # every launcher line also goes to RUN_DIR/logs/launcher.log, time-stamped
        log = LauncherLog(plan.run_dir)
        console = ctx.emit

        def emit(line: str) -> None:
            log.write(line)
            console(line)

        ctx = dataclasses.replace(ctx, emit=emit)
        log.write(invocation_of(args, backend.name, plan.run_dir, ctx).command)
    # Before anything starts: what was decided, and every notice and warning (a dry run prints them as comments).
    for line in summary_lines(plan):
        ctx.emit(prefix + line)
    if args.max_restarts is not None and not 0 <= args.max_restarts <= 1000:
        raise ConfigError(f"--max-restarts must be from 0 to 1000, got {args.max_restarts}")
    try:
        result = run_plan(
            plan,
            backend,
            ctx,
            dry_run=args.dry_run,
            resume=ResumeMode(args.resume),
            max_restarts=args.max_restarts,
            log=log,
            on_start=lambda: record_invocation(args, backend.name, plan.run_dir, ctx),
        )
    except GrpoLaunchError as exc:
        if log is not None:
            log.write(f"error: {exc.render()}")
        raise
    if log is not None:
        detail = f"\n{result.detail}" if result.detail else ""
        log.write(f"run ended: {result.state}, exit code {result.exit_code}: {result.message}{detail}".rstrip(": "))
    return result
