"""``grpo-launch status [RUN_DIR]``: where a run stands: state, step, ETA (measured and planned), last metrics,
peak memory, and where its logs are. Reads the run directory only."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from grpo_launch.enums import RunState
from grpo_launch.errors import ConfigError
from grpo_launch.machines.gpus import GIB
from grpo_launch.rundir.files import last_holder, lock_holder
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.measured import Progress
from grpo_launch.rundir.records import Attempt
from grpo_launch.spec import RunContext

# TRL's logged metrics worth a line, in this order, when present
SHOWN = ("reward", "reward_std", "completions/mean_length", "kl", "entropy", "loss", "learning_rate")


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = sub.add_parser(
        "status",
        help="show a run's state, step, ETA and last metrics",
        description="Show where a run stands from its run directory: state, step, ETA from the measured step time "
        "(and the plan's), the last logged metrics, peak memory and the logs.",
    )
    p.add_argument("run_dir", nargs="?", help="the run directory (default: the newest under grpo_runs/)")
    p.add_argument("--json", action="store_true", help="print as JSON")


def newest_run(workdir: str) -> Path:
    """The run directory under grpo_runs/ whose run (not plan: a plan writes plan.json alone) was active last."""
    from grpo_launch.planning import DEFAULT_RUN_ROOT

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


def _job_state(info: dict) -> tuple[str | None, dict[str, str] | None]:
    """The batch job the run's lock names, and what its backend says of it now."""
    from grpo_launch.backends import REGISTRY, load

    job = info.get("job_id") or info.get("slurm_job")  # lock files of earlier versions name only a Slurm job
    name = info.get("backend") or ("slurm" if info.get("slurm_job") else None)
    if not job or name not in REGISTRY:
        return None, None
    return str(job), load(name).job_state(str(job))


def _resume_hint(run_dir: Path, workdir: str) -> str:
    """The command that resumes the run, and the checkpoint it would resume from when the output directory is
    found."""
    from grpo_launch.rundir.checkpoints import checkpoints

    try:
        plan = json.loads(RunPaths(run_dir).plan_json.read_text())
    except (OSError, ValueError):
        plan = {}
    recipe = plan.get("recipe") or "RECIPE"
    out = (plan.get("trainer_values") or {}).get("output_dir")
    found = checkpoints(Path(workdir, out)) if isinstance(out, str) else []
    start = f"from checkpoint-{found[-1][0]}" if found else "from the newest complete checkpoint, if any"
    return f"grpo-launch {recipe} --run-dir {run_dir} (resumes {start})"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _before_first_step(holder: str | None, last: Attempt | None) -> Progress:
    """Where a run stands before its first optimizer step (no step record yet)."""
    if holder is not None:
        why = "the launcher runs; no optimizer step yet (loading the model, starting vLLM, the first generation)"
        return Progress("starting", why, None, None, None, None)
    return Progress("starting", "no optimizer step recorded", None, None, None, None)


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    from grpo_launch.rundir.control import stopped_at
    from grpo_launch.rundir.measured import metric_records, progress, read_plan_json, read_run
    from grpo_launch.rundir.records import read_attempts
    from grpo_launch.rundir.timeline import adaptation_rows, adaptations, async_row, startup_row, startup_terms

    run_dir = Path(args.run_dir) if args.run_dir else newest_run(ctx.workdir)
    paths = RunPaths(run_dir)
    logs = sorted(str(x) for x in paths.logs.glob("*.log"))
    attempts = read_attempts(paths.attempts)
    holder = lock_holder(run_dir)
    job, job_state = _job_state(last_holder(run_dir))
    last = attempts[-1] if attempts else None
    try:
        m = read_run(run_dir)
    except ConfigError:
        if holder is None and last is None:
            raise
        m = None  # no optimizer step yet: the launcher is starting the run, or the run ended before its first step
    p = _before_first_step(holder, last) if m is None else progress(m, time.time(), stopped_at(run_dir))
    try:
        records = metric_records(run_dir)
    except ConfigError:
        records = []  # nothing measured yet
    resume = None
    if holder is None and p.state in ("running", "silent", "starting"):
        # No launcher holds the run: how its last attempt ended, never a guess from the step clock.
        if last is not None:
            why = f"{last.failure}: {last.why}" if last.failure else (last.why or f"exit code {last.exit_code}")
            p = replace(p, state=str(last.state), detail=why, eta_s=None)
        elif job is None:
            p = replace(p, state="ended", detail="no launcher holds the run and it recorded no end: the launcher "
                        "was killed, or its host went down", eta_s=None)  # fmt: skip
        resume = _resume_hint(run_dir, ctx.workdir) if p.state != str(RunState.SUCCEEDED) else None
    if args.json:
        data = {"run_dir": str(run_dir), "step": m.last_step if m else 0, "max_steps": m.max_steps if m else None}
        data |= asdict(p)
        data |= {"launcher": holder, "attempts": [a.to_json() for a in attempts], "job": job, "job_state": job_state}
        data |= {"resume": resume}
        if m is not None:
            data |= {"step_s": m.step_s, "generation_s": m.generation_s, "training_s": m.training_s}
            data |= {"peak_memory_bytes": m.peak_memory_bytes, "memory_kind": m.memory_kind, "last_log": m.last_log}
        data |= {"adaptations": adaptations(attempts), "startup": startup_terms(records)}
        ctx.emit(json.dumps(data | {"logs": logs}, indent=2))
        return 0
    from grpo_launch.cli.tables import Section, print_sections

    rows = [("state", f"{p.state}: {p.detail}")]
    if m is not None:
        rows.append(("step", f"{m.last_step}/{m.max_steps or '?'}"))
        rows.append(
            ("step time", f"{m.step_s:.1f} s (generation {m.generation_s:.1f} s, training {m.training_s:.1f} s)")
        )
    if p.eta_s is not None:
        rows.append(("ETA", f"{_hours(p.eta_s)} at the measured step time; planned {_hours(p.planned_eta_s)}"))
    rows.append(("launcher", f"running ({holder})" if holder else "not running"))
    if resume:
        rows.append(("resume", resume))
    if job:
        said = (
            "unknown to its scheduler"
            if job_state is None
            else (f"{job_state.get('JobState')}, restarts {job_state.get('Restarts')}")
        )
        rows.append(("batch job", f"{job}: {said}"))
    if attempts:
        said = f"{len(attempts)} attempt(s), {len(attempts) - 1} restart(s)"
        if last and last.failure:
            said += f"; last ended {last.state} ({last.failure}): {last.why}"
        rows.append(("attempts", said))
    rows += adaptation_rows(attempts)
    plan_json = read_plan_json(run_dir)
    forecast = (plan_json.get("estimate") or {}).get("startup_s")
    first = startup_row(records, forecast if isinstance(forecast, (int, float)) else None)
    rows += [row for row in (first, async_row(records, plan_json)) if row]
    rows += [(k, f"{m.last_log[k]:.4g}") for k in SHOWN if m is not None and k in m.last_log]
    if m is not None and m.peak_memory_bytes:
        rows.append(("peak memory", f"{m.peak_memory_bytes / GIB:.1f} GiB ({m.memory_kind}, largest rank)"))
    rows.append(("logs", ", ".join(logs) or f"{paths.logs} (none yet)"))
    print_sections([Section(f"grpo-launch status: {run_dir}", rows)])
    return 0
