"""What a run measured, from its :class:`.view.RunView`: the means over its optimizer steps against the prediction
its plan.json made (:class:`Measured`), and where the run stands (:func:`progress`). Standard library only; raises
ConfigError naming the missing file."""

from __future__ import annotations

import math
from dataclasses import field
from pathlib import Path

from grpo_launch.analysis.view import RunView
from grpo_launch.errors import ConfigError
from grpo_launch.rundir.plan_record import PlanRecord, Prediction
from grpo_launch.rundir.records import LogRecord
from grpo_launch.spec import frozen


@frozen
class Measured:
    """Means over a run's optimizer steps, each step once (a resumed attempt's wins); each attempt's first step is
    left out when it has more (it compiles, warms up and, after a resume, loads the checkpoint)."""

    run_dir: str
    steps: int  # step records read
    last_step: int
    max_steps: int | None
    step_s: float
    generation_s: float  # generation, scoring, the old log-probs and the weight sync, as the trainer times them
    training_s: float
    last_time: float | None  # wall-clock time of the last step
    peak_memory_bytes: int | None  # the largest peak of any rank
    memory_kind: str | None  # cuda_max_allocated or rss_max
    mean_completion_len: float | None  # TRL's completions/mean_length, averaged over its logs
    last_log: dict[str, float] = field(default_factory=dict)  # the latest value of each logged metric
    prediction: Prediction | None = None  # what plan.json predicted
    plan: PlanRecord | None = None  # the rest of plan.json, as its readers use it


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def measure(view: RunView, after_step: int = 0) -> Measured:
    """``after_step``: only the steps after it (one layout's steps in a run that changed layout, launch.adapt).
    Raises ConfigError when the run has no metrics.jsonl, or no step in it."""
    metrics = view.paths.metrics
    if not view.metrics_found:
        raise ConfigError(
            f"cannot read {metrics}: No such file or directory",
            hint="Give the run directory of a run that trained at least one step (it holds metrics.jsonl).",
        )
    # The run's curve: each step once (a resumed attempt's record of a repeated step wins).
    steps = view.steps(after_step)
    logs = [r.log for r in view.curve() if isinstance(r, LogRecord) and r.step > after_step]
    if not steps:
        raise ConfigError(f"{metrics} has no step lines", hint="Let the run train at least one optimizer step.")
    use = view.steps(after_step, warm=True) or steps  # each attempt's first step warms up: left out when it has more
    peaks = [p for s in steps for p in s.peak_memory_bytes]
    lengths = [g["completions/mean_length"] for g in logs if "completions/mean_length" in g]
    return Measured(
        run_dir=str(view.root),
        steps=len(steps),
        last_step=steps[-1].step or len(steps),
        max_steps=steps[-1].max_steps,
        step_s=_mean([s.step_s for s in use]),
        generation_s=_mean([s.generation_s or 0.0 for s in use]),
        training_s=_mean([s.training_s or 0.0 for s in use]),
        last_time=steps[-1].time,
        peak_memory_bytes=max(peaks) if peaks else None,
        memory_kind=steps[-1].memory_kind,
        mean_completion_len=_mean(lengths) if lengths else None,
        last_log={k: v for g in logs for k, v in g.items()},  # each key's latest value
        prediction=view.plan.prediction if view.plan else None,
        plan=view.plan,
    )


def read_run(run_dir: str | Path, after_step: int = 0) -> Measured:
    """:func:`measure` of the run directory as it is now, for the launcher while the trainers write (launch.adapt):
    a metrics line that does not read is left out rather than stopping the run."""
    return measure(RunView.load(run_dir, strict=False), after_step)


@frozen
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
    predicted = m.prediction.step_s if m.prediction else None
    planned = None
    if remaining is not None and predicted is not None and math.isfinite(predicted):
        planned = remaining * predicted
    eta = remaining * m.step_s if remaining is not None else None
    if remaining == 0:
        return Progress("finished", f"step {m.last_step}/{m.max_steps}", 0, 0.0, planned, since)
    if stopped_at is not None and stopped_at >= m.last_step:
        return Progress("stopped", f"checkpointed and stopped at step {stopped_at}", remaining, eta, planned, since)
    quiet = since is not None and since > 3 * m.step_s + 60
    state = "silent" if quiet else "running"
    detail = f"no step for {since:.0f} s (stopped, or hung)" if quiet and since is not None else "stepping"
    return Progress(state, detail, remaining, eta, planned, since)
