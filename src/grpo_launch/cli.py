"""Command line. The only module that prints or exits; every GrpoLaunchError becomes one message and a code.

Exit codes: 0 success; 2 bad input or impossible plan; 1 failed run; 128+N after signal N.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence

from grpo_launch import __version__
from grpo_launch.errors import GrpoLaunchError
from grpo_launch.recipe import Recipe, load_recipe
from grpo_launch.topology import Topology

EPILOG = """\
examples:
  grpo-launch plan recipes/qwen1.5b.yaml --gpus 4xL20-48GB     plan for 4 × L20 from any machine
  grpo-launch plan recipes/qwen1.5b.yaml num_generations=6 --json
  grpo-launch inspect                                         show the GPUs this machine sees
  grpo-launch recipes/tiny-cpu.yaml max_steps=3               plan, then run GRPO (vLLM server + trainers)
  grpo-launch sbatch recipes/qwen7b-math.yaml --nodes 2 --gpus-per-node 8 --time 1-00:00 -- --qos=high
"""

VERBS = ("plan", "inspect", "run", "sbatch")


def _add_planning_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML (TRL/open-r1 keys plus an optional launch: block)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="override recipe keys; values are YAML (max_steps=3, reward_funcs=[a,b], launch.vllm=off)",
    )
    _add_topology_args(p)
    p.add_argument("--run-dir", help="where to write the configs and logs (default: launch.run_dir or grpo_runs/NAME)")
    p.add_argument(
        "--network-interface",
        metavar="IFACE",
        help="network interface for torch/NCCL between hosts (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME; "
        "same as launch.network_interface=IFACE)",
    )


def _add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus",
        metavar="SPEC",
        help="plan for simulated GPUs instead of probing: 4xL20-48GB, 8xH100-80GB, 2x8xH100-80GB, cpu",
    )
    p.add_argument("--hostfile", metavar="FILE", help="DeepSpeed-style hostfile (HOST slots=N per line)")
    p.add_argument(
        "--slurm",
        action="store_true",
        help="use the current Slurm allocation (an error outside one); without it, used when SLURM_JOB_ID is set",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-launch",
        description="Plan and launch GRPO training with TRL: split GPUs between vLLM and trainers, choose a batch "
        "layout TRL accepts, write accelerate/DeepSpeed configs, start and supervise everything.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"grpo-launch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", metavar="{run,plan,inspect,sbatch}")

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_planning_args(p)
        return p

    run = verb("run", "plan, write configs, start the vLLM server and trainers (the default verb)")
    run.add_argument(
        "--dry-run", action="store_true", help="print the commands that would run (per host); start nothing"
    )
    ssh = run.add_argument_group("hostfile runs (ssh)")
    ssh.add_argument("--ssh-port", type=int, metavar="PORT", help="ssh port of the hosts")
    ssh.add_argument("--ssh-identity", metavar="FILE", help="private key for ssh (ssh -i)")
    ssh.add_argument("--ssh-config", metavar="FILE", help="ssh client config file (ssh -F)")
    ssh.add_argument(
        "--ssh-option", action="append", default=[], metavar="KEY=VALUE", help="extra ssh -o option (repeatable)"
    )

    plan = verb("plan", "print the plan and write the configs; start nothing")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--no-write", action="store_true", help="do not write files to the run directory")
    plan.add_argument(
        "--explain", action="store_true", help="show the memory and step-time arithmetic behind the estimate"
    )

    sbatch = sub.add_parser(
        "sbatch",
        help="plan for a Slurm allocation, write the batch script into the run dir and submit it",
        description="Plan for N nodes × G GPUs, write RUN_DIR/job.sbatch and submit it. Inside the job grpo-launch "
        "plans for the real allocation, starts the vLLM server and one trainer step per node with srun, and tears "
        "everything down on failure, scancel or the time limit. 90 s before the limit (SIGUSR2) the trainers save a "
        "checkpoint and the job requeues itself; the requeued run resumes from it. Arguments after `--` go to "
        "sbatch unchanged.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sbatch.add_argument("recipe", help="recipe YAML")
    sbatch.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe keys (as for run)")
    sbatch.add_argument("--nodes", type=int, required=True, help="number of nodes")
    sbatch.add_argument(
        "--gpus-per-node", type=int, help="GPUs per node (default: this machine's count; 0 for CPU-only nodes)"
    )
    sbatch.add_argument(
        "--gpu-type", metavar="MODEL", help="GPU model to plan for, e.g. H100-80GB (default: this machine's GPU)"
    )
    sbatch.add_argument("--partition", help="Slurm partition")
    sbatch.add_argument("--time", help="time limit (sbatch --time format, e.g. 04:00:00 or 1-00:00)")
    sbatch.add_argument("--account", help="Slurm account")
    sbatch.add_argument("--job-name", help="job name (default: grpo-RECIPE)")
    sbatch.add_argument("--run-dir", help="run directory on a file system all nodes share (default: grpo_runs/NAME)")
    sbatch.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")

    inspect = sub.add_parser("inspect", help="show the GPUs / hosts grpo-launch sees")
    _add_topology_args(inspect)
    inspect.add_argument("--json", action="store_true", help="print as JSON")
    return parser


def _normalise_argv(argv: Sequence[str]) -> list[str]:
    """``grpo-launch RECIPE …`` means ``grpo-launch run RECIPE …``."""
    args = list(argv)
    for i, a in enumerate(args):
        if a == "--debug":
            continue
        if a in VERBS or a.startswith("-"):
            return args
        return [*args[:i], "run", *args[i:]]
    return args


# ------------------------------------------------------------------------------------------------ topology


def probe_topology(args: argparse.Namespace, environ: Mapping[str, str], recipe: Recipe | None) -> Topology:
    """Choose the machine description: --gpus > --hostfile > Slurm allocation > this machine."""
    from grpo_launch import probe
    from grpo_launch.topology import parse_gpu_spec

    cpu_processes = recipe.launch.num_processes if recipe else None
    if args.gpus:
        return parse_gpu_spec(args.gpus, cpu_processes=cpu_processes)
    local = probe.probe_local(environ)
    if args.hostfile:
        return probe.probe_hostfile(args.hostfile, local=local, cpu=local.is_cpu)
    slurm = probe.slurm_values(environ)
    if getattr(args, "slurm", False) or (slurm.get("job_id") and slurm.get("nodelist")):
        return probe.probe_slurm(environ, local=local)
    return local


def _load(args: argparse.Namespace) -> tuple[Recipe, str]:
    """The recipe with its overrides, and the absolute run directory it will use."""
    import dataclasses

    from grpo_launch.plan import default_run_dir

    overrides = list(args.overrides)
    if getattr(args, "network_interface", None):
        overrides.append(f"launch.network_interface={args.network_interface}")
    recipe = load_recipe(args.recipe, overrides)
    run_dir = os.path.abspath(args.run_dir or default_run_dir(recipe))
    return dataclasses.replace(recipe, launch=dataclasses.replace(recipe.launch, run_dir=run_dir)), run_dir


def _plan(args: argparse.Namespace, environ: Mapping[str, str]):  # -> (Plan, run_dir)
    import dataclasses

    from grpo_launch.plan import make_plan
    from grpo_launch.probe import resolve_model_shape

    recipe, run_dir = _load(args)
    topology = probe_topology(args, environ, recipe)
    model, warning = resolve_model_shape(recipe.get("model_name_or_path"))
    plan = make_plan(topology, recipe, model)
    if warning:
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, warning))
    return plan, run_dir


def cmd_plan(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from grpo_launch.render import plan_to_dict, render_files
    from grpo_launch.rundir import write_run_files

    plan, run_dir = _plan(args, environ)
    written: list[str] = []
    if not args.no_write:
        written = [str(p) for p in write_run_files(run_dir, render_files(plan, run_dir, python=sys.executable))]
    if args.json:
        print(json.dumps(plan_to_dict(plan, run_dir, python=sys.executable), indent=2, default=str))
        return 0
    from rich.console import Console

    from grpo_launch.report import plan_report

    console = Console(soft_wrap=True)
    console.print(plan_report(plan, run_dir, written, python=sys.executable))
    if args.explain:
        console.print("Arithmetic (estimates, see grpo_launch/estimate.py for the model):", style="bold")
        if plan.estimate is None:
            console.print(
                "  no estimate: the model shape or the GPU model is unknown (a CPU plan, or pass --gpus MODEL)"
            )
        for line in plan.estimate.explain if plan.estimate else ():
            console.print(f"  {line}", markup=False)
    return 0


def cmd_inspect(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from dataclasses import asdict

    topology = probe_topology(args, environ, None)
    if args.json:
        print(json.dumps(asdict(topology), indent=2))
        return 0
    from rich.console import Console

    from grpo_launch.report import topology_table

    console = Console(soft_wrap=True)
    console.print(topology_table(topology))
    for w in topology.warnings:
        console.print(f"warning: {w}", style="yellow")
    return 0


def cmd_run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from grpo_launch.execute import run_plan
    from grpo_launch.ssh import SshOptions

    plan, run_dir = _plan(args, environ)
    ssh = SshOptions(
        port=args.ssh_port, identity=args.ssh_identity, config=args.ssh_config, options=tuple(args.ssh_option)
    )
    return run_plan(plan, run_dir, environ=environ, dry_run=args.dry_run, ssh=ssh)


def _requested_topology(args: argparse.Namespace, environ: Mapping[str, str]) -> Topology:
    """The allocation ``grpo-launch sbatch`` asks for: --nodes × --gpus-per-node GPUs of one model."""
    from grpo_launch import probe
    from grpo_launch.errors import ConfigError
    from grpo_launch.hardware import GIB, find_gpu_spec
    from grpo_launch.topology import Gpu, Host

    if args.nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {args.nodes}")
    local = probe.probe_local(environ)
    per_node = args.gpus_per_node
    if per_node is None:
        if local.is_cpu:
            raise ConfigError(
                "how many GPUs per node? This machine has none to copy the count from",
                hint="Pass --gpus-per-node G (and --gpu-type, e.g. H100-80GB, to check memory); 0 for CPU nodes.",
            )
        per_node = len(local.hosts[0].gpus)
    if per_node < 0:
        raise ConfigError(f"--gpus-per-node must be 0 or more, got {per_node}")
    name, memory = "unknown", None
    if args.gpu_type:
        spec = find_gpu_spec(args.gpu_type)
        if spec is None:
            raise ConfigError(
                f"unknown --gpu-type {args.gpu_type!r}", hint="Known: H100-80GB, H200, A100-80GB, L20, L40S, A10G, …"
            )
        name, memory = spec.name, int(spec.memory_gib * GIB)
    elif local.hosts[0].gpus:
        name, memory = local.hosts[0].gpus[0].name, local.hosts[0].gpus[0].memory_bytes
    gpus = tuple(Gpu(visible_id=str(i), name=name, memory_bytes=memory) for i in range(per_node))
    hosts = tuple(Host(name=f"node{i + 1}", gpus=gpus) for i in range(args.nodes))
    warnings = () if memory or not per_node else ("GPU model unknown (pass --gpu-type): memory not checked",)
    return Topology(hosts, "sbatch", warnings)


def cmd_sbatch(args: argparse.Namespace, environ: Mapping[str, str], extra: Sequence[str]) -> int:
    from grpo_launch.execute import preflight, submit_batch_script
    from grpo_launch.plan import make_plan
    from grpo_launch.probe import resolve_model_shape
    from grpo_launch.render import render_files
    from grpo_launch.rundir import write_run_files
    from grpo_launch.slurm import SbatchRequest, render_sbatch_script

    recipe, run_dir = _load(args)
    topology = _requested_topology(args, environ)
    model, _ = resolve_model_shape(recipe.get("model_name_or_path"))
    plan = make_plan(topology, recipe, model)  # refuse before submitting what cannot run
    preflight(plan)
    request = SbatchRequest(
        recipe=os.path.abspath(args.recipe),
        run_dir=run_dir,
        workdir=os.getcwd(),
        python=sys.executable,
        nodes=args.nodes,
        gpus_per_node=len(topology.hosts[0].gpus),
        overrides=tuple(args.overrides),
        job_name=args.job_name,
        partition=args.partition,
        time=args.time,
        account=args.account,
        extra_args=tuple(extra),
    )
    script = render_sbatch_script(request)
    if args.dry_run:
        print(script, end="")
        return 0
    files = {**render_files(plan, run_dir, python=sys.executable), "job.sbatch": script}
    write_run_files(run_dir, files)
    script_path = os.path.join(run_dir, "job.sbatch")
    job = submit_batch_script(script_path, cwd=os.getcwd())
    print(f"submitted Slurm job {job}: {args.nodes} node(s), plan {plan.topology.describe()}")
    print(f"  log:     {run_dir}/slurm-{job}.out (and {run_dir}/logs/ per process)")
    print(f"  script:  {script_path}")
    print(f"  follow:  tail -f {run_dir}/slurm-{job}.out   cancel: scancel {job}")
    return 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    parser = build_parser()
    normalised = _normalise_argv(argv)
    extra: list[str] = []
    if normalised and normalised[0] == "sbatch" and "--" in normalised:
        cut = normalised.index("--")
        normalised, extra = normalised[:cut], normalised[cut + 1 :]
    # Overrides may follow options (`RECIPE --nodes 2 max_steps=5`): argparse leaves those unparsed.
    args, unknown = parser.parse_known_args(normalised)
    strays = [u for u in unknown if u.startswith("-") or "=" not in u or not hasattr(args, "overrides")]
    if strays:
        parser.error(f"unrecognized arguments: {' '.join(strays)}")
    if unknown:
        args.overrides = [*args.overrides, *unknown]
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        if args.verb == "sbatch":
            return cmd_sbatch(args, environ, extra)
        handler = {"plan": cmd_plan, "inspect": cmd_inspect, "run": cmd_run}[args.verb]
        return handler(args, environ)
    except GrpoLaunchError as exc:
        if args.debug:
            raise
        print(f"grpo-launch: error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("grpo-launch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
