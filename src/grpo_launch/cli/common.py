"""What the verbs share: the recipe and topology arguments, loading the recipe, choosing the backend and the
topology, and planning."""

from __future__ import annotations

import argparse
import dataclasses
import os

from grpo_launch.backends import Backend, RunContext, add_arguments, select
from grpo_launch.planning import default_run_dir, make_plan
from grpo_launch.planning.costmodel import Calibration
from grpo_launch.planning.types import Plan
from grpo_launch.recipe import Recipe, load_recipe
from grpo_launch.topology import Topology

EPILOG = """\
examples:
  grpo-launch plan recipes/qwen1.5b.yaml --gpus 4xL20-48GB     plan for 4 × L20 from any machine
  grpo-launch plan recipes/qwen1.5b.yaml num_generations=6 --json
  grpo-launch inspect                                         show the GPUs this machine sees
  grpo-launch recipes/tiny-cpu.yaml max_steps=3               plan, then run GRPO (vLLM server + trainers)
  grpo-launch sbatch recipes/qwen7b-math.yaml --nodes 2 --gpus-per-node 8 --time 1-00:00 -- --qos=high
  grpo-launch status grpo_runs/qwen1.5b                        state, step, ETA and last metrics of a run
  grpo-launch plan recipes/qwen1.5b.yaml --calibrate-from grpo_runs/qwen1.5b   replan with a run's measurements
"""


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML (TRL/open-r1 keys plus an optional launch: block)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="override recipe keys; values are YAML (max_steps=3, reward_funcs=[a,b], launch.vllm=off)",
    )


def add_topology_args(p: argparse.ArgumentParser, *, run: bool) -> None:
    p.add_argument(
        "--gpus",
        metavar="SPEC",
        help="plan for simulated GPUs instead of probing: 4xL20-48GB, 8xH100-80GB, 2x8xH100-80GB, cpu",
    )
    add_arguments(p, run=run)


def add_planning_args(p: argparse.ArgumentParser, *, run: bool) -> None:
    add_recipe_args(p)
    add_topology_args(p, run=run)
    p.add_argument("--run-dir", help="where to write the configs and logs (default: launch.run_dir or grpo_runs/NAME)")
    p.add_argument(
        "--gpu-hour-price",
        type=float,
        metavar="PRICE",
        help="price of one GPU-hour, to show the run's cost (same as launch.gpu_hour_price=PRICE)",
    )
    p.add_argument(
        "--network-interface",
        metavar="IFACE",
        help="network interface for torch/NCCL between hosts (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME; "
        "same as launch.network_interface=IFACE)",
    )


def load(args: argparse.Namespace, ctx: RunContext) -> Recipe:
    """The recipe with its overrides, its run directory made absolute."""
    overrides = list(args.overrides)
    if getattr(args, "network_interface", None):
        overrides.append(f"launch.network_interface={args.network_interface}")
    if getattr(args, "gpu_hour_price", None) is not None:
        overrides.append(f"launch.gpu_hour_price={args.gpu_hour_price}")
    recipe = load_recipe(args.recipe, overrides)
    if not recipe.get("model_name_or_path"):
        from grpo_launch.errors import ConfigError

        raise ConfigError(
            "the recipe names no model: set model_name_or_path",
            hint="e.g. model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct (a hub id or a local directory)",
        )
    if recipe.launch.dataset_rows is None:
        from grpo_launch.probe import count_rows

        rows = count_rows(str(recipe.get("dataset_name") or ""), ctx.workdir)
        if rows:
            recipe = dataclasses.replace(recipe, launch=dataclasses.replace(recipe.launch, dataset_rows=rows))
    run_dir = os.path.join(ctx.workdir, args.run_dir or default_run_dir(recipe))
    return dataclasses.replace(recipe, launch=dataclasses.replace(recipe.launch, run_dir=os.path.normpath(run_dir)))


def topology(args: argparse.Namespace, ctx: RunContext, recipe: Recipe | None) -> tuple[Topology, Backend]:
    """The machines to plan for and the backend that runs on them: --gpus > --hostfile > Slurm > this machine."""
    from grpo_launch import probe
    from grpo_launch.topology import parse_gpu_spec

    if args.gpus is not None and (getattr(args, "hostfile", None) or getattr(args, "slurm", False)):
        from grpo_launch.errors import ConfigError

        other = "--hostfile" if getattr(args, "hostfile", None) else "--slurm"
        raise ConfigError(
            f"--gpus and {other} both say which machines to plan for",
            hint="Keep one: --gpus simulates GPUs; a hostfile line can name its own (node1 slots=8 gpu=H100-80GB).",
        )
    backend = select(args, ctx.environ)
    if args.gpus is not None:
        cpu_processes = recipe.launch.num_processes if recipe else None
        return parse_gpu_spec(args.gpus, cpu_processes=cpu_processes), backend
    return backend.probe(ctx.environ, probe.probe_local(ctx.environ)), backend


def plan_for(args: argparse.Namespace, ctx: RunContext, calibration: Calibration | None = None) -> tuple[Plan, Backend]:
    """Load, probe and plan: the plan carries the run directory and this interpreter."""
    from grpo_launch.probe import resolve_model_shape, vllm_version_here

    recipe = load(args, ctx)
    topo, backend = topology(args, ctx, recipe)
    model, warning = resolve_model_shape(recipe.get("model_name_or_path"), ctx.environ)
    plan = make_plan(topo, recipe, model, run_dir=recipe.launch.run_dir, python=ctx.python, calibration=calibration)
    if plan.vllm.mode != "off":
        plan = dataclasses.replace(plan, vllm_version=vllm_version_here())
    if warning:
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, warning))
    return plan, backend
