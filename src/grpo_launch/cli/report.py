"""``grpo-launch report [RUN_DIR]``: write the run report (RUN_DIR/report/report.html with its plots) from the run
directory's measurements; a run writes it at its end too."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpo_launch.analysis.report import write_report
from grpo_launch.cli.common import VERB_HELP
from grpo_launch.cli.status import newest_run
from grpo_launch.spec import RunContext


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "report",
        help=VERB_HELP["report"],
        description="Write RUN_DIR/report/report.html (self-contained) and its PNGs: the reward and each reward "
        "function, completion lengths, the step time split against the plan's prediction, and the peak memory of "
        "every rank against the estimate. Needs matplotlib (the report extra: pip install '.[report]' in "
        "grpo-launch's checkout).",
    )
    p.add_argument("run_dir", nargs="?", help="the run directory (default: the newest under grpo_runs/)")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    run_dir = Path(args.run_dir) if args.run_dir else newest_run(ctx.workdir)
    ctx.emit(f"report: {write_report(run_dir)}")
    return 0
