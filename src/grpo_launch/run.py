"""run_plan(plan, backend, ctx) → RunResult: the common checks, the backend's placement and checks, the run
directory's files, then supervision, then the backend's after-run step (e.g. a Slurm requeue)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from grpo_launch import commands, control
from grpo_launch.backends.base import Backend, RunContext
from grpo_launch.commands import TRL_VLLM_RANGE, version_tuple
from grpo_launch.enums import Role, VllmMode
from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.planning.types import Plan
from grpo_launch.probe import interpreter_of, looks_local, vllm_version_of
from grpo_launch.recipe import LOCAL_DATA_SUFFIXES
from grpo_launch.render import render_files
from grpo_launch.rundir import write_run_files
from grpo_launch.spec import ProcessSpec, RunResult, RunState
from grpo_launch.supervisor import supervise
from grpo_launch.train.rewards import check_reward_names, is_import_path


def preflight(plan: Plan, workdir: str) -> None:
    """Everything about the recipe's inputs that can be checked before a process starts, reported together.
    ``workdir`` (where the processes start; the CLI runs there) names the base of relative paths in messages."""
    values = plan.trainer_values
    problems: list[str] = []
    model = str(values.get("model_name_or_path") or "")
    if not model:
        problems.append("model_name_or_path is not set")
    elif looks_local(model) and not (Path(model).expanduser() / "config.json").is_file():
        problems.append(
            f"model path {model!r} has no config.json (is the path right? relative paths start from {workdir})"
        )
    data = str(values.get("dataset_name") or "")
    if not data:
        problems.append("dataset_name is not set")
    elif Path(data).suffix in LOCAL_DATA_SUFFIXES and not Path(data).expanduser().is_file():
        problems.append(f"dataset file {data!r} not found")
    elif looks_local(data) and not Path(data).expanduser().exists():
        problems.append(f"dataset path {data!r} not found")
    rewards = values.get("reward_funcs") or []
    names = [rewards] if isinstance(rewards, str) else [str(r) for r in rewards]
    problems += check_reward_names(names) or missing_reward_modules(plan, names, workdir)
    if problems:
        raise ConfigError("cannot start the run:", problems=problems)


def missing_reward_modules(plan: Plan, names: list[str], workdir: str) -> list[str]:
    """Import-path rewards whose top-level module the trainers' Python cannot find (from the working directory,
    with the run's PYTHONPATH), found without importing anything; only for a run on this machine."""
    import subprocess

    modules = sorted({n.partition(":")[0].split(".")[0] for n in names if is_import_path(n)})
    if not modules or len(plan.topology.hosts) > 1:
        return []
    code = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    env = dict(os.environ) | dict(plan.recipe.launch.train_env)
    try:
        out = subprocess.run(
            [plan.python, "-c", code, *modules], cwd=workdir, env=env, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return []  # the interpreter itself is checked when the trainers start
    return [
        f"reward_funcs: module {m!r} is not importable from {workdir} by {plan.python} (check the name, or add "
        "its directory to PYTHONPATH: launch.train_env)"
        for m in out.stdout.split()
    ]


def check_vllm(plan: Plan) -> str | None:
    """The trainers import vLLM in both modes (TRL's client and the NCCL weight transfer, whose wire format changes
    between versions), so vLLM must be importable in the trainers' Python, within TRL 1.16's range, and (server
    mode) the same version as the server's. Returns the server's version; raises one error with every problem."""
    if plan.vllm.mode == VllmMode.OFF:
        return None
    low, high = TRL_VLLM_RANGE
    problems = []
    trainer = vllm_version_of(plan.python)
    versions = {f"the trainers' Python ({plan.python})": trainer}
    if plan.vllm.mode == VllmMode.SERVER:
        command = plan.recipe.launch.vllm_command
        python = interpreter_of(command[0])
        if python is None:
            problems.append(f"cannot find the Python behind the server command {command[0]!r} (launch.vllm_command)")
        else:
            versions[f"the server's Python ({python})"] = vllm_version_of(python)
    for where, version in versions.items():
        v = version_tuple(version)
        if version == "missing":
            problems.append(f"vLLM is not installed in {where}")
        elif v is None:
            problems.append(f"cannot read the vLLM version in {where}: {version}")
        elif not low <= v <= high:
            problems.append(f"vLLM {version} in {where} is outside TRL 1.16's range 0.22–0.31")
    found = {version_tuple(v) for v in versions.values()}
    if not problems and len(found) > 1:
        problems.append(
            "the trainers and the server run different vLLM versions: "
            + ", ".join(f"{v} in {w}" for w, v in versions.items())
        )
    if problems:
        raise LaunchError(
            "vLLM is not ready for this run:",
            problems=problems,
            hint="Install the same vLLM (0.22–0.31) where the trainers run and where the server runs: "
            "pip install 'grpo-launch[train,vllm]', or point launch.vllm_command at the trainers' environment.",
        )
    return list(versions.values())[-1]  # the server's in server mode, else the trainers'


def placed_processes(plan: Plan, backend: Backend, ctx: RunContext) -> tuple[ProcessSpec, ...]:
    """The plan's processes, each placed on its host by the backend (pure)."""
    return tuple(backend.place(spec, plan, ctx) for spec in commands.all_processes(plan))


def run_plan(plan: Plan, backend: Backend, ctx: RunContext, *, dry_run: bool = False) -> RunResult:
    """Run ``plan`` with ``backend``. Input problems raise (nothing has started then); once processes start, every
    outcome is a RunResult.

    SIGUSR2 asks the trainers to save a checkpoint and stop (STOPPED_FOR_CHECKPOINT); the backend may then requeue.
    """
    preflight(plan, ctx.workdir)
    if not dry_run:
        plan = dataclasses.replace(plan, vllm_version=check_vllm(plan) or plan.vllm_version)
    placed = placed_processes(plan, backend, ctx)
    write_run_files(plan.run_dir, render_files(plan))
    if dry_run:
        ctx.emit(f"# run directory: {plan.run_dir}")
        for spec in placed:
            if spec.host:
                ctx.emit(f"# on {spec.host}: {spec.name}")
            ctx.emit(spec.shell())
        return RunResult(RunState.SUCCEEDED, 0)
    backend.preflight(plan, ctx)
    control.reset(plan.run_dir)
    if plan.train.backend.is_deepspeed:
        for lock in stale_build_locks(ctx.environ):
            ctx.emit(
                f"[grpo-launch] warning: {lock} exists. Another run is building that torch extension, or a killed "
                "build left the lock, and DeepSpeed then waits for it forever: if no other run is building, "
                "delete it."
            )
    server = next((s for s in placed if s.role == Role.VLLM), None)
    result = supervise(
        server,
        [s for s in placed if s.role == Role.TRAIN],
        health_url=plan.vllm.health_url if server else None,
        health_timeout_s=plan.recipe.launch.vllm_health_timeout_s,
        log_dir=Path(plan.run_dir) / "logs",
        grace_s=plan.recipe.launch.grace_period_s,
        environ=ctx.environ,
        emit=ctx.emit,
        on_checkpoint_request=lambda: control.request_stop(plan.run_dir),
        signal_remote=lambda spec, pgid, sig: backend.signal_remote(spec, pgid, sig, ctx),
    )
    step = control.stopped_at(plan.run_dir)
    if result.ok and step is not None:
        ctx.emit(f"[grpo-launch] stopped after step {step} with a checkpoint; the next run resumes from it")
        result = dataclasses.replace(result, state=RunState.STOPPED_FOR_CHECKPOINT, stopped_at_step=step)
    return backend.after_run(plan, result, ctx)


def stale_build_locks(environ: Mapping[str, str]) -> list[Path]:
    """Lock files of torch's JIT extension builds (DeepSpeed compiles its ops on first use)."""
    root = Path(
        environ.get("TORCH_EXTENSIONS_DIR") or Path(environ.get("HOME", "~")).expanduser() / ".cache/torch_extensions"
    )
    return sorted({*root.glob("*/lock"), *root.glob("*/*/lock")})
