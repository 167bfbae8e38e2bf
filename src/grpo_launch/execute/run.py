"""run_plan(plan, backend, ctx) → RunResult: the checks, the run directory's lock and files, the resume decision,
then supervised attempts (what follows each failed one is :mod:`.policy`'s decision: a restart from the newest
complete checkpoint, a more frugal plan after an out-of-memory failure, or the end), then the backend's after-run
step (e.g. a Slurm requeue). Every attempt is recorded in the run directory
(:class:`~grpo_launch.rundir.records.Attempt`).

A dry run and a real attempt prepare the same way (:func:`prepare_attempt`: the processes placed by the backend
and the files rendered); the real one then starts them."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from grpo_launch.analysis.report import write_report
from grpo_launch.analysis.split_verdict import split_verdict
from grpo_launch.analysis.view import RunView
from grpo_launch.backends.base import Backend
from grpo_launch.enums import FailureKind, LaunchMode, ResumeMode, Role, RunState, VllmMode
from grpo_launch.errors import ConfigError, GrpoLaunchError, size_text
from grpo_launch.execute.adapt import Adapter, adapter_for
from grpo_launch.execute.live import live_run
from grpo_launch.execute.policy import Action, Spent, next_action
from grpo_launch.execute.preflight import Stage, planned_reporters, preflight, stale_build_locks
from grpo_launch.execute.session import SessionSpec, Stopping, supervise
from grpo_launch.execute.stop_channel import StopChannel
from grpo_launch.execute.watchdog import Watchdog
from grpo_launch.node.vllm_guard import RESTARTED_ENV
from grpo_launch.planning.plan_types import Plan
from grpo_launch.recipe.launch import DEFAULT_STOP_GRACE_S
from grpo_launch.render import render_files
from grpo_launch.render.processes import all_processes, attempt_env
from grpo_launch.rundir.checkpoints import checkpoint_problems, checkpoints, decide_resume, max_steps_of, set_aside
from grpo_launch.rundir.files import (
    LauncherLog,
    RunLock,
    in_use,
    lock_holder,
    plan_files_dir,
    set_aside_record,
    write_run_files,
)
from grpo_launch.rundir.layout import GRACE_ENV, RESUME_ENV, RUN_DIR_ENV, RUN_ID_ENV, STOP_NOTICE_ENV, VLLM_TOKEN_ENV
from grpo_launch.rundir.records import Attempt, SaveRecord, StepRecord, append, read_metrics
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.rundir.tracking import keep_tracking
from grpo_launch.rundir.trusted_files import private_umask
from grpo_launch.spec import ProcessSpec, RunContext, RunResult, frozen


@frozen
class Prepared:
    """An attempt ready to start: the plan's processes as the backend places them on their hosts, and the run
    directory's files (relative path → text)."""

    plan: Plan
    processes: tuple[ProcessSpec, ...]
    files: Mapping[str, str]
    # the server's processes placed again as a replacement (execute/server_keeper.py), the server's first
    replacement: tuple[ProcessSpec, ...] = ()

    @property
    def server(self) -> ProcessSpec | None:
        return next((s for s in self.processes if s.role == Role.VLLM), None)

    @property
    def server_workers(self) -> tuple[ProcessSpec, ...]:
        """The server's headless processes on its other hosts (multi-node data parallel)."""
        return tuple(s for s in self.processes if s.role == Role.VLLM)[1:]

    @property
    def trainers(self) -> tuple[ProcessSpec, ...]:
        return tuple(s for s in self.processes if s.role == Role.TRAIN)


def prepare_attempt(plan: Plan, backend: Backend, ctx: RunContext, env: Mapping[str, str] | None = None) -> Prepared:
    """The plan's processes placed by the backend and its files rendered (pure). ``env`` is added to every process
    first (the run id and the resume decision reach remote hosts that way)."""
    specs = all_processes(plan)
    if env:
        specs = tuple(dataclasses.replace(s, env={**s.env, **env}) for s in specs)
    placed = tuple(backend.place(spec, plan, ctx) for spec in specs)
    # a replacement server, should the first be lost: the same processes, their guard locked until the weights
    # arrive (the mark must travel with each host's placement: on ssh and Ray hosts it is part of the command).
    # None for AsyncGRPOTrainer, whose generation thread train/server_restart.py does not keep.
    again = tuple(
        backend.place(dataclasses.replace(s, env={**s.env, RESTARTED_ENV: "1"}), plan, ctx)
        for s in specs
        if s.role == Role.VLLM and plan.recipe.launch.mode is LaunchMode.SYNC
    )
    return Prepared(plan, placed, render_files(plan), again)


