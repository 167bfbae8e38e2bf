"""``grpo-launch plan``: print the plan (or its JSON) and write the configs; start nothing."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from grpo_launch.cli.common import add_planning_args, plan_for
from grpo_launch.spec import RunContext

if TYPE_CHECKING:
    from grpo_launch.planning.calibration import Comparison
    from grpo_launch.planning.cost.workload import Calibration


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "plan", help="print the plan and write the configs; start nothing", epilog=epilog, formatter_class=formatter
    )
    add_planning_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--no-write", action="store_true", help="do not write files to the run directory")
    p.add_argument(
        "--explain",
        action="store_true",
        help="show the memory and step-time arithmetic and the split candidates behind the estimate",
    )
    p.add_argument(
        "--calibrate-from",
        metavar="RUN_DIR",
        help="replan with a previous run's measurements (RUN_DIR/metrics.jsonl against its plan.json): its "
        "generation and training speed, peak memory and mean completion length; prints predicted vs measured",
    )


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    calibration: Calibration | None = None
    rows: list[Comparison] = []
    if args.calibrate_from:
        from grpo_launch.planning.calibration import calibrate_from_run
        from grpo_launch.rundir.view import RunView

        calibration, rows = calibrate_from_run(RunView.load(args.calibrate_from))
    plan, _ = plan_for(args, ctx, calibration)
    written: list[str] = []
    kept: str | None = None  # where the files went instead of a run's record
    if not args.no_write:
        from grpo_launch.render import render_files
        from grpo_launch.rundir.files import write_plan_files

        paths, kept = write_plan_files(plan.run_dir, render_files(plan))
        written = [str(p) for p in paths]
    if args.json:
        import json

        from grpo_launch.render.plan_json import plan_to_dict

        data = plan_to_dict(plan)
        if rows:
            from grpo_launch.planning.calibration import comparison_to_dict

            data["calibrated_from"] = {"run_dir": args.calibrate_from, "terms": comparison_to_dict(rows)}
        if kept:
            data["written_to"] = {"files": written, "why": kept}
        ctx.emit(json.dumps(data, indent=2, default=str))
        if written:  # standard output is the JSON alone; what was written is said beside it
            import sys

            where = os.path.dirname(written[0]) or "."
            print(f"grpo-launch plan: wrote {len(written)} files to {where} (--no-write writes none)", file=sys.stderr)
        return 0
    from grpo_launch.cli.tables import Section, calibration_section, explain_sections, plan_sections, print_sections

    sections = plan_sections(plan, written) + (explain_sections(plan) if args.explain else [])
    if kept:
        sections.append(Section(f"notice: {kept}", style="cyan"))
    print_sections(sections + ([calibration_section(args.calibrate_from, rows)] if rows else []))
    return 0
