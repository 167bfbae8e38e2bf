"""What the verbs share: the recipe and topology arguments, loading the recipe, choosing the backend and the
topology, and planning."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from grpo_launch import __version__
from grpo_launch.backends import job_backend, option_classes, select
from grpo_launch.backends.base import Backend
from grpo_launch.cli.options import add_options, read_options
from grpo_launch.errors import ConfigError
from grpo_launch.machines.gpus import find_gpu_spec
from grpo_launch.machines.topology import Topology, parse_gpu_spec
from grpo_launch.planning import default_run_dir, make_plan
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.plan_types import Plan, Runtime
from grpo_launch.probe.calibration_store import any_stored, calibration_key, find_calibration
from grpo_launch.probe.dataset import dataset_rows
from grpo_launch.probe.model import resolve_model_shape
from grpo_launch.probe.pythons import vllm_version_here
from grpo_launch.recipe import Recipe, load_recipe
from grpo_launch.rundir.json_fields import RunFileError
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.shown_text import one_line
from grpo_launch.spec import RunContext

if TYPE_CHECKING:  # a record is read or written only by a run that keeps one (plan's start-up)
    from grpo_launch.models.shape import ModelShape
    from grpo_launch.rundir.invocation import Flag, Invocation

EPILOG = """\
examples:
  grpo-launch plan recipes/qwen1.5b.yaml --gpus 4xL20-48GB     plan for 4 × L20 from any machine
  grpo-launch plan recipes/qwen1.5b.yaml num_generations=6 --json
  grpo-launch inspect                                         show the GPUs this machine sees
  grpo-launch recipes/tiny-cpu.yaml max_steps=3               plan, then run GRPO here (CPU trainers, vLLM off)
  grpo-launch sbatch recipes/qwen7b-math.yaml --nodes 2 --gpus-per-node 8 --time 1-00:00 -- --qos=high
  grpo-launch status grpo_runs/qwen1.5b                        state, step, ETA and last metrics of a run
  grpo-launch resume grpo_runs/qwen1.5b                        continue a stopped run as it was started
  grpo-launch plan recipes/qwen1.5b.yaml --calibrate-from grpo_runs/qwen1.5b   replan with a run's measurements
  grpo-launch calibrate recipes/qwen1.5b.yaml --random-weights  measure this GPU (or CPU) in minutes; plan uses it
"""

# Each verb of grpo-launch's own (a module of cli/), in `grpo-launch --help`'s order, and its line there: the list
# needs none of the verbs' modules. The backends' submit verbs (grpo_launch.backends.SUBMIT_VERBS) follow inspect.
VERB_HELP = {
    "run": "plan, write configs, start the vLLM server and trainers (the default verb)",
    "plan": "print the plan and write the configs; start nothing",
    "calibrate": "measure this machine's GPU (or CPU) for a recipe's model in minutes; plan then uses it",
    "inspect": "show the GPUs / hosts grpo-launch sees",
    "status": "show a run's state, step, ETA and last metrics",
    "report": "write a run's report: HTML with plots of reward, lengths, step time and memory",
    "resume": "continue a run: run again the command that started it (recorded in RUN_DIR/invocation.json)",
}

# Where a run's directory goes without --run-dir (planning/one_split.default_run_dir).
RUN_DIR_DEFAULT = "(default: launch.run_dir or grpo_runs/NAME)"


def examples(verb: str) -> str:
    """The examples of :data:`EPILOG` that use ``verb`` (``run``: those that start with a recipe), for its help."""
    lines = [line for line in EPILOG.splitlines()[1:] if _verb_of(line.split()[1]) == verb]
    return "examples:\n" + "\n".join(lines) + "\n" if lines else ""


def _verb_of(word: str) -> str:
    return "run" if word.endswith((".yaml", ".yml")) else word


def add_recipe_args(p: argparse.ArgumentParser, *, optional: str = "") -> None:
    """RECIPE and its key=value overrides; ``optional``: what RECIPE defaults to, said in its help."""
    p.add_argument(
        "recipe",
        nargs="?" if optional else None,
        default=None,
        help="recipe YAML (TRL/open-r1 keys plus an optional launch: block)"
        + (f"; default: {optional}" if optional else ""),
    )
    p.add_argument(
        "overrides",
        nargs="*",
        default=[],  # optional: without a default argparse calls a "*" positional required
        metavar="key=value",
        help="override recipe keys; values are YAML (max_steps=3, reward_funcs=[a,b], launch.vllm=off)",
    )


def add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus",
        metavar="SPEC",
        help="plan for simulated GPUs instead of probing: 4xL20-48GB, 8xH100-80GB, 2x8xH100-80GB, cpu; a GPU not in "
        "the table: 4xFOO-48GB@150TF@0.9TBs (dense bf16 peak, memory bandwidth); mixed GPU types, a group each "
        "joined by +: 8xH100-80GB+8xH20-96GB",
    )
    groups: dict = {}
    for options in option_classes().values():
        add_options(p, options, groups)


def add_planning_args(p: argparse.ArgumentParser) -> None:
    add_recipe_args(p)
    p.set_defaults(invocation_parser=p)  # its flags are recorded as given (invocation_of)
    add_topology_args(p)
    p.add_argument("--run-dir", help=f"where to write the configs and logs {RUN_DIR_DEFAULT}")
    add_launch_flags(p)


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    """The flags that stand for a launch.* key (run, plan and sbatch take them alike)."""
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


# Flags about this start, not the run: resume starts it again with its own.
NOT_RECORDED = ("--dry-run", "--resume", "--help")


def given_flags(args: argparse.Namespace) -> list[Flag]:
    """Every flag the command line set (a value other than its default), as given, in the parser's order."""
    from grpo_launch.rundir.invocation import Flag

    parser: argparse.ArgumentParser | None = getattr(args, "invocation_parser", None)
    flags: list[Flag] = []
    for action in parser._actions if parser is not None else ():
        if not action.option_strings or set(action.option_strings) & set(NOT_RECORDED):
            continue
        value, name = getattr(args, action.dest, action.default), max(action.option_strings, key=len)
        if value == action.default or value is None:
            continue
        if action.nargs == 0:  # store_true and its kind: the flag alone
            flags.append(Flag(name))
        elif isinstance(value, (list, tuple)):  # a repeatable flag
            flags += [Flag(name, str(v)) for v in value]
        else:
            flags.append(Flag(name, str(value)))
    return flags