def stdin_values(processes: tuple[ProcessSpec, ...]) -> dict[str, str]:
    """The values a remote backend took off its command lines (a value that would be redacted in print travels on
    stdin: :func:`grpo_launch.backends.remote.off_the_command_line`). The supervisor sends a process's stdin names
    with their values in the run's environment, one value per name: two processes that need two such values under
    one name are refused, never sent the wrong one."""
    out: dict[str, str] = {}
    for spec in processes:
        for name in spec.stdin_env:
            if name in spec.env and out.setdefault(name, spec.env[name]) != spec.env[name]:
                raise ConfigError(
                    f"{name} has two values that look like secrets (launch.train_env and launch.vllm_env?), and "
                    "such a value travels to the hosts on stdin, one value per name",
                    hint=f"Give both processes the same {name}, or rename one of them.",
                )
    return out


def run_plan(
    plan: Plan,
    backend: Backend,
    ctx: RunContext,
    *,
    dry_run: bool = False,
    resume: ResumeMode = ResumeMode.AUTO,
    max_restarts: int | None = None,
    log: LauncherLog | None = None,
    on_start: Callable[[], None] | None = None,
) -> RunResult:
    """Run ``plan`` with ``backend``. Input problems raise (nothing has started then); once processes start, every
    outcome is a RunResult. ``resume``: see :func:`grpo_launch.rundir.checkpoints.decide_resume`;
    ``max_restarts`` overrides launch.max_restarts; ``log`` (the launcher's own log) starts writing once the run
    holds its run directory, and ``on_start`` is called then (``run`` records its command).

    SIGUSR2, or the allocation's end drawing near, asks the trainers to save a checkpoint and stop
    (STOPPED_FOR_CHECKPOINT); the backend may then requeue. The first Ctrl-C or SIGTERM does too, within
    launch.stop_grace_s, and the run ends INTERRUPTED (128+N) with the checkpoint's step (:func:`_stopping`).
    """
    if dry_run:
        preflight(plan, ctx, Stage.DRY_RUN, warn=lambda w: ctx.emit(f"# warning: {w}"))
        return _dry_run(plan, backend, ctx)
    checked = preflight(plan, ctx, Stage.RUN)
    limit = plan.recipe.launch.max_restarts if max_restarts is None else max_restarts
    # Under the private umask, the processes the run starts create what only its user may change (its checkpoints:
    # auto-resume unpickles them); the launcher's own files are made 0600/0700 explicitly.
    with private_umask(), RunLock(plan.run_dir, backend=backend.name, job_id=backend.job_id(ctx)), live_run(plan, ctx):
        backend.preflight(plan, ctx)
        if log is not None:  # every check passed: the run starts here
            log.start()
        if on_start is not None:
            on_start()
        for warning in checked.warnings:
            ctx.emit(f"[grpo-launch] warning: {warning}")
        result = _attempts(plan, backend, ctx, ResumeMode(resume), limit, checked.output_dir)
    result = backend.after_run(plan, result, ctx)  # first: a requeue before the time limit must not wait for plots
    _report(plan, ctx, result)
    return result


def _dry_run(plan: Plan, backend: Backend, ctx: RunContext) -> RunResult:
    """Print the commands an attempt would run, and write its files where a plan may (:func:`plan_files_dir`: a
    run's record is never overwritten). In a run directory holding a run's record the files go to RUN_DIR/plans/TIME/,
    and the printed commands read them there: the same text the real run writes into RUN_DIR when it starts, never
    the earlier run's files still in RUN_DIR. The run directory the processes report to stays RUN_DIR."""
    if (holder := lock_holder(plan.run_dir)) is not None:
        raise in_use(Path(plan.run_dir), holder)
    target, kept = plan_files_dir(plan.run_dir)
    shown = plan if kept is None else dataclasses.replace(plan, run_dir=str(target))
    prepared = prepare_attempt(shown, backend, ctx, {RUN_DIR_ENV: plan.run_dir} if kept else None)
    files = {**prepared.files, **render_files(plan)} if kept else prepared.files  # plan.json names RUN_DIR
    write_run_files(target, files)
    ctx.emit(f"# run directory: {plan.run_dir}")
    if kept:
        ctx.emit(
            f"# {kept}; the commands below read them there (the real run writes the same files into "
            f"{plan.run_dir} when it starts)"
        )
    for spec in prepared.processes:
        if spec.host:
            ctx.emit(f"# on {spec.host}: {spec.name}")
        ctx.emit(spec.shell())
    return RunResult(RunState.SUCCEEDED, 0)


