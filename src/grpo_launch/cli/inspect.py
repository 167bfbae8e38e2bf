"""``grpo-launch inspect``: the GPUs and hosts grpo-launch sees."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from grpo_launch.cli.common import VERB_HELP, add_topology_args, topology
from grpo_launch.cli.tables import print_sections, topology_sections
from grpo_launch.spec import RunContext


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser("inspect", help=VERB_HELP["inspect"])
    add_topology_args(p)
    p.add_argument("--json", action="store_true", help="print as JSON")


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    topo, _ = topology(args, ctx, None)
    if args.json:
        ctx.emit(json.dumps(asdict(topo), indent=2))
        return 0
    print_sections(topology_sections(topo))
    return 0