def pasteable(emit: Callable[[str], None]) -> Callable[[str], None]:
    """``emit`` for output a user pastes into a shell (``--dry-run``): a comment line (``# plan: RECIPE …``) holding
    user text stays one comment line (:func:`~grpo_launch.rundir.shown_text.one_line`: a recipe path with a line break
    in it would otherwise end the comment and run what follows); the commands are shell-quoted where they are made."""

    def out(line: str) -> None:
        emit(one_line(line) if line.startswith("#") else line)

    return out


def invocation_of(args: argparse.Namespace, backend: str, run_dir: str, ctx: RunContext) -> Invocation:
    """The record of this command (secrets redacted), for RUN_DIR/invocation.json."""
    from grpo_launch.rundir.invocation import Invocation

    return Invocation.of(
        args.verb,
        args.recipe,
        list(args.overrides),
        given_flags(args),
        extra_args=tuple(getattr(args, "extra", ())),
        backend=backend,
        run_dir=os.path.abspath(run_dir),
        workdir=ctx.workdir,
        version=__version__,
    )


def record_invocation(
    args: argparse.Namespace, backend: str, run_dir: str, ctx: RunContext, job_id: str | None = None
) -> None:
    """Write RUN_DIR/invocation.json for this command (``resume``: the record it runs again, unchanged but for the
    batch job). Inside a submitted job (the record is a submitter's whose job runs on ``backend``) the submitter's
    record is kept: resuming that run submits it again."""
    from grpo_launch.rundir.invocation import read_invocation, write_invocation

    resuming = getattr(args, "resuming", None)
    record = resuming.record if resuming is not None else invocation_of(args, backend, run_dir, ctx)
    if args.verb == "run" and job_id is None:
        try:
            before = read_invocation(RunPaths(run_dir).invocation)
        except RunFileError:
            before = None  # a record that does not read is replaced by this one
        if before is not None and before.verb != "run" and job_backend(before.verb) == backend:
            return
    write_invocation(dataclasses.replace(record, job_id=job_id))


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The recipe overrides the command line's flags stand for (launch.* keys), after the user's own."""
    overrides = list(args.overrides)
    if getattr(args, "network_interface", None):
        overrides.append(f"launch.network_interface={args.network_interface}")
    if getattr(args, "adapt", False):
        overrides.append("launch.adapt=true")
    if getattr(args, "gpu_hour_price", None) is not None:
        overrides.append(f"launch.gpu_hour_price={args.gpu_hour_price}")
    if getattr(args, "max_restarts", None) is not None:
        overrides.append(f"launch.max_restarts={args.max_restarts}")
    return overrides


def load(args: argparse.Namespace) -> Recipe:
    """The recipe with its overrides (the command line's own flags among them)."""
    recipe = load_recipe(args.recipe, flag_overrides(args))
    if not recipe.get("model_name_or_path"):
        raise ConfigError(
            "the recipe names no model: set model_name_or_path",
            hint="e.g. model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct (a hub id or a local directory)",
        )
    return recipe


def topology(
    args: argparse.Namespace, ctx: RunContext, recipe: Recipe | None, *, starts: bool = False
) -> tuple[Topology, Backend]:
    """The machines to plan for and the backend that runs on them: --gpus > --hostfile > --ray (or RAY_ADDRESS) >
    Slurm > this machine.
    ``starts``: the plan's processes start here (``run`` without ``--dry-run``)."""
    options = {name: read_options(args, cls) for name, cls in option_classes().items()}
    if args.gpus is not None:
        asked = [opts for opts in options.values() if opts.chooses_backend()]
        if asked:
            other = asked[0].given_flags()[0]
            raise ConfigError(
                f"--gpus and {other} both say which machines to plan for",
                hint="Keep one: --gpus simulates GPUs; a hostfile line can name its own (node1 slots=8 gpu=H100-80GB).",
            )
    backend = select(options, ctx.environ, simulated=args.gpus is not None)
    if args.gpus is not None:  # this machine is not probed (plan's start-up: probe.local loads only to probe)
        cpu_processes = recipe.launch.num_processes if recipe else None
        simulated = parse_gpu_spec(args.gpus, cpu_processes=cpu_processes)
        if starts:  # processes start here: on this machine's GPUs, whatever --gpus says
            from grpo_launch.probe.local import probe_local

            _refuse_simulated(args.gpus, simulated, probe_local(ctx.environ))
        return simulated, backend
    from grpo_launch.probe.local import probe_local

    local = probe_local(ctx.environ)
    if recipe is not None and recipe.values.get("use_cpu") is True and local.is_cpu:
        local = dataclasses.replace(local, warnings=())  # the recipe asks for CPU: no GPU is not news
    return backend.probe(ctx.environ, local), backend


def _refuse_simulated(spec: str, simulated: Topology, here: Topology) -> None:
    """``run --gpus SPEC`` (not a dry run) starts processes on this machine: refused unless SPEC is what is here."""

    def model(name: str) -> object:
        return find_gpu_spec(name) or name.lower()

    same = simulated.is_cpu == here.is_cpu and (
        simulated.is_cpu
        or (
            len(here.hosts) == 1
            and simulated.gpus_per_host == here.gpus_per_host
            and {model(g.name) for h in simulated.hosts for g in h.gpus} == {model(g.name) for g in here.hosts[0].gpus}
        )
    )
    if not same:
        raise ConfigError(
            f"--gpus {spec} describes GPUs that are not here (this machine: {here.describe()}), and run starts "
            "its processes on this machine",
            hint="--gpus plans for other machines: add --dry-run to see the commands, or use grpo-launch plan "
            "RECIPE --gpus SPEC; to run here, leave --gpus out.",
        )


def plan_on(
    topo: Topology,
    recipe: Recipe,
    args: argparse.Namespace,
    ctx: RunContext,
    calibration: Calibration | None = None,
) -> Plan:
    """Plan ``recipe`` on ``topo`` with what this machine knows of the run: the run directory (--run-dir, else
    the recipe's, made absolute), this interpreter, the vLLM version it imports, the training set's rows when it
    is a local file, and the model's shape."""
    model, warning = resolve_model_shape(recipe.get("model_name_or_path"), ctx.environ)
    run_dir = os.path.normpath(os.path.join(ctx.workdir, args.run_dir or default_run_dir(recipe)))
    rows, rows_source = None, "launch.dataset_rows"
    if not recipe.launch.dataset_rows:  # with max_steps too: a batch larger than the training set trains 0 steps
        hub = int(recipe.get("max_steps") or -1) <= 0
        rows, rows_source = dataset_rows(recipe.values, ctx.workdir, ctx.environ, hub=hub)
    runtime = Runtime(
        run_dir=run_dir,
        python=ctx.python,
        vllm_version=vllm_version_here(),
        dataset_rows=rows,
        dataset_rows_source=rows_source,
        warnings=(warning,) if warning else (),
    )
    if model is not None:
        calibration, notes = stored_calibration(topo, recipe, model, runtime, ctx, calibration)
        runtime = dataclasses.replace(runtime, notices=notes)
    return make_plan(topo, recipe, model, runtime=runtime, calibration=calibration)


def stored_calibration(
    topo: Topology, recipe: Recipe, model: ModelShape, runtime: Runtime, ctx: RunContext, run: Calibration | None
) -> tuple[Calibration | None, tuple[str, ...]]:
    """The calibration a plan uses: the stored ``grpo-launch calibrate`` file for this machine, model, dtype and
    library versions first (its measured terms), a run's scales (``--calibrate-from``, the adapt loop) on top. A
    stored one for another GPU model or library version is not used, and the plan's notices say why."""
    if not any_stored(ctx.environ):
        return run, ()
    found = find_calibration(calibration_key(topo, model, recipe, runtime.vllm_version), ctx.environ)
    notes = [f"calibration not used: {why}" for why in found.ignored]
    if found.record is not None:
        notes.insert(
            0,
            f"calibration: {found.path} (measured: {', '.join(found.record.measured_terms())}; "
            "every other term from the GPU table)",
        )
    if found.record is None:
        return run, tuple(notes)
    from grpo_launch.planning.measured_scales import from_record

    at = {k: int(v) for k, v in found.record.at}
    scaled, more = from_record(found.record.terms, found.path, model, topo.planning_gpu_spec, at, run)
    return scaled, tuple(notes + more)


def plan_for(
    args: argparse.Namespace, ctx: RunContext, calibration: Calibration | None = None, *, starts: bool = False
) -> tuple[Plan, Backend]:
    """Load, probe and plan (``starts``: see :func:`topology`)."""
    recipe = load(args)
    topo, backend = topology(args, ctx, recipe, starts=starts)
    return plan_on(topo, recipe, args, ctx, calibration), backend