def _attempts(
    plan: Plan, backend: Backend, ctx: RunContext, resume: ResumeMode, max_restarts: int, output_dir: Path
) -> RunResult:
    """The attempt loop: resume decision → attempt → record → decision (:func:`~.policy.next_action`) → apply.
    ``output_dir``: where the trainers write (their checkpoints)."""
    spent = Spent()
    stop = StopChannel(plan.run_dir, ctx.emit)  # the run's stop requests, every attempt's
    started = time.time()
    if resume == ResumeMode.NEVER and (aside := set_aside_record(plan.run_dir)) is not None:
        ctx.emit(
            f"[grpo-launch] --resume never: the earlier run's record (plan.json, metrics, attempts) is kept in {aside}"
        )
    limit = plan.recipe.launch.time_limit_s
    adapter = adapter_for(plan, ctx.emit, stop)
    tracking = keep_tracking(plan.paths)  # one W&B/trackio run over every attempt, resume and requeue of this run
    if reporters := planned_reporters(plan.trainer_values):
        ctx.emit(
            f"[grpo-launch] tracking: {', '.join(reporters)}, one run over every attempt: W&B id "
            f"{tracking.run_id}, name {tracking.name} ({plan.paths.tracking})"
        )
    while True:
        decision = decide_resume(output_dir, resume, max_steps_of(plan.trainer_values))
        for note in decision.notes:
            ctx.emit(f"[grpo-launch] {note}")
        if decision.already_complete is not None:
            done = decision.already_complete
            ctx.emit(
                f"[grpo-launch] this run is already complete (step {done.step}/{done.max_steps}, "
                f"model in {output_dir}): nothing to do. To train again from scratch: "
                "--resume never (earlier checkpoints are set aside, the final model is replaced)."
            )
            return RunResult(RunState.SUCCEEDED, 0, message="already complete")
        deadlines = [d for d in (backend.deadline(ctx), started + limit if limit else None) if d]
        view = RunView.load(plan.run_dir, strict=False)  # read once an attempt
        if adapter is not None:
            adapter.begin(plan, after_step=view.last_step)
        number = view.next_attempt  # numbered over the run, resumes included
        env = {
            RESUME_ENV: decision.env_value,
            **attempt_env(number, tracking, {**ctx.environ, **plan.recipe.launch.train_env}),
        }
        result = _attempt(plan, backend, ctx, env, min(deadlines) if deadlines else None, adapter, stop, output_dir)
        result = dataclasses.replace(result, restarts=spent.attempts)
        _record(plan, number, result, adapter)
        disk = result.failure is not None and result.failure.kind == FailureKind.DISK_FULL
        step = next_action(
            plan,
            result,
            spent,
            max_restarts=max_restarts,
            disk_advice=_disk_advice(output_dir) if disk else None,
            leaving=backend.machines_leaving(ctx),
            resplit=adapter.pending.new_split if adapter is not None and adapter.pending is not None else None,
        )
        if step.note:
            ctx.emit(f"[grpo-launch] {step.note}")
        if step.action == Action.STOP:
            return step.result
        resume = ResumeMode.AUTO
        if step.action == Action.RESPLIT:
            assert adapter is not None
            plan, spent = adapter.move(), dataclasses.replace(spent, resplits=spent.resplits + 1)
            continue  # from the checkpoint just saved, on the new layout
        if step.action == Action.REPLAN:
            assert step.plan is not None
            plan, spent = step.plan, dataclasses.replace(spent, replans=spent.replans + 1)
            continue  # the next attempt writes the new plan's files
        spent = dataclasses.replace(spent, restarts=spent.restarts + 1)
        time.sleep(step.wait_s)
        again = backend.before_restart(plan, step.result, ctx)  # e.g. Ray: the lost node back, or a replacement
        if isinstance(again, RunResult):
            return again
        plan = again


