"""The run report's text: a summary first (state, steps, wall time, GPU-hours and cost, reward, measured against
predicted step time and memory, the split verdict), then the plan (roles, layout, backend), the recipe as the
trainers read it, links to the logs and the last error. The run directory as :class:`.view.RunView` read it in,
(label, value) rows out; report.py renders them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from grpo_launch.analysis.by_attempt import numbered
from grpo_launch.analysis.split_verdict import split_verdict
from grpo_launch.analysis.step_means import Measured, measure
from grpo_launch.analysis.timeline import adaptation_rows, async_row, attempt_rows, startup_row
from grpo_launch.analysis.view import RunView
from grpo_launch.enums import RunState, VllmMode
from grpo_launch.errors import ConfigError, size_text
from grpo_launch.rundir.plan_record import PlanRecord
from grpo_launch.rundir.records import Attempt, StepRecord

Rows = list[tuple[str, str]]


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _wall_s(view: RunView) -> float | None:
    """Each attempt's time from its first step's start to its last step's end, as rank 0 timed them, summed (the
    time between attempts, and the steps a later attempt trained again, are not the run's steps)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for n, r in numbered(view.records):
        if isinstance(r, StepRecord) and r.time is not None:
            spans.setdefault(n, []).append((r.time - r.step_s, r.time))
    if not spans:
        return None
    return sum(s[-1][1] - s[0][0] for s in spans.values())


def _state(measured: Measured | None, attempts: Sequence[Attempt]) -> str:
    last = attempts[-1] if attempts else None
    if last is not None:
        said = str(last.state)
        if last.failure:
            said += f" ({last.failure})"
        said += f": {last.why}" if last.why and last.state != RunState.SUCCEEDED else ""
        earlier = [f"{a.state}" + (f" ({a.failure})" if a.failure else "") for a in attempts[:-1]]
        if earlier:  # an interruption or a failure the run got past is said, not hidden behind the last end
            said += f"; after {len(earlier)} earlier attempt(s): {', '.join(earlier)}"
        return said
    if measured and measured.max_steps and measured.last_step >= measured.max_steps:
        return "finished"
    return "running, or stopped without a record"


def summary_rows(view: RunView, rewards: dict[str, list[float]]) -> tuple[Rows, str | None]:
    """The summary, and the last error (None when the run did not fail)."""
    try:
        m: Measured | None = measure(view)
    except ConfigError:
        m = None
    attempts = list(view.attempts)
    rows: Rows = [("state", _state(m, attempts))]
    if m is None:
        return [*rows, ("steps", "none recorded")], _last_error(attempts)
    rows.append(("steps", f"{m.last_step}/{m.max_steps or '?'}"))
    rows += _cost_rows(view, rewards)
    rows += _measured_rows(m, view.plan, str(view.root))
    rows += attempt_rows(view.courses())  # each attempt once: its steps, own step time, checkpoint and end
    rows += adaptation_rows(attempts)
    plan = view.plan
    first = startup_row(view.records, plan.startup_s if plan else None, plan.startup_phases if plan else ())
    rows += [row for row in (first, async_row(view.records, plan.queue_maxsize if plan else None)) if row]
    return rows, _last_error(attempts)


def _cost_rows(view: RunView, rewards: dict[str, list[float]]) -> Rows:
    """The wall time of the steps with its GPU-hours and price, and the reward's course."""
    rows: Rows = []
    wall, plan = _wall_s(view), view.plan
    gpus = plan.gpus if plan else 0
    price = plan.price_per_gpu_hour if plan else None
    if wall is not None:
        gpu_h = wall / 3600 * gpus
        cost = f", {gpu_h * price:,.2f} at {price:,.2f} per GPU-hour" if price else ""
        rows.append(
            (
                "wall time (steps)",
                f"{_duration(wall)}; {gpu_h:.2f} GPU-hours on {gpus} GPU(s){cost}" if gpus else _duration(wall),
            )
        )
    reward = rewards.get("reward") or []
    if reward:
        rows.append(("reward", f"first {reward[0]:.3f}, last {reward[-1]:.3f}, best {max(reward):.3f}"))
    return rows


def _measured_rows(m: Measured, plan: PlanRecord | None, run_dir: str) -> Rows:
    """Step time and memory, measured against predicted, and the split's verdict."""
    pred = m.prediction
    step = f"{m.step_s:.2f} s (generation {m.generation_s:.2f} s, training {m.training_s:.2f} s)"
    if pred is not None and math.isfinite(pred.step_s):
        step += f"; predicted {pred.step_s:.2f} s ({m.step_s / pred.step_s:.2f}× measured/predicted)"
    rows: Rows = [("step time", step)]
    if m.peak_memory_bytes:
        mem = f"{size_text(m.peak_memory_bytes)} peak ({m.memory_kind}, largest rank)"
        if pred is not None and pred.train_memory_gib:
            ratio = m.peak_memory_bytes / (pred.train_memory_gib * 2**30)
            mem += f"; estimated {pred.train_memory_gib:.1f} GiB per training GPU ({ratio:.2f}× measured/estimated)"
        rows.append(("memory", mem))
    mode = plan.vllm_mode if plan else "off"
    planned = (pred.trainer_generation_s, pred.training_s) if pred is not None else None
    cpu = plan is not None and plan.train["device"] == "cpu"
    verdict = split_verdict(m.generation_s, m.training_s, VllmMode(mode), planned=planned, run_dir=run_dir, cpu=cpu)
    rows.append(("split", verdict.removeprefix("step split: ")))  # the row names it: "split: step split" no more
    return rows


def _last_error(attempts: list[Attempt]) -> str | None:
    failed = [a for a in attempts if a.state == RunState.FAILED]
    if not failed:
        return None
    a = failed[-1]
    where = f" on the {a.side} side" if a.side else ""
    return f"attempt {a.attempt}: {a.failure or 'failed'}{where}: {a.why}\n{a.message}".strip()


def plan_rows(plan: PlanRecord | None) -> Rows:
    """Roles, layout and backend, as planned."""
    if plan is None:
        return []
    rows: Rows = []
    if plan.topology:
        rows.append(("GPUs", plan.topology))
    roles: dict[str, list[str]] = {}
    for r in plan.roles:
        roles.setdefault(f"{r.host} {r.role}", []).append(r.gpu)
    for where, ids in roles.items():
        rows.append(("role", f"{where}: GPU {','.join(ids)}"))
    if plan.vllm_mode != "off":
        tp, pp, dp = plan.vllm_parallel
        shape = f"TP {tp}" + (f" × PP {pp}" if pp > 1 else "") + (f" × DP {dp}" if dp > 1 else "")
        rows.append(("vLLM", f"{plan.vllm_mode}, {shape}, gpu_memory_utilization {plan.vllm_memory_share}"))
    lay, t = plan.layout, plan.train
    rows.append(
        (
            "layout",
            f"{lay['per_device_train_batch_size']} per device × {lay['num_processes']} "
            f"process(es) × {lay['gradient_accumulation_steps']} accumulation = "
            f"{lay['completions_per_optimizer_step']} completions per step "
            f"({lay['num_generations']} per prompt)",
        )
    )
    rows.append(
        ("training", f"{t['backend']} on {t['device']}, offload {t['offload']}, mixed precision {t['mixed_precision']}")
    )
    return rows


def log_links(view: RunView, report_dir: Path) -> list[tuple[str, str]]:
    """(name, relative href) of the run's logs, from the report's directory."""
    root = view.root
    return [(p.name, "../" + str(p.relative_to(root))) for p in view.logs() if report_dir.parent == root]
