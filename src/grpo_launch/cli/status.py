"""``grpo-launch status [RUN_DIR]``: where a run stands: state, step, ETA (measured and planned), each attempt
(its steps, own step time, checkpoint and end: the RunView's courses), last metrics, peak memory, and where its logs
are. Reads the run directory once (:class:`grpo_launch.analysis.view.RunView`), and
asks the run's batch system about its job (``Backend.job_state``: a typed JobState, no batch system's keys)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from grpo_launch.analysis.step_means import Measured, Progress, measure, progress
from grpo_launch.analysis.timeline import (
    adaptation_rows,
    adaptations,
    async_row,
    attempt_rows,
    startup_row,
    startup_terms,
)
from grpo_launch.analysis.view import RunView
from grpo_launch.backends import known, load
from grpo_launch.cli.common import VERB_HELP
from grpo_launch.cli.tables import Section, print_sections
from grpo_launch.enums import JobStatus, RunState
from grpo_launch.errors import ConfigError
from grpo_launch.machines.gpus import GIB
from grpo_launch.planning import DEFAULT_RUN_ROOT
from grpo_launch.rundir import control, server_state
from grpo_launch.rundir.json_fields import RunFileError
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import JobState
from grpo_launch.rundir.shown_text import command_line, seconds, significant
from grpo_launch.spec import RunContext, frozen

# TRL's logged metrics worth a line, in this order, when present
SHOWN_ATTEMPTS = 8  # the last attempts status shows one by one (--json and the report have every one)
SHOWN = ("reward", "reward_std", "completions/mean_length", "kl", "entropy", "loss", "learning_rate")


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "status",
        help=VERB_HELP["status"],
        description="Show where a run stands from its run directory: state, step, ETA from the measured step time "
        "(and the plan's), each attempt (its steps, own step time, last checkpoint and how it ended), the last "
        "logged metrics, peak memory and the logs.",
    )
    p.add_argument("run_dir", nargs="?", help="the run directory (default: the newest under grpo_runs/)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.add_argument(
        "--watch",
        action="store_true",
        help="a live view redrawn from the run directory until the run ends (step, ETA, split, reward, restarts)",
    )
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="--watch: seconds between drawings")


def newest_run(workdir: str) -> Path:
    """The run directory under grpo_runs/ whose run (not plan: a plan writes plan.json alone) was active last."""
    stamps = {}
    for root in Path(workdir, DEFAULT_RUN_ROOT).glob("*/"):
        paths = RunPaths(root)
        files = [p for p in (paths.lock, paths.metrics, paths.attempts) if p.is_file()]
        if files:
            stamps[root] = max(p.stat().st_mtime for p in files)
    if not stamps:
        raise ConfigError(
            f"no run under {DEFAULT_RUN_ROOT}/ (a plan alone is not a run)",
            hint="Give one: grpo-launch status RUN_DIR.",
        )
    return max(stamps, key=lambda p: stamps[p])


@frozen
class Standing:
    """What ``status`` says of a run, from its :class:`RunView` (read once) and its batch job's state now."""

    view: RunView
    measured: Measured | None  # None: no optimizer step yet
    progress: Progress
    job: str | None
    job_state: JobState | None
    resume: str | None  # the command that resumes the run, when nothing runs it and it did not succeed
    resume_from: str | None  # where it would continue from


def _job_state(view: RunView) -> tuple[str | None, JobState | None]:
    """The batch job the run's lock names, and what its backend says of it now."""
    if view.job is None or not known(view.job.backend):
        return None, None
    return view.job.job_id, load(view.job.backend).job_state(view.job.job_id)


def _resume_hint(view: RunView, workdir: str) -> tuple[str, str]:
    """The command that continues the run, shell-quoted, and where it would continue from. Without a record of the
    run's command (a run of an earlier grpo-launch) the command is rebuilt from plan.json and says what it lacks."""
    # Here: only a stopped run's hint reads its checkpoints and command (zipfile, tempfile); the status of a running
    # run, asked again and again, loads neither.
    from grpo_launch.rundir.invocation import read_invocation
    from grpo_launch.rundir.same_run import resume_point

    plan = view.plan
    out, max_steps = (plan.output_dir, plan.trainer_values.get("max_steps")) if plan else (None, None)
    if out is None:
        where = "from the newest complete checkpoint, if any"
    else:
        where = resume_point(Path(workdir, out), max_steps if isinstance(max_steps, int) else None).describe()
    try:
        recorded = read_invocation(view.paths.invocation) is not None
    except RunFileError:
        recorded = True  # `resume` names the file and the fix
    if recorded:
        return command_line(["grpo-launch", "resume", view.root]), where
    command = command_line(["grpo-launch", (plan.recipe if plan else None) or "RECIPE", "--run-dir", view.root])
    return command, f"{where}; the run's command was not recorded: add its overrides and flags"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _before_first_step(holder: str | None) -> Progress:
    """Where a run stands before its first optimizer step (no step record yet)."""
    if holder is not None:
        why = "the launcher runs; no optimizer step yet (loading the model, starting vLLM, the first generation)"
        return Progress("starting", why, None, None, None, None)
    return Progress("starting", "no optimizer step recorded", None, None, None, None)