def _disk_advice(out: Path) -> str:
    try:
        free = f"{size_text(shutil.disk_usage(out).free)} free"
    except OSError:
        free = "free space unknown"
    return (
        f"the disk is full: output_dir {out} ({free}). Free space or move output_dir, then run again: the damaged "
        "checkpoint is set aside and the run resumes from the newest complete one."
    )


def _report(plan: Plan, ctx: RunContext, result: RunResult) -> None:
    """The run report (plots of the run's measurements), when the run trained a step and matplotlib is there. An
    interrupted run (Ctrl-C, SIGTERM, SIGHUP) gets none: its processes are down, and the plotting (2–3 s of
    `grpo-launch report` on 2 idle cores, several times that loaded) would keep waiting whoever asked for the stop,
    or a preempted job's grace; it says how to write it."""
    if not plan.paths.metrics.is_file():
        return
    if result.state == RunState.INTERRUPTED:
        how = command_line(["grpo-launch", "report", plan.run_dir])
        ctx.emit(f"[grpo-launch] run report: not written after an interrupt (Ctrl-C, SIGTERM, SIGHUP); {how} writes it")
        return
    try:
        ctx.emit(f"[grpo-launch] run report: {write_report(plan.run_dir)}")
    except GrpoLaunchError as exc:  # no matplotlib, a link planted in the report's place: the run's end stands
        ctx.emit(f"[grpo-launch] no run report: {exc.message} ({exc.hint})")
    except (OSError, ValueError) as exc:
        ctx.emit(f"[grpo-launch] no run report: {exc}")


def _attempt(
    plan: Plan,
    backend: Backend,
    ctx: RunContext,
    env: Mapping[str, str],
    deadline: float | None,
    adapter: Adapter | None,
    stop: StopChannel,
    output_dir: Path,
) -> RunResult:
    """One supervised run of every process; ``env``: the attempt's own (the resume decision, its number, the run's
    tracking run); ``stop``: the run's stop channel, given to each part that asks for a stop or reads the answer."""
    run_id = uuid.uuid4().hex
    if plan.vllm.mode == VllmMode.SERVER:
        # A fresh token for the server's guard (grpo_launch.node.vllm_guard) and the trainers' clients: in the
        # processes' environment here, on stdin to ssh/Ray hosts (backends.remote.PASSED_ENV); never argv or a file.
        ctx = dataclasses.replace(ctx, environ={**ctx.environ, VLLM_TOKEN_ENV: secrets.token_urlsafe(32)})
    grace = f"{plan.recipe.launch.grace_period_s:g}"  # every host's guard stops the run's processes within it
    prepared = prepare_attempt(plan, backend, ctx, {RUN_ID_ENV: run_id, GRACE_ENV: grace, **env})
    ctx = dataclasses.replace(ctx, environ={**ctx.environ, **stdin_values(prepared.processes)})
    write_run_files(plan.run_dir, prepared.files, locked=True)
    stop.reset()
    if plan.train.backend.is_deepspeed:
        for lock in stale_build_locks(ctx.environ):
            ctx.emit(
                f"[grpo-launch] warning: {lock} exists. Another run is building that torch extension, or a killed "
                "build left the lock, and DeepSpeed then waits for it forever: if no other run is building, "
                "delete it."
            )
    launch = plan.recipe.launch
    watchdog = _watchdog(plan, ctx, deadline, adapter, stop)
    session = SessionSpec(
        server=prepared.server,
        server_workers=prepared.server_workers,
        server_replacement=prepared.replacement,
        server_restarts=launch.server_restarts,
        trainers=prepared.trainers,
        log_dir=plan.paths.logs,
        health_url=plan.vllm.health_url if prepared.server else None,
        health_timeout_s=launch.vllm_health_timeout_s,
        grace_s=launch.grace_period_s,
        run_id=run_id,
        paths=plan.paths,
    )
    with backend.attempt(prepared.processes, plan, ctx, lambda reason: stop.request(reason=reason)):
        result = supervise(
            session,
            environ=ctx.environ,
            emit=ctx.emit,
            channel=stop,
            signal_remote=lambda spec, pgid, sig: backend.signal_remote(spec, pgid, sig, ctx),
            watch=watchdog,
            stopping=_stopping(plan, backend, ctx, stop, env.get(RESUME_ENV, ""), watchdog.stuck),
        )
    return _how_it_stopped(plan, ctx, result, stop, output_dir)


