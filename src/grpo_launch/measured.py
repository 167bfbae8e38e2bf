"""Read what a run measured: RUN_DIR/metrics.jsonl (the trainers' per-step lines and TRL's logged metrics) and
the estimate its plan.json predicted. Standard library only; raises ConfigError naming the missing file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.control import METRICS_FILE, read_jsonl
from grpo_launch.errors import ConfigError

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class Measured:
    """Means over a run's optimizer steps (the first is left out when there are more: it compiles and warms up)."""

    run_dir: str
    steps: int  # step lines read
    last_step: int
    max_steps: int | None
    step_s: float
    generation_s: float  # generation, scoring, the old log-probs and the weight sync, as the trainer times them
    training_s: float
    last_time: float | None  # wall-clock time of the last step line
    peak_memory_bytes: int | None  # the largest peak of any rank
    memory_kind: str | None  # cuda_max_allocated or rss_max
    mean_completion_len: float | None  # TRL's completions/mean_length, averaged over its logs
    last_log: dict[str, float] = field(default_factory=dict)  # the latest value of each logged metric
    estimate: dict[str, Any] | None = None  # plan.json's estimate
    plan: dict[str, Any] | None = None  # the rest of plan.json


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def metric_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """RUN_DIR/metrics.jsonl as rows (a line cut short by a crash is skipped)."""
    metrics = Path(run_dir) / METRICS_FILE
    try:
        return read_jsonl(metrics)
    except OSError as exc:
        raise ConfigError(
            f"cannot read {metrics}: {exc.strerror or exc}",
            hint="Give the run directory of a run that trained at least one step (it holds metrics.jsonl).",
        ) from None


def read_run(run_dir: str | Path) -> Measured:
    root = Path(run_dir)
    metrics = root / METRICS_FILE
    steps: list[dict[str, Any]] = []
    logs: list[dict[str, Any]] = []
    for row in metric_rows(root):
        if isinstance(row.get("log"), dict):
            logs.append(row["log"])
        elif _finite(row.get("step_s")):
            steps.append(row)
    if not steps:
        raise ConfigError(f"{metrics} has no step lines", hint="Let the run train at least one optimizer step.")
    use = steps[1:] if len(steps) > 1 else steps
    peaks = [int(p) for s in steps for p in s.get("peak_memory_bytes") or [] if _finite(p)]
    lengths = [float(g["completions/mean_length"]) for g in logs if _finite(g.get("completions/mean_length"))]
    plan = _read_plan(root / PLAN_FILE)
    return Measured(
        run_dir=str(root),
        steps=len(steps),
        last_step=int(steps[-1].get("step") or len(steps)),
        max_steps=steps[-1].get("max_steps") if _finite(steps[-1].get("max_steps")) else None,
        step_s=_mean([float(s["step_s"]) for s in use]),
        generation_s=_mean([float(s.get("generation_s") or 0.0) for s in use]),
        training_s=_mean([float(s.get("training_s") or 0.0) for s in use]),
        last_time=steps[-1].get("time") if _finite(steps[-1].get("time")) else None,
        peak_memory_bytes=max(peaks) if peaks else None,
        memory_kind=steps[-1].get("memory_kind"),
        mean_completion_len=_mean(lengths) if lengths else None,
        last_log={k: float(v) for g in logs for k, v in g.items() if _finite(v)},  # each key's latest value
        estimate=(plan or {}).get("estimate"),
        plan=plan,
    )


def _read_plan(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Progress:
    """Where a run stands, from its measurements: state, ETA from the measured step time and from the plan's."""

    state: str  # finished | stopped | running | silent
    detail: str
    remaining_steps: int | None
    eta_s: float | None  # at the measured mean step time
    planned_eta_s: float | None  # at the plan's predicted step time
    since_last_step_s: float | None


def progress(m: Measured, now: float, stopped_at: int | None = None) -> Progress:
    """``stopped_at``: the step the control dir says the run stopped at to checkpoint (SIGUSR2, preemption)."""
    remaining = max(0, int(m.max_steps) - m.last_step) if m.max_steps else None
    since = now - m.last_time if m.last_time is not None else None
    predicted = ((m.estimate or {}).get("time_s") or {}).get("step")
    planned = None
    if remaining is not None and isinstance(predicted, (int, float)) and math.isfinite(predicted):
        planned = remaining * float(predicted)
    eta = remaining * m.step_s if remaining is not None else None
    if remaining == 0:
        return Progress("finished", f"step {m.last_step}/{m.max_steps}", 0, 0.0, planned, since)
    if stopped_at is not None and stopped_at >= m.last_step:
        return Progress("stopped", f"checkpointed and stopped at step {stopped_at}", remaining, eta, planned, since)
    quiet = since is not None and since > 3 * m.step_s + 60
    state = "silent" if quiet else "running"
    detail = f"no step for {since:.0f} s (stopped, or hung)" if quiet and since is not None else "stepping"
    return Progress(state, detail, remaining, eta, planned, since)