def assess(view: RunView, workdir: str) -> Standing:
    """Where the run stands: its measurements, its progress, and, when no launcher holds it, how its last attempt
    ended (never a guess from the step clock) and how to resume it."""
    holder, last = view.holder, view.last_attempt
    job, job_state = _job_state(view)
    try:
        m: Measured | None = measure(view)
    except ConfigError:
        if holder is None and last is None:
            raise
        m = None  # no optimizer step yet: the launcher is starting the run, or the run ended before its first step
    p = _before_first_step(holder) if m is None else progress(m, time.time(), view.stopped_at)
    resume = resume_from = None
    if holder is None and p.state in ("running", "silent", "starting"):
        if last is not None:
            why = f"{last.failure}: {last.why}" if last.failure else (last.why or f"exit code {last.exit_code}")
            p = replace(p, state=str(last.state), detail=why, eta_s=None)
        elif job is None:
            p = replace(
                p,
                state="ended",
                detail="no launcher holds the run and it recorded no end: the launcher "
                "was killed, or its host went down",
                eta_s=None,
            )
    if holder is None and p.state not in (str(RunState.SUCCEEDED), "finished") and not _queued(job_state):
        resume, resume_from = _resume_hint(view, workdir)  # after any stop, however it ended
    return Standing(view, m, p, job, job_state, resume, resume_from)


def _queued(state: JobState | None) -> bool:
    """The run's batch job will run it again by itself (requeued, or running): no resume to offer."""
    return state is not None and state.state in (JobStatus.PENDING, JobStatus.RUNNING)


def as_json(s: Standing) -> dict[str, Any]:
    view, m = s.view, s.measured
    data: dict[str, Any] = {
        "run_dir": str(view.root),
        "step": m.last_step if m else 0,
        "max_steps": m.max_steps if m else None,
    }
    data |= asdict(s.progress)
    courses = view.courses()
    attempts = [c.to_json() for c in courses]  # each attempt once: its steps, own step time, checkpoint and end
    if courses and courses[-1].end is None and view.holder:
        attempts[-1]["state"] = "running"
    data |= {
        "launcher": view.holder,
        "attempts": attempts,
        "job": s.job,
        "job_state": s.job_state.to_json() if s.job_state else None,
        "resume": s.resume,
        "resume_from": s.resume_from,
    }
    if m is not None:
        data |= {"step_s": m.step_s, "generation_s": m.generation_s, "training_s": m.training_s}
        data |= {"peak_memory_bytes": m.peak_memory_bytes, "memory_kind": m.memory_kind, "last_log": m.last_log}
    data |= {"adaptations": adaptations(view.attempts), "startup": startup_terms(view.records)}
    grace = control.stop_grace(view.root)
    data["stop_grace"] = {"seconds": grace[0], "source": grace[1]} if grace is not None else None
    data["faults"] = [f.to_json() for f in server_state.read_faults(view.root)]
    return data | {"logs": [str(x) for x in view.logs()]}


def _course_rows(s: Standing) -> list[tuple[str, str]]:
    """The launcher, the batch job, the attempts and what the run did besides stepping."""
    view, last = s.view, s.view.last_attempt
    rows = [("launcher", f"running ({view.holder})" if view.holder else "not running")]
    grace = control.stop_grace(view.root)
    if grace is not None:
        rows.append(
            (
                "stop grace",
                f"{grace[0]:.0f} s for a checkpoint on Ctrl-C or SIGTERM ({grace[1]}); a step "
                "that cannot end is not waited for",
            )
        )
    if s.resume:
        rows.append(("resume", s.resume))
        rows.append(("resumes", s.resume_from or ""))
    if s.job:
        state = s.job_state
        said = "unknown to its scheduler" if state is None else f"{state.said}, restarts {state.restarts}"
        rows.append(("batch job", f"{s.job}: {said}"))
    courses = view.courses()
    if courses:
        said = f"{len(courses)} attempt(s)"
        if last and last.failure:
            said += f"; last ended {last.state} ({last.failure}): {last.why}"
        rows.append(("attempts", said))
    rows += attempt_rows(courses, running=view.holder is not None, last=SHOWN_ATTEMPTS)
    rows += adaptation_rows(view.attempts)
    rows += fault_rows(server_state.read_faults(view.root))
    plan = view.plan
    first = startup_row(view.records, plan.startup_s if plan else None, plan.startup_phases if plan else ())
    rows += [row for row in (first, async_row(view.records, plan.queue_maxsize if plan else None)) if row]
    return rows