def _watchdog(
    plan: Plan, ctx: RunContext, deadline: float | None, adapter: Adapter | None, stop: StopChannel
) -> Watchdog:
    """The attempt's progress watchdog: hangs and the first step's time-out, the allocation's end (a checkpoint and
    stop before it), the measured split against the planned one, and launch.adapt's step hook."""
    launch = plan.recipe.launch

    planned = None
    if plan.estimate is not None and plan.estimate.step is not None:
        est = plan.estimate.step  # the trainer's "generation" includes the old log-probs and the weight sync
        planned = (est.generation_s + est.old_logprobs_s + est.sync_s, est.training_s)

    def show_split(generation_s: float, training_s: float) -> None:
        verdict = split_verdict(
            generation_s,
            training_s,
            plan.vllm.mode,
            planned=planned,
            run_dir=plan.run_dir,
            cpu=plan.topology.is_cpu,
            step=watchdog.split_steps,
        )
        ctx.emit(f"[grpo-launch] {verdict}")

    watchdog = Watchdog(
        plan.paths.metrics,
        first_step_s=launch.first_step_timeout_s,
        hang_s=launch.hang_timeout_s,
        deadline=deadline,
        on_deadline=stop.request,
        on_split=show_split,
        on_step=adapter.on_step if adapter is not None else None,
    )
    return watchdog


def _how_it_stopped(plan: Plan, ctx: RunContext, result: RunResult, stop: StopChannel, output_dir: Path) -> RunResult:
    """The attempt's result with a checkpoint-and-stop said: after the first Ctrl-C or SIGTERM (INTERRUPTED, with the
    step saved), or on request (SIGUSR2, the allocation's end: STOPPED_FOR_CHECKPOINT)."""
    step = stop.stopped_at()
    if result.state == RunState.INTERRUPTED and step is not None:  # the first Ctrl-C or SIGTERM, honoured
        again = command_line(["grpo-launch", "resume", plan.run_dir])
        ctx.emit(f"[grpo-launch] stopped after saving checkpoint-{step}; the same command resumes from it ({again})")
        saved = f"{result.message}: stopped after saving checkpoint-{step}"
        result = dataclasses.replace(result, stopped_at_step=step, message=saved)
        stop.reset()  # the attempt's record keeps the step: `status` reads how it ended from there
    elif result.ok and step is not None:
        ctx.emit(f"[grpo-launch] stopped after step {step} with a checkpoint; the next run resumes from it")
        result = dataclasses.replace(result, state=RunState.STOPPED_FOR_CHECKPOINT, stopped_at_step=step)
    elif result.state == RunState.INTERRUPTED and (lost := _what_was_lost(plan, stop, output_dir)) is not None:
        ctx.emit(f"[grpo-launch] {lost}")  # a second Ctrl-C, or a stop that could not wait: what it cost
        result = dataclasses.replace(result, message=f"{result.message}: {lost}")
    return result


def _what_was_lost(plan: Plan, stop: StopChannel, out: Path) -> str | None:
    """After a stop without a checkpoint (every process has ended): the checkpoint that was being written, set aside
    now if it is half-written (a resume would skip it as damaged), and the steps that will be trained again; None
    when nothing was lost."""
    writing = stop.saving()
    said, last = [], 0
    with contextlib.suppress(OSError, ValueError):
        last = max((r.step for r in read_metrics(plan.paths.metrics) if isinstance(r, StepRecord)), default=0)
    if writing is not None:
        step, _ = writing
        last = max(last, step)
        path = out / f"checkpoint-{step}"
        if not path.is_dir():
            said.append(f"checkpoint-{step} abandoned before its first file")
        elif checkpoint_problems(path):
            with contextlib.suppress(OSError):
                aside = set_aside(path, "abandoned")
                said.append(f"checkpoint-{step} abandoned half-written (set aside as {aside.name})")
        stop.abandoned()
    complete = [s for s, p in checkpoints(out) if not checkpoint_problems(p)]
    newest = complete[-1] if complete else 0
    if last <= newest:
        return None
    back = f"the newest complete checkpoint is checkpoint-{newest}" if newest else "no complete checkpoint"
    steps = f"step {last}" if last == newest + 1 else f"steps {newest + 1}–{last}"
    return "; ".join([*said, f"{back}: {steps} will be trained again"])


