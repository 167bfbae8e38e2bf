"""The run report's text: a summary first (state, steps, wall time, GPU-hours and cost, reward, measured against
predicted step time and memory, the split verdict), then the plan (roles, layout, backend), the recipe as the
trainers read it, links to the logs and the last error. Plain data in, (label, value) rows out; report.py renders
them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grpo_launch.enums import RunState, VllmMode
from grpo_launch.errors import ConfigError, size_text
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.measured import Measured, metric_records, read_run
from grpo_launch.rundir.records import Attempt, StepRecord, read_attempts
from grpo_launch.rundir.timeline import adaptation_rows, async_row, startup_row
from grpo_launch.rundir.verdict import split_verdict

Rows = list[tuple[str, str]]


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _num_gpus(plan: dict[str, Any]) -> int:
    hosts = (plan.get("topology") or {}).get("hosts") or []
    return sum(len(h.get("gpus") or []) for h in hosts if isinstance(h, dict))


def _wall_s(root: Path) -> float | None:
    """From the first step's start to the last step's end, as rank 0 timed them."""
    steps = [r for r in metric_records(root) if isinstance(r, StepRecord) and r.time is not None]
    if not steps:
        return None
    return float(steps[-1].time) - (float(steps[0].time) - steps[0].step_s)  # type: ignore[arg-type]


def _state(measured: Measured | None, attempts: list[Attempt]) -> str:
    last = attempts[-1] if attempts else None
    if last is not None:
        said = str(last.state)
        if last.failure:
            said += f" ({last.failure})"
        return said + (f": {last.why}" if last.why and last.state != RunState.SUCCEEDED else "")
    if measured and measured.max_steps and measured.last_step >= measured.max_steps:
        return "finished"
    return "running, or stopped without a record"


def summary_rows(root: Path, plan: dict[str, Any], rewards: dict[str, list[float]]) -> tuple[Rows, str | None]:
    """The summary, and the last error (None when the run did not fail)."""
    try:
        m: Measured | None = read_run(root)
    except ConfigError:
        m = None
    attempts = read_attempts(RunPaths(root).attempts)
    rows: Rows = [("state", _state(m, attempts))]
    if m is None:
        return [*rows, ("steps", "none recorded")], _last_error(attempts)
    rows.append(("steps", f"{m.last_step}/{m.max_steps or '?'}"))
    wall, gpus = _wall_s(root), _num_gpus(plan)
    total = (plan.get("estimate") or {}).get("total") or {}
    price = total["price"] / total["gpu_hours"] if total.get("price") and total.get("gpu_hours") else None
    if wall is not None:
        gpu_h = wall / 3600 * gpus
        cost = f", {gpu_h * price:,.2f} at {price:,.2f} per GPU-hour" if price else ""
        rows.append(("wall time (steps)", f"{_duration(wall)}; {gpu_h:.2f} GPU-hours on {gpus} GPU(s){cost}" if gpus
                     else _duration(wall)))  # fmt: skip
    reward = rewards.get("reward") or []
    if reward:
        rows.append(("reward", f"first {reward[0]:.3f}, last {reward[-1]:.3f}, best {max(reward):.3f}"))
    pred = m.prediction
    step = f"{m.step_s:.2f} s (generation {m.generation_s:.2f} s, training {m.training_s:.2f} s)"
    if pred is not None and math.isfinite(pred.step_s):
        step += f"; predicted {pred.step_s:.2f} s ({m.step_s / pred.step_s:.2f}× measured/predicted)"
    rows.append(("step time", step))
    if m.peak_memory_bytes:
        mem = f"{size_text(m.peak_memory_bytes)} peak ({m.memory_kind}, largest rank)"
        if pred is not None and pred.train_memory_gib:
            ratio = m.peak_memory_bytes / (pred.train_memory_gib * 2**30)
            mem += f"; estimated {pred.train_memory_gib:.1f} GiB per training GPU ({ratio:.2f}× measured/estimated)"
        rows.append(("memory", mem))
    mode = str((plan.get("vllm") or {}).get("mode") or "off")
    planned = (pred.trainer_generation_s, pred.training_s) if pred is not None else None
    cpu = str((plan.get("train") or {}).get("device")) == "cpu"
    verdict = split_verdict(m.generation_s, m.training_s, VllmMode(mode), planned=planned, run_dir=str(root), cpu=cpu)
    rows.append(("split", verdict))
    rows += adaptation_rows(attempts)
    records = metric_records(root)
    first = startup_row(records, (plan.get("estimate") or {}).get("startup_s"))
    rows += [row for row in (first, async_row(records, plan)) if row]
    return rows, _last_error(attempts)


def _last_error(attempts: list[Attempt]) -> str | None:
    failed = [a for a in attempts if a.state == RunState.FAILED]
    if not failed:
        return None
    a = failed[-1]
    where = f" on the {a.side} side" if a.side else ""
    return f"attempt {a.attempt}: {a.failure or 'failed'}{where}: {a.why}\n{a.message}".strip()


def plan_rows(plan: dict[str, Any]) -> Rows:
    """Roles, layout and backend, as planned."""
    rows: Rows = []
    topo = plan.get("topology") or {}
    if topo.get("description"):
        rows.append(("GPUs", str(topo["description"])))
    roles: dict[str, list[str]] = {}
    for r in plan.get("roles") or []:
        roles.setdefault(f"{r.get('host')} {r.get('role')}", []).append(str(r.get("gpu")))
    for where, ids in roles.items():
        rows.append(("role", f"{where}: GPU {','.join(ids)}"))
    v = plan.get("vllm") or {}
    if v.get("mode") and v.get("mode") != "off":
        shape = f"TP {v.get('tensor_parallel_size')}"
        shape += f" × PP {v['pipeline_parallel_size']}" if (v.get("pipeline_parallel_size") or 1) > 1 else ""
        shape += f" × DP {v['data_parallel_size']}" if (v.get("data_parallel_size") or 1) > 1 else ""
        rows.append(("vLLM", f"{v.get('mode')}, {shape}, gpu_memory_utilization {v.get('gpu_memory_utilization')}"))
    lay = plan.get("layout") or {}
    if lay:
        rows.append(("layout", f"{lay.get('per_device_train_batch_size')} per device × {lay.get('num_processes')} "
                     f"process(es) × {lay.get('gradient_accumulation_steps')} accumulation = "
                     f"{lay.get('completions_per_optimizer_step')} completions per step "
                     f"({lay.get('num_generations')} per prompt)"))  # fmt: skip
    t = plan.get("train") or {}
    if t:
        rows.append(("training", f"{t.get('backend')} on {t.get('device')}, offload {t.get('offload')}, mixed "
                     f"precision {t.get('mixed_precision')}"))  # fmt: skip
    return rows


def log_links(root: Path, report_dir: Path) -> list[tuple[str, str]]:
    """(name, relative href) of the run's logs, from the report's directory."""
    logs = sorted(RunPaths(root).logs.glob("*.log"))
    return [(p.name, "../" + str(p.relative_to(root))) for p in logs if report_dir.parent == root]
