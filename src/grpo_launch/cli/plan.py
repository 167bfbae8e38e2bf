"""``grpo-launch plan``: print the plan (or its JSON) and write the configs; start nothing."""

from __future__ import annotations

import argparse
import json

from grpo_launch.backends import RunContext
from grpo_launch.cli.common import add_planning_args, plan_for


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "plan", help="print the plan and write the configs; start nothing", epilog=epilog, formatter_class=formatter
    )
    add_planning_args(p, run=False)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--no-write", action="store_true", help="do not write files to the run directory")
    p.add_argument(
        "--explain",
        action="store_true",
        help="show the memory and step-time arithmetic and the split candidates behind the estimate",
    )


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    from grpo_launch.render import plan_to_dict, render_files
    from grpo_launch.rundir import write_run_files

    plan, _ = plan_for(args, ctx)
    written = [] if args.no_write else [str(p) for p in write_run_files(plan.run_dir, render_files(plan))]
    if args.json:
        ctx.emit(json.dumps(plan_to_dict(plan), indent=2, default=str))
        return 0
    from grpo_launch.cli.report import explain_sections, plan_sections, print_sections

    print_sections(plan_sections(plan, written) + (explain_sections(plan) if args.explain else []))
    return 0