def _stopping(
    plan: Plan, backend: Backend, ctx: RunContext, stop: StopChannel, resume_from: str, stuck: Callable[[], str | None]
) -> Stopping:
    """How the first Ctrl-C or SIGTERM stops this attempt: a checkpoint request, within launch.stop_grace_s (unset:
    what the backend's platform leaves, e.g. Slurm's GraceTime, else the default), unless the step in flight cannot
    reach its end (``stuck``: the watchdog's evidence). The grace and its source are written to the run's control
    directory for ``status``."""
    grace, why = plan.recipe.launch.stop_grace_s, "launch.stop_grace_s"
    if grace is None:
        grace, why = (
            backend.stop_grace(ctx)
            or notice_grace(ctx.environ)
            or (DEFAULT_STOP_GRACE_S, "launch.stop_grace_s's default")
        )
    stop.set_grace(grace, why)
    m = re.search(r"checkpoint-(\d+)$", resume_from)
    resumed = int(m.group(1)) if m else 0
    started = time.time()

    def step_in_flight() -> int:
        if (done := stop.stopped_at()) is not None:
            return done  # the trainers were quicker than the launcher's look (a request they made themselves)
        # The metrics file, read now (the watchdog reads it once a second): its last step, if this attempt wrote it.
        with contextlib.suppress(OSError, ValueError):  # a damaged metrics file: the step is unknown, not fatal
            steps = [
                r for r in read_metrics(plan.paths.metrics) if isinstance(r, StepRecord) and (r.time or 0) >= started
            ]
            if steps:
                return steps[-1].step + 1
        return resumed + 1

    def newest() -> int:
        """The newest complete checkpoint's step: the one this attempt resumed from, or a save it finished since
        (a save record follows its step's record)."""
        saves, mine = [resumed], False
        with contextlib.suppress(OSError, ValueError):
            for r in read_metrics(plan.paths.metrics):
                mine = mine or (isinstance(r, StepRecord) and (r.time or 0) >= started)
                if mine and isinstance(r, SaveRecord):
                    saves.append(r.step)
        return max(saves)

    planned = plan.estimate.save_interval if plan.estimate is not None else None

    def saving() -> tuple[int, float | None] | None:
        """The checkpoint being written, and the seconds its save should still take (the last save measured, else
        the plan's; None: neither)."""
        if (now := stop.saving()) is None:
            return None
        step, began = now
        took: float | None = planned.save_s if planned is not None else None
        with contextlib.suppress(OSError, ValueError):
            took = next(
                (r.save_s for r in reversed(read_metrics(plan.paths.metrics)) if isinstance(r, SaveRecord)), took
            )
        return step, (took - (time.time() - began) if took is not None else None)

    return Stopping(
        grace_s=grace,
        grace_why=why,
        step_in_flight=step_in_flight,
        at_once=lambda signum: backend.stops_at_once(signum, ctx),
        stuck=stuck,
        newest=newest,
        saving=saving,
    )


def notice_grace(environ: Mapping[str, str]) -> tuple[float, str] | None:
    """The stop grace a platform's notice leaves (``STOP_NOTICE_ENV``, "SECONDS WHY", which a SkyPilot spot task sets),
    less 5 s to stop; None without one."""
    seconds, _, why = environ.get(STOP_NOTICE_ENV, "").partition(" ")
    try:
        notice = float(seconds)
    except ValueError:
        return None
    return max(1.0, notice - 5.0), f"{why or 'the platform'}'s notice {notice:.0f} s, less 5 s to stop"


def _record(plan: Plan, number: int, result: RunResult, adapter: Adapter | None = None) -> None:
    """One record per attempt (``grpo-launch status`` and the report show them); ``number``: the attempt's in the
    run directory, the one its trainers wrote into their records."""
    failure = result.failure
    attempt = Attempt(
        attempt=number,
        ended=time.time(),
        state=result.state,
        exit_code=result.exit_code,
        failure=failure.kind if failure else None,
        side=failure.side if failure else None,
        cause=result.cause,
        message=result.message,
        adaptations=tuple(adapter.decisions) if adapter is not None else (),
    )
    append(plan.paths.attempts, attempt)
