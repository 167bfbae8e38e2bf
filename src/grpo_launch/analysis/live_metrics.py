"""The run's live metrics, as Prometheus names them: the one list (:data:`METRICS`) that the launcher's endpoint
serves (execute/live.py), the shipped scrape config and Grafana dashboard are generated from
(render/monitoring.py), and ``status --watch`` reads. Standard library only.

The run directory is the source of truth: :func:`samples` reads a :class:`~grpo_launch.analysis.view.RunView`
(metrics.jsonl, the attempts, plan.json) and adds nothing the directory lacks. What the trainers measure is what is
served: the step's wall time and its split as the trainer times it (``generation`` holds generating, scoring, the old
log-probs and, in server mode, the weight sync; ``training`` the rest), the plan's predicted split in four terms
beside it, TRL's logged metrics (reward, each reward function, lengths, clipping, KL, entropy; AsyncGRPOTrainer's
queue, staleness, dropped samples and weight sync), every rank's peak memory, the attempts' ends and launch.adapt's
decisions. Names follow Prometheus' conventions: the ``grpo_launch_`` prefix, base units in the name (``_seconds``,
``_bytes``, ``_tokens``), ``_total`` for counters, a label for what varies (rank, phase, reward function).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from grpo_launch.analysis.step_means import measure, progress
from grpo_launch.analysis.view import RunView
from grpo_launch.rundir.records import LogRecord, StepRecord
from grpo_launch.spec import frozen

PREFIX = "grpo_launch_"


@frozen
class Metric:
    """One served metric: its full name, Prometheus type (gauge or counter), help text, label names, and the
    dashboard row it is drawn in (``panel``: its title; metrics of one title share a panel)."""

    name: str
    kind: str  # gauge | counter
    help: str
    labels: tuple[str, ...] = ()
    panel: str = ""
    asynchronous: bool = False  # only an AsyncGRPOTrainer run has it


def _m(name: str, kind: str, help_: str, labels: tuple[str, ...] = (), panel: str = "", asyn: bool = False) -> Metric:
    return Metric(PREFIX + name, kind, help_, labels, panel or name, asyn)


# fmt: off
METRICS: tuple[Metric, ...] = (
    _m("step", "gauge", "The last optimizer step the trainers finished.", panel="Step"),
    _m("max_steps", "gauge", "The run's max_steps, as the trainers report it.", panel="Step"),
    _m("running", "gauge", "1 while a launcher holds the run's lock, else 0.", panel="Step"),
    _m("step_seconds", "gauge", "The last step's wall time, as rank 0 timed it.", panel="Step time"),
    _m("step_phase_seconds", "gauge", "The last step's split as the trainer times it: generation (generating, "
       "scoring, the old log-probs, the weight sync in server mode) and training (the rest).", ("phase",),
       panel="Step split"),
    _m("predicted_step_phase_seconds", "gauge", "The plan's predicted step time by term: generation, "
       "old_logprobs, training, sync.", ("phase",), panel="Step split"),
    _m("eta_seconds", "gauge", "Time to max_steps at the measured mean step time.", panel="ETA"),
    _m("planned_eta_seconds", "gauge", "Time to max_steps at the plan's predicted step time.", panel="ETA"),
    _m("reward", "gauge", "TRL's logged mean reward (reward), at the last logging step.", panel="Reward"),
    _m("reward_std", "gauge", "TRL's logged reward standard deviation (reward_std).", panel="Reward"),
    _m("reward_function", "gauge", "Each reward function's logged mean (rewards/NAME/mean).", ("function",),
       panel="Reward functions"),
    _m("completion_length_tokens", "gauge", "TRL's logged completion length (completions/mean_length, "
       "min_length, max_length).", ("stat",), panel="Completion length"),
    _m("clip_ratio", "gauge", "TRL's logged clipping ratios (clip_ratio/*; completions/clipped_ratio as "
       "region=truncated_completions).", ("region",), panel="Clipping"),
    _m("kl", "gauge", "TRL's logged KL divergence to the reference (when beta > 0).", panel="KL and entropy"),
    _m("entropy", "gauge", "TRL's logged mean token entropy.", panel="KL and entropy"),
    _m("tokens_per_second", "gauge", "Prompt and completion tokens per second over the last step.",
       panel="Tokens per second"),
    _m("tokens_total", "counter", "Prompt and completion tokens the trainers have seen (TRL's "
       "num_input_tokens_seen).", panel="Tokens per second"),
    _m("peak_memory_bytes", "gauge", "Each rank's peak memory at the last step (CUDA's max allocated on a GPU, "
       "the peak resident set on CPU).", ("rank", "kind"), panel="Peak memory per rank"),
    _m("gpu_utilization_percent", "gauge", "Each rank's GPU busy percent (NVML) at the last step.", ("rank",),
       panel="GPU utilization"),
    _m("attempts_total", "counter", "Attempts of the run that have ended, by their state and failure kind.",
       ("state", "failure"), panel="Restarts"),
    _m("restarts_total", "counter", "Restarts after a failed attempt, by the failure's kind.", ("failure",),
       panel="Restarts"),
    _m("adapt_decisions_total", "counter", "launch.adapt's decisions, by action.", ("action",),
       panel="Adapt decisions"),
    _m("rollout_queue_size", "gauge", "AsyncGRPO: samples waiting in the rollout queue "
       "(sample/rollout_queue_size).", panel="Async queue", asyn=True),
    _m("staleness_steps", "gauge", "AsyncGRPO: weight versions the trained samples are behind "
       "(sample/staleness_mean, _max).", ("stat",), panel="Async staleness", asyn=True),
    _m("dropped_stale_samples", "gauge", "AsyncGRPO: samples dropped as staler than max_staleness at the last "
       "logging step (sample/dropped_stale_total, which TRL logs per step).", panel="Async dropped samples",
       asyn=True),
    _m("rollout_wait_seconds", "gauge", "AsyncGRPO: the trainer blocked on an empty queue in the last step "
       "(perf/rollout_wait_s).", panel="Async waits", asyn=True),
    _m("backpressure_seconds", "gauge", "AsyncGRPO: the scorer blocked on a full queue (rollout/backpressure_s).",
       panel="Async waits", asyn=True),
    _m("weight_sync_seconds", "gauge", "AsyncGRPO: the last weight sync (perf/weight_sync_s).",
       panel="Async waits", asyn=True),
)
# fmt: on
BY_NAME = {m.name: m for m in METRICS}

# TRL's logged key -> (metric, labels)
_LOGGED: dict[str, tuple[str, dict[str, str]]] = {
    "reward": ("reward", {}),
    "reward_std": ("reward_std", {}),
    "completions/mean_length": ("completion_length_tokens", {"stat": "mean"}),
    "completions/min_length": ("completion_length_tokens", {"stat": "min"}),
    "completions/max_length": ("completion_length_tokens", {"stat": "max"}),
    "completions/clipped_ratio": ("clip_ratio", {"region": "truncated_completions"}),
    "kl": ("kl", {}),
    "entropy": ("entropy", {}),
    "sample/rollout_queue_size": ("rollout_queue_size", {}),
    "sample/staleness_mean": ("staleness_steps", {"stat": "mean"}),
    "sample/staleness_max": ("staleness_steps", {"stat": "max"}),
    "sample/dropped_stale_total": ("dropped_stale_samples", {}),
    "perf/rollout_wait_s": ("rollout_wait_seconds", {}),
    "rollout/backpressure_s": ("backpressure_seconds", {}),
    "perf/weight_sync_s": ("weight_sync_seconds", {}),
}

Sample = tuple[str, dict[str, str], float]  # (metric name, labels, value)


def samples(view: RunView, now: float | None = None) -> list[Sample]:
    """Every sample the run directory holds now, each named by a metric of :data:`METRICS`."""
    return [s for s in _samples(view, time.time() if now is None else now) if math.isfinite(s[2])]


def _samples(view: RunView, now: float) -> Iterator[Sample]:
    yield PREFIX + "running", {}, 1.0 if view.holder is not None else 0.0
    steps = view.steps()
    if steps:
        yield from _step_samples(steps, view, now)
    latest: dict[str, float] = {}
    for record in view.curve():
        if isinstance(record, LogRecord):
            latest.update(record.log)
    for key, value in latest.items():
        if key in _LOGGED:
            name, labels = _LOGGED[key]
            yield PREFIX + name, labels, value
        elif key.startswith("rewards/") and key.endswith("/mean"):
            yield PREFIX + "reward_function", {"function": key[len("rewards/") : -len("/mean")]}, value
        elif key.startswith("clip_ratio/"):
            yield PREFIX + "clip_ratio", {"region": key[len("clip_ratio/") :]}, value
    yield from _attempt_samples(view)
    prediction = view.plan.prediction if view.plan else None
    if prediction is not None:
        for phase in ("generation", "old_logprobs", "training", "sync"):
            yield PREFIX + "predicted_step_phase_seconds", {"phase": phase}, getattr(prediction, f"{phase}_s")


def _step_samples(steps: list[StepRecord], view: RunView, now: float) -> Iterator[Sample]:
    last = steps[-1]
    yield PREFIX + "step", {}, float(last.step)
    if last.max_steps is not None:
        yield PREFIX + "max_steps", {}, float(last.max_steps)
    yield PREFIX + "step_seconds", {}, last.step_s
    for phase in ("generation", "training"):
        value = getattr(last, f"{phase}_s")
        if value is not None:
            yield PREFIX + "step_phase_seconds", {"phase": phase}, value
    if last.num_tokens is not None:
        yield PREFIX + "tokens_total", {}, float(last.num_tokens)
        before = steps[-2] if len(steps) > 1 else None
        if before is not None and before.num_tokens is not None and last.step_s > 0:
            yield PREFIX + "tokens_per_second", {}, (last.num_tokens - before.num_tokens) / last.step_s
    for rank, peak in enumerate(last.peak_memory_bytes):
        yield PREFIX + "peak_memory_bytes", {"rank": str(rank), "kind": last.memory_kind or ""}, float(peak)
    for rank, busy in enumerate(last.gpu_utilization):
        if busy is not None:
            yield PREFIX + "gpu_utilization_percent", {"rank": str(rank)}, float(busy)
    ahead = progress(measure(view), now, view.stopped_at)
    if ahead.eta_s is not None:
        yield PREFIX + "eta_seconds", {}, ahead.eta_s
    if ahead.planned_eta_s is not None:
        yield PREFIX + "planned_eta_seconds", {}, ahead.planned_eta_s


def _attempt_samples(view: RunView) -> Iterator[Sample]:
    ended: dict[tuple[str, str], int] = {}
    restarts: dict[str, int] = {}
    decisions: dict[str, int] = {}
    for i, attempt in enumerate(view.attempts):
        failure = str(attempt.failure) if attempt.failure else ""
        key = (str(attempt.state), failure)
        ended[key] = ended.get(key, 0) + 1
        followed = i + 1 < len(view.attempts) or view.holder is not None  # a later attempt, or one running now
        if attempt.failure and followed:
            restarts[failure] = restarts.get(failure, 0) + 1
        for decision in attempt.adaptations:
            decisions[str(decision.action)] = decisions.get(str(decision.action), 0) + 1
    for (state, failure), count in sorted(ended.items()):
        yield PREFIX + "attempts_total", {"state": state, "failure": failure}, float(count)
    for failure, count in sorted(restarts.items()):
        yield PREFIX + "restarts_total", {"failure": failure}, float(count)
    for action, count in sorted(decisions.items()):
        yield PREFIX + "adapt_decisions_total", {"action": action}, float(count)