def fault_rows(faults: list[server_state.FaultRecord]) -> list[tuple[str, str]]:
    """One row per fault the run survived or ended on, and what it cost."""
    rows = []
    for f in faults:
        at = f" at step {f.step}" if f.step is not None else ""
        if f.restarted == "server" and f.down_s is not None:
            said = f"vLLM server replaced{at} ({f.down_s:.0f} s, {f.steps_lost} steps lost): {f.cause}"
        else:
            said = f"vLLM server lost{at}, not replaced: the attempt ended ({f.cause})"
        rows.append(("fault", said))
    return rows


def text_rows(s: Standing) -> list[tuple[str, str]]:
    m, p = s.measured, s.progress
    rows = [("state", f"{p.state}: {p.detail}")]
    if m is not None:
        rows.append(("step", f"{m.last_step}/{m.max_steps or '?'}"))
        rows.append(
            (
                "step time",
                f"{seconds(m.step_s)} (generation {seconds(m.generation_s)}, training {seconds(m.training_s)})",
            )
        )
    if p.eta_s is not None and p.state != "finished":  # a finished run has no time left to show
        rows.append(("ETA", f"{_hours(p.eta_s)} at the measured step time; planned {_hours(p.planned_eta_s)}"))
    rows += _course_rows(s)
    rows += [(k, significant(m.last_log[k])) for k in SHOWN if m is not None and k in m.last_log]
    if m is not None and m.peak_memory_bytes:
        rows.append(("peak memory", f"{m.peak_memory_bytes / GIB:.1f} GiB ({m.memory_kind}, largest rank)"))
    logs = s.view.logs()
    rows.append(("logs", ", ".join(str(x) for x in logs) or f"{s.view.paths.logs} (none yet)"))
    return rows


WATCH_BAR = 30  # characters of the step bar


def _bar(step: int, total: int | None) -> str:
    if not total:
        return ""
    done = min(WATCH_BAR, round(WATCH_BAR * step / total))
    return "█" * done + "░" * (WATCH_BAR - done) + f" {100 * step / total:.0f}%"


def watch_rows(view: RunView, workdir: str) -> list[tuple[str, str]]:
    """The live view's rows: what matters while a run goes, in the order the eye wants it."""
    s = assess(view, workdir)
    m, p = s.measured, s.progress
    rows = [("state", f"{p.state}: {p.detail}")]
    if m is not None:
        rows.append(("step", f"{m.last_step}/{m.max_steps or '?'}  {_bar(m.last_step, m.max_steps)}"))
        gen_share = 100 * m.generation_s / m.step_s if m.step_s else 0.0
        rows.append(
            (
                "step time",
                f"{seconds(m.step_s)}: generation {seconds(m.generation_s)} ({gen_share:.0f}%), "
                f"training {seconds(m.training_s)} ({100 - gen_share:.0f}%)",
            )
        )
        pred = m.prediction
        if pred is not None:
            rows.append(
                (
                    "planned split",
                    f"generation {pred.trainer_generation_s:.2f} s, training {pred.training_s:.2f} s per step",
                )
            )
    if (p.eta_s is not None or p.planned_eta_s is not None) and p.state != "finished":
        eta = _hours(p.eta_s) if p.eta_s is not None and p.eta_s >= 60 else f"{p.eta_s or 0:.0f} s"
        rows.append(("ETA", f"{eta} at the measured step time; planned {_hours(p.planned_eta_s)}"))
    if m is not None and "reward" in m.last_log:
        std = m.last_log.get("reward_std")
        said = significant(m.last_log["reward"]) + (f" ± {significant(std)}" if std is not None else "")
        rows.append(("reward", said))
    restarts = [a for a in view.attempts if a.failure]
    rows.append(
        (
            "attempts",
            f"{len(view.attempts) + (1 if view.holder else 0)}, restarts after a failure: "
            f"{len(restarts) if view.holder or len(view.attempts) > 1 else 0}",
        )
    )
    for a in view.attempts[-5:]:
        why = f"{a.failure}: {a.why}" if a.failure else (a.why or f"exit code {a.exit_code}")
        rows.append((f"attempt {a.attempt}", f"{a.state} ({why})"[:200]))
    return rows


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    run_dir = Path(args.run_dir) if args.run_dir else newest_run(ctx.workdir)
    if getattr(args, "watch", False):  # a Namespace made by hand (tests, other verbs) has no --watch
        from grpo_launch.cli.watch import watch

        if not args.interval > 0:
            raise ConfigError(f"--interval must be above 0 seconds, got {args.interval}", hint="e.g. --interval 2")
        return watch(run_dir, args.interval, lambda view: watch_rows(view, ctx.workdir))
    standing = assess(RunView.load(run_dir), ctx.workdir)
    if args.json:
        ctx.emit(json.dumps(as_json(standing), indent=2))
        return 0
    print_sections([Section(f"grpo-launch status: {run_dir}", text_rows(standing))])
    return 0
