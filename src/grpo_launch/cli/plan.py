"""``grpo-launch plan``: print the plan (or its JSON) and write the configs; start nothing."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_launch.cli.common import VERB_HELP, add_planning_args, plan_for
from grpo_launch.cli.explain import calibration_section, explain_sections
from grpo_launch.cli.tables import Section, plan_sections, print_sections
from grpo_launch.probe.calibration_store import read_calibration
from grpo_launch.render import render_files
from grpo_launch.render.plan_json import plan_to_dict
from grpo_launch.rundir.files import write_plan_files
from grpo_launch.spec import RunContext

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grpo_launch.planning import Plan
    from grpo_launch.planning.cost.workload import Calibration
    from grpo_launch.planning.measured_scales import Comparison


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser("plan", help=VERB_HELP["plan"], epilog=epilog, formatter_class=formatter)
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
        from grpo_launch.analysis.view import RunView
        from grpo_launch.planning.measured_scales import calibrate_from_run

        calibration, rows = calibrate_from_run(RunView.load(args.calibrate_from))
    plan, _ = plan_for(args, ctx, calibration)
    written: list[str] = []
    kept: str | None = None  # where the files went instead of a run's record
    if not args.no_write:
        paths, kept = write_plan_files(plan.run_dir, render_files(plan))
        written = [str(p) for p in paths]
    if args.json:
        data = plan_to_dict(plan)
        measured = _measured_rows(plan)
        if measured:
            from grpo_launch.planning.measured_scales import comparison_to_dict

            data["measured_by_calibrate"] = {"file": measured[0], "terms": comparison_to_dict(measured[1])}
        if rows:
            from grpo_launch.planning.measured_scales import comparison_to_dict

            data["calibrated_from"] = {"run_dir": args.calibrate_from, "terms": comparison_to_dict(rows)}
        if kept:
            data["written_to"] = {"files": written, "why": kept}
        ctx.emit(json.dumps(data, indent=2, default=str))
        if written:  # standard output is the JSON alone; what was written is said beside it
            where = os.path.dirname(written[0]) or "."
            print(f"grpo-launch plan: wrote {len(written)} files to {where} (--no-write writes none)", file=sys.stderr)
        return 0
    sections = plan_sections(plan, written) + (explain_sections(plan) if args.explain else [])
    measured = _measured_rows(plan) if args.explain else None
    if measured:
        sections.append(measured_section(*measured))
    if kept:
        sections.append(Section(f"notice: {kept}", style="cyan"))
    print_sections(sections + ([calibration_section(args.calibrate_from, rows)] if rows else []))
    return 0


def _measured_rows(plan: Plan) -> tuple[str, list[Comparison]] | None:
    """The stored calibration the plan used (``grpo-launch calibrate``): each measured term beside the table's."""
    est = plan.estimate
    cal = est.workload.scale if est is not None and est.workload is not None else None
    if cal is None or cal.measured is None or plan.model is None:
        return None
    from grpo_launch.planning.measured_scales import measured_against_table

    at = dict(read_calibration(Path(cal.measured_source)).at) if cal.measured_source else {}
    rows, _, _ = measured_against_table(
        plan.model,
        plan.topology.planning_gpu_spec,
        cal.measured,
        int(at.get("per_device_train_batch_size", 1)),
        int(at.get("prompt_len", 1)),
        int(at.get("completion_len", 1)),
    )
    return cal.measured_source, rows


def measured_section(path: str, rows: Sequence[Comparison]) -> Section:
    """``grpo-launch calibrate``'s terms beside the GPU table's at the point they were measured, and the ratio."""

    def fmt(x: float | None, unit: str) -> str:
        if x is None:
            return "-"
        return (
            f"{x:,.0f} {unit}"
            if unit == "tok/s"
            else (f"{x * 1000:.2f} ms" if unit == "s" and x < 1 else f"{x:.2f} {unit}")
        )

    table = [
        (r.term, fmt(r.predicted, r.unit), fmt(r.measured, r.unit), f"{r.ratio:.2f}" if r.ratio else "-") for r in rows
    ]
    header = ("term", "table", "measured", "measured/table")
    return Section(f"Measured by grpo-launch calibrate ({path}; '-': the table has no value here)", table, header)
