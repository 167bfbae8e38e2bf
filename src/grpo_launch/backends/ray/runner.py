"""``python -m grpo_launch.backends.ray.runner [options] -- COMMAND…``: one of the plan's processes on a Ray node,
run from the launcher's machine. The launcher supervises this local process as it supervises an ssh client:

- it attaches to the cluster, creates a :class:`~grpo_launch.backends.ray.tasks.NodeProcess` actor in its host's
  placement group (bundle ``--bundle``, with ``--gpus`` GPUs), and has it start COMMAND there;
- it prints COMMAND's first line (the shim's announcement of the remote process group: the launcher accepts it only
  as the first line), then what Ray gave the process (node, GPU ids: CUDA_VISIBLE_DEVICES is exactly those) beside
  the plan's GPU positions, then the rest of COMMAND's output line by line;
- it exits with COMMAND's exit code; when the actor or its node dies, with 255 after one
  ``ray.exceptions.ActorDiedError: …`` line (an infrastructure failure to :mod:`grpo_launch.execute.faults`);
- ``--env-stdin``: KEY=VALUE lines on stdin (secrets) go to the process through the actor call, never a command
  line; SIGTERM/SIGINT are passed to the remote process group.
"""

from __future__ import annotations

import argparse
import signal
import sys

from grpo_launch.backends.ray.cluster import connect
from grpo_launch.errors import GrpoLaunchError
from grpo_launch.node.shim import read_env

LOST = 255


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m grpo_launch.backends.ray.runner OPTIONS -- COMMAND…")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="grpo_launch.backends.ray.runner")
    p.add_argument("--address", required=True)
    p.add_argument("--pg", required=True, help="the host's placement group (its name)")
    p.add_argument("--bundle", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--cpus", type=float, default=0)
    p.add_argument("--name", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--planned", default="", help="the plan's GPU positions on the host")
    p.add_argument("--cwd", required=True)
    p.add_argument("--env-stdin", action="store_true")
    args = p.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        raise SystemExit("grpo_launch.backends.ray.runner: no command after --")
    return args, command


def main(argv: list[str]) -> int:
    args, command = parse(argv)
    env = read_env(sys.stdin) if args.env_stdin else {}
    try:
        ray = connect(args.address)
    except GrpoLaunchError as exc:
        print(f"[grpo-launch] {args.name}: {exc}", flush=True)
        return LOST
    from ray.util import get_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from grpo_launch.backends.ray.tasks import NodeProcess

    try:
        pg = get_placement_group(args.pg)
    except ValueError:
        print(f"[grpo-launch] {args.name}: no placement group {args.pg!r} on the cluster (its launcher is gone)")
        return LOST
    strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=args.bundle)
    actor = NodeProcess.options(  # type: ignore[attr-defined]  # (ray.remote made it an ActorClass)
        num_gpus=args.gpus, num_cpus=args.cpus, scheduling_strategy=strategy
    ).remote()
    asked: list[int] = []

    def relay(signum: int, _frame: object) -> None:
        asked.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)
    try:
        info = ray.get(actor.start.remote(command, env, args.cwd))
        given = ",".join(info["gpu_ids"])
        where: str | None = (
            f"[grpo-launch] ray: {args.name} runs on node {info['node']} ({info['address']}), pid {info['pid']}; "
            f"planned GPUs [{args.planned}] are Ray's GPUs [{given}] there (CUDA_VISIBLE_DEVICES={given})"
        )
        sent = 0
        while True:
            while sent < len(asked):
                actor.signal.remote(asked[sent])
                sent += 1
            lines, code = ray.get(actor.read.remote(1.0))
            if where is not None and (lines or code is not None):
                lines = [*lines[:1], where, *lines[1:]]  # the shim's announcement first, then where it runs
                where = None
            for line in lines:
                print(line, flush=True)
            if code is not None:
                return code if code >= 0 else 128 - code
    except Exception as exc:  # the actor, its node or the connection to the cluster is gone: one line says which
        why = " ".join(str(exc).split())[:400]
        lost = isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError))
        what = "died, or its node was lost" if lost else f"could not be reached ({type(exc).__name__})"
        print(
            f"ray.exceptions.ActorDiedError: the Ray actor running {args.name} on {args.host} {what}: {why}", flush=True
        )
        return LOST


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
