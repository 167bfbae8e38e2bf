"""``grpo-launch status [RUN_DIR]``: where a run stands: state, step, ETA (measured and planned), last metrics,
peak memory, and where its logs are. Reads the run directory only."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from grpo_launch.backends import RunContext
from grpo_launch.errors import ConfigError
from grpo_launch.rundir import last_holder, lock_holder

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
    runs = [p.parent for p in Path(workdir, "grpo_runs").glob("*/plan.json")]
    if not runs:
        raise ConfigError("no run directory under grpo_runs/", hint="Give one: grpo-launch status RUN_DIR.")
    return max(runs, key=lambda p: p.stat().st_mtime)


def _attempts(run_dir: Path) -> list[dict]:
    """The run's attempts (RUN_DIR/control/attempts.jsonl: one line per supervised attempt, restarts included)."""
    from grpo_launch.control import ATTEMPTS_FILE, control_dir, read_jsonl

    try:
        return read_jsonl(control_dir(run_dir) / ATTEMPTS_FILE)
    except OSError:
        return []


def _slurm_state(job: str) -> dict[str, str] | None:
    """JobState, Restarts, … of a Slurm job (``scontrol show job -o``), or None (finished long ago, no Slurm)."""
    from grpo_launch.backends.slurm.env import run_scontrol

    text = run_scontrol(["show", "job", "-o", job])
    if not text:
        return None
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    return {k: fields[k] for k in ("JobState", "Restarts", "RunTime", "TimeLimit", "NodeList") if k in fields}


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def command(args: argparse.Namespace, ctx: RunContext) -> int:
    from grpo_launch.control import STOPPED_MARKER, control_dir
    from grpo_launch.measured import progress, read_run

    run_dir = Path(args.run_dir) if args.run_dir else newest_run(ctx.workdir)
    m = read_run(run_dir)
    marker = control_dir(run_dir) / STOPPED_MARKER
    try:
        stopped_at: int | None = int(marker.read_text().strip())
    except (OSError, ValueError):
        stopped_at = None
    p = progress(m, time.time(), stopped_at)
    logs = sorted(str(x) for x in (run_dir / "logs").glob("*.log"))
    attempts = _attempts(run_dir)
    holder = lock_holder(run_dir)
    job = last_holder(run_dir).get("slurm_job")
    slurm = _slurm_state(str(job)) if job else None
    last = attempts[-1] if attempts else None
    if holder is None and p.state in ("running", "silent") and last and last.get("state") == "failed":
        p = replace(p, state="failed", detail=f"{last.get('failure')}: {last.get('cause') or last.get('message')}")
    if args.json:
        data = {"run_dir": str(run_dir), "step": m.last_step, "max_steps": m.max_steps, **asdict(p)}
        data |= {"launcher": holder, "attempts": attempts, "slurm_job": job, "slurm": slurm}
        data |= {"step_s": m.step_s, "generation_s": m.generation_s, "training_s": m.training_s}
        data |= {"peak_memory_bytes": m.peak_memory_bytes, "memory_kind": m.memory_kind, "last_log": m.last_log}
        ctx.emit(json.dumps(data | {"logs": logs}, indent=2))
        return 0
    from grpo_launch.cli.tables import Section, print_sections

    rows = [
        ("state", f"{p.state}: {p.detail}"),
        ("step", f"{m.last_step}/{m.max_steps or '?'}"),
        ("step time", f"{m.step_s:.1f} s (generation {m.generation_s:.1f} s, training {m.training_s:.1f} s)"),
        ("ETA", f"{_hours(p.eta_s)} at the measured step time; planned {_hours(p.planned_eta_s)}"),
    ]
    rows.append(("launcher", f"running ({holder})" if holder else "not running"))
    if job:
        said = "unknown to scontrol" if slurm is None else f"{slurm.get('JobState')}, restarts {slurm.get('Restarts')}"
        rows.append(("slurm job", f"{job}: {said}"))
    if attempts:
        restarts = len(attempts) - 1
        said = f"{len(attempts)} attempt(s), {restarts} restart(s)"
        if last and last.get("failure"):
            said += (
                f"; last ended {last.get('state')} ({last.get('failure')}): {last.get('cause') or last.get('message')}"
            )
        rows.append(("attempts", said))
    rows += [(k, f"{m.last_log[k]:.4g}") for k in SHOWN if k in m.last_log]
    if m.peak_memory_bytes:
        rows.append(("peak memory", f"{m.peak_memory_bytes / 2**30:.1f} GiB ({m.memory_kind}, largest rank)"))
    rows.append(("logs", ", ".join(logs) or f"{run_dir}/logs (none yet)"))
    print_sections([Section(f"grpo-launch status: {run_dir}", rows)])
    return 0
