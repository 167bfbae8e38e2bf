"""run_plan(plan, backend, ctx) → RunResult: the checks, the run directory's lock and files, the resume decision,
then supervised attempts (restarted from the newest complete checkpoint after a failure that is not the user's
code, with backoff; replanned more frugally after an out-of-memory failure with ``launch.on_oom: replan``), then
the backend's after-run step (e.g. a Slurm requeue). Every attempt is recorded in RUN_DIR/control/attempts.jsonl."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from grpo_launch import commands, control
from grpo_launch.backends.base import Backend, RunContext
from grpo_launch.checkpoints import RESUME_ENV, decide_resume
from grpo_launch.enums import Role
from grpo_launch.faults import FailureKind
from grpo_launch.planning.frugal import next_frugal_plan
from grpo_launch.planning.types import Plan
from grpo_launch.planning.verdict import split_verdict
from grpo_launch.preflight import check_output_dir, check_vllm, output_dir_of, preflight, stale_build_locks
from grpo_launch.reaper import RUN_ID_ENV
from grpo_launch.render import render_files
from grpo_launch.rundir import RunLock, write_run_files
from grpo_launch.session import supervise
from grpo_launch.spec import ProcessSpec, RunResult, RunState
from grpo_launch.watchdog import Watchdog

MAX_OOM_REPLANS = 4  # launch.on_oom: replan, at most this many times in a run


def placed_processes(
    plan: Plan, backend: Backend, ctx: RunContext, env: dict[str, str] | None = None
) -> tuple[ProcessSpec, ...]:
    """The plan's processes, each placed on its host by the backend (pure); ``env`` is added to each first (the
    run id and the resume decision reach remote hosts that way)."""
    specs = commands.all_processes(plan)
    if env:
        specs = tuple(dataclasses.replace(s, env={**s.env, **env}) for s in specs)
    return tuple(backend.place(spec, plan, ctx) for spec in specs)


def run_plan(
    plan: Plan,
    backend: Backend,
    ctx: RunContext,
    *,
    dry_run: bool = False,
    resume: str = "auto",
    max_restarts: int | None = None,
) -> RunResult:
    """Run ``plan`` with ``backend``. Input problems raise (nothing has started then); once processes start, every
    outcome is a RunResult. ``resume``: auto | never | must (see :func:`grpo_launch.checkpoints.decide_resume`);
    ``max_restarts`` overrides launch.max_restarts.

    SIGUSR2, or the allocation's end drawing near, asks the trainers to save a checkpoint and stop
    (STOPPED_FOR_CHECKPOINT); the backend may then requeue.
    """
    preflight(plan, ctx.workdir)
    if dry_run:
        placed = placed_processes(plan, backend, ctx)
        write_run_files(plan.run_dir, render_files(plan))
        ctx.emit(f"# run directory: {plan.run_dir}")
        for spec in placed:
            if spec.host:
                ctx.emit(f"# on {spec.host}: {spec.name}")
            ctx.emit(spec.shell())
        return RunResult(RunState.SUCCEEDED, 0)
    plan = dataclasses.replace(plan, vllm_version=check_vllm(plan) or plan.vllm_version)
    with RunLock(plan.run_dir):
        for warning in check_output_dir(plan, ctx.workdir):
            ctx.emit(f"[grpo-launch] warning: {warning}")
        backend.preflight(plan, ctx)
        result = _attempts(plan, backend, ctx, resume, plan.recipe.launch.max_restarts if max_restarts is None
                           else max_restarts)  # fmt: skip
    result = backend.after_run(plan, result, ctx)  # first: a requeue before the time limit must not wait for plots
    _report(plan, ctx)
    return result


def _attempts(plan: Plan, backend: Backend, ctx: RunContext, resume: str, max_restarts: int) -> RunResult:
    restarts = replans = 0
    started = time.time()
    limit = plan.recipe.launch.time_limit_s
    while True:
        decision = decide_resume(output_dir_of(plan, ctx.workdir), resume, _max_steps(plan))
        for note in decision.notes:
            ctx.emit(f"[grpo-launch] {note}")
        if decision.already_complete is not None:
            done = decision.already_complete
            ctx.emit(
                f"[grpo-launch] this run is already complete (step {done.get('step')}/{done.get('max_steps')}, "
                f"model in {output_dir_of(plan, ctx.workdir)}): nothing to do. To train again from scratch: "
                "--resume never (earlier checkpoints are set aside, the final model is replaced)."
            )
            return RunResult(RunState.SUCCEEDED, 0, message="already complete")
        deadlines = [d for d in (backend.deadline(ctx), started + limit if limit else None) if d]
        result = _attempt(plan, backend, ctx, decision.env_value, min(deadlines) if deadlines else None)
        result = dataclasses.replace(result, restarts=restarts + replans)
        _record(plan, restarts + replans, result)
        if result.ok or result.state == RunState.INTERRUPTED:
            return result
        if result.failure == FailureKind.DISK_FULL:
            result = dataclasses.replace(result, detail=f"{result.detail or ''}\n{_disk_advice(plan, ctx)}".strip())
        oom_replan = result.failure == FailureKind.OOM and plan.recipe.launch.on_oom == "replan"
        frugal = _frugal(plan, result) if result.failure == FailureKind.OOM else None
        if result.failure == FailureKind.OOM and frugal is not None and not oom_replan:
            result = dataclasses.replace(
                result,
                detail=f"{result.detail or ''}\nthe plan's next memory fix: {frugal[1]} "
                "(or set launch.on_oom: replan to apply it and restart)".strip(),
            )
        resume = "auto"
        if oom_replan and frugal is not None and replans < MAX_OOM_REPLANS:
            # Its own budget: each replan is one step more frugal, and there are only a few steps.
            replans += 1
            plan = frugal[0]
            ctx.emit(f"[grpo-launch] out of memory: replanned with {frugal[1]}; restarting")
            continue  # the next attempt writes the new plan's files
        if result.failure not in (FailureKind.INFRA, FailureKind.HANG) or restarts >= max_restarts:
            if result.failure in (FailureKind.INFRA, FailureKind.HANG) and max_restarts:
                ctx.emit(f"[grpo-launch] no restart left (launch.max_restarts={max_restarts})")
            return result
        restarts += 1
        wait = plan.recipe.launch.restart_backoff_s * 2 ** (restarts - 1)
        ctx.emit(
            f"[grpo-launch] restart {restarts}/{max_restarts} in {wait:.0f} s after a {result.failure} failure "
            f"({result.cause or result.message}); resuming from the newest complete checkpoint"
        )
        time.sleep(wait)


def _disk_advice(plan: Plan, ctx: RunContext) -> str:
    import shutil

    out = output_dir_of(plan, ctx.workdir)
    try:
        free = f"{shutil.disk_usage(out).free / 1024**3:.2f} GiB free"
    except OSError:
        free = "free space unknown"
    return (
        f"the disk is full: output_dir {out} ({free}). Free space or move output_dir, then run again: the damaged "
        "checkpoint is set aside and the run resumes from the newest complete one."
    )


def _report(plan: Plan, ctx: RunContext) -> None:
    """The run report (plots of the run's measurements), when the run trained a step and matplotlib is there."""
    from grpo_launch.errors import ConfigError
    from grpo_launch.report import write_report

    if not (Path(plan.run_dir) / control.METRICS_FILE).is_file():
        return
    try:
        ctx.emit(f"[grpo-launch] run report: {write_report(plan.run_dir)}")
    except ConfigError as exc:
        ctx.emit(f"[grpo-launch] no run report: {exc.message} ({exc.hint})")
    except (OSError, ValueError) as exc:
        ctx.emit(f"[grpo-launch] no run report: {exc}")


def _frugal(plan: Plan, result: RunResult) -> tuple[Plan, str] | None:
    vllm_side = (result.cause or "").startswith("[vllm")
    return next_frugal_plan(plan, vllm_side=vllm_side, cause=result.cause or "")


def _max_steps(plan: Plan) -> int | None:
    value = plan.trainer_values.get("max_steps")
    return int(value) if isinstance(value, int) and value > 0 else None


def _attempt(plan: Plan, backend: Backend, ctx: RunContext, resume_from: str, deadline: float | None) -> RunResult:
    """One supervised run of every process."""
    import uuid

    run_id = uuid.uuid4().hex
    placed = placed_processes(plan, backend, ctx, {RUN_ID_ENV: run_id, RESUME_ENV: resume_from})
    write_run_files(plan.run_dir, render_files(plan), locked=True)
    control.reset(plan.run_dir)
    if plan.train.backend.is_deepspeed:
        for lock in stale_build_locks(ctx.environ):
            ctx.emit(
                f"[grpo-launch] warning: {lock} exists. Another run is building that torch extension, or a killed "
                "build left the lock, and DeepSpeed then waits for it forever: if no other run is building, "
                "delete it."
            )
    launch = plan.recipe.launch

    def stop_for_deadline(why: str) -> None:
        ctx.emit(f"[grpo-launch] {why}")
        control.request_stop(plan.run_dir)

    planned = None
    if plan.estimate is not None:
        est = plan.estimate.step  # the trainer's "generation" includes the old log-probs and the weight sync
        planned = (est.generation_s + est.old_logprobs_s + est.sync_s, est.training_s)

    def show_split(generation_s: float, training_s: float) -> None:
        verdict = split_verdict(generation_s, training_s, plan.vllm.mode, planned=planned, run_dir=plan.run_dir,
                                cpu=plan.topology.is_cpu)  # fmt: skip
        ctx.emit(f"[grpo-launch] {verdict}")

    watchdog = Watchdog(
        Path(plan.run_dir) / control.METRICS_FILE,
        first_step_s=launch.first_step_timeout_s,
        hang_s=launch.hang_timeout_s,
        deadline=deadline,
        on_deadline=stop_for_deadline,
        on_split=show_split,
    )
    server = next((s for s in placed if s.role == Role.VLLM), None)
    result = supervise(
        server,
        [s for s in placed if s.role == Role.TRAIN],
        health_url=plan.vllm.health_url if server else None,
        health_timeout_s=launch.vllm_health_timeout_s,
        log_dir=Path(plan.run_dir) / "logs",
        grace_s=launch.grace_period_s,
        environ=ctx.environ,
        emit=ctx.emit,
        on_checkpoint_request=lambda: control.request_stop(plan.run_dir),
        signal_remote=lambda spec, pgid, sig: backend.signal_remote(spec, pgid, sig, ctx),
        watch=watchdog,
        run_id=run_id,
        stacks_dir=control.control_dir(plan.run_dir) / control.STACKS_DIR,
    )
    step = control.stopped_at(plan.run_dir)
    if result.ok and step is not None:
        ctx.emit(f"[grpo-launch] stopped after step {step} with a checkpoint; the next run resumes from it")
        result = dataclasses.replace(result, state=RunState.STOPPED_FOR_CHECKPOINT, stopped_at_step=step)
    return result


def _record(plan: Plan, restarts: int, result: RunResult) -> None:
    """One line per attempt in RUN_DIR/control/attempts.jsonl (``grpo-launch status`` shows them)."""
    line = {
        "attempt": restarts + 1,
        "ended": time.time(),
        "state": str(result.state),
        "exit_code": result.exit_code,
        "failure": result.failure,
        "cause": result.cause,
        "message": result.message,
    }
    path = control.control_dir(plan.run_dir) / control.ATTEMPTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
