"""``plan --explain`` and ``plan --calibrate-from``: the arithmetic behind the estimate, each step term and each
phase of the time to first step beside the table's, the split candidates side by side, the modes compared, and a
run's measurements against its plan. Pure: sections for :mod:`.tables` to print."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpo_launch.cli.tables import Section
from grpo_launch.planning.plan_types import Plan
from grpo_launch.recipe.launch import DEFAULT_STOP_GRACE_S

if TYPE_CHECKING:
    from grpo_launch.planning.measured_scales import Comparison


def explain_sections(plan: Plan) -> list[Section]:
    """The arithmetic behind the estimate, and the split search side by side (why each candidate lost)."""
    lines = [(line,) for line in plan.estimate.explain] if plan.estimate else []
    if plan.estimate is None:
        lines = [("no estimate: the model shape or the GPU memory is unknown (a CPU plan, or pass --gpus MODEL)",)]
    title = "Arithmetic (estimates, see grpo_launch/planning/cost/ for the model)"
    out = [Section(title, [*lines, (_stop_line(plan),)], ())]
    out += _terms_section(plan)
    if not plan.candidates:
        return out
    best = next((c for c in plan.candidates if c.chosen), None)
    rows = []
    for c in plan.candidates:
        gpus = f"{c.server_gpus}/{c.trainers}" + (f"/{c.idle}" if c.idle else "")
        if c.step is None:
            if c.outscored:
                why = f"outscored: {c.outscored}"
            else:
                why = f"not possible: {c.rejected}" if c.rejected else f"lower bound {c.bound_s:.1f} s: cannot win"
            rows.append((c.label, gpus, "-", "-", "-", "-", "-", why))
            continue
        note = "chosen" if c.chosen else ""
        if not c.chosen and best is not None and best.per_prompt_s and c.per_prompt_s:
            note = f"{c.per_prompt_s / best.per_prompt_s:.2f}× slower per prompt"  # the step's ratio at one batch
        s = c.step
        times = (f"{s.trainer_generation_s:.1f}", f"{s.training_s:.1f}", f"{s.total_s:.1f}")
        balance = f"{c.balance:.2f}" if c.balance is not None else "-"
        rows.append((c.label, gpus, *times, balance, f"{c.prompts_per_step:g}", note))
    header = ("split", "vLLM/train/idle GPUs", "gen s", "train s", "step s", "gen÷train", "prompts", "vs chosen")
    title = "Split candidates (the shortest time per prompt wins; prompts: the batch each split is planned at)"
    out.append(Section(title, rows, header))
    return out + _modes_section(plan)


def _stop_line(plan: Plan) -> str:
    """How long the first Ctrl-C or SIGTERM waits for a checkpoint, and where that comes from."""
    from grpo_launch.execute.watchdog import STUCK_FACTOR, STUCK_FLOOR_S

    grace = plan.recipe.launch.stop_grace_s
    said = (
        f"up to {grace:g} s (launch.stop_grace_s)"
        if grace is not None
        else "up to what the platform leaves, "
        "read when the run starts (Slurm: the partition's GraceTime or the cluster's KillWait; a SkyPilot spot "
        f"task: the reclaim notice), else {DEFAULT_STOP_GRACE_S:g} s (launch.stop_grace_s's default)"
    )
    return (
        f"stop: the first Ctrl-C or SIGTERM waits {said} for a checkpoint at the end of the step in flight, "
        f"unless that step has run {STUCK_FACTOR:g}× the longest step measured (at least {STUCK_FLOOR_S:g} s): "
        "then it stops at once, within launch.grace_period_s"
    )


def _terms_section(plan: Plan) -> list[Section]:
    """Each step term and each phase of the time to first step: the table's value, what calibrate measured for the
    same work, and which the plan used."""
    est = plan.estimate
    if est is None or not (est.terms or est.startup):
        return []

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    rows = [(t.name, s(t.table_s), s(t.measured_s), t.used) for t in est.terms]
    if est.startup is not None:
        rows += [
            (
                f"first step: {p.name}",
                "-" if p.measured else s(p.seconds),
                s(p.seconds) if p.measured else "-",
                "measured" if p.measured else "table",
            )
            for p in est.startup.phases
        ]
    title = "Step terms: the table's and calibrate's for this plan's work ('-': none; grpo-launch calibrate measures)"
    return [Section(title, rows, ("term", "table", "measured", "used"))]


def _modes_section(plan: Plan) -> list[Section]:
    """Sync against async side by side: the best plan of each at the same completions per step (launch.mode)."""
    a = plan.asynchronous
    best = {}
    for is_async in (False, True):
        planned = [c for c in plan.candidates if c.step and c.label.endswith("· async") is is_async]
        if planned:  # the chosen one of its mode, else its shortest step
            best[is_async] = min(planned, key=lambda c: (not c.chosen, c.step.total_s if c.step else 0.0))
    if a is None or len(best) < 2:
        return []
    rows = []
    for is_async, c in sorted(best.items()):
        s = c.step
        assert s is not None
        other = best[not is_async].step
        note = "chosen" if c.chosen else f"{s.total_s / other.total_s:.2f}× the chosen step" if other else ""
        rows.append(
            (
                "async" if is_async else "sync",
                c.label,
                f"{s.generation_s:.1f}",
                f"{s.old_logprobs_s:.1f}",
                f"{s.training_s:.1f}",
                f"{s.sync_s:.1f}",
                f"{s.total_s:.1f}",
                note,
            )
        )
    said = f"async: overlap bound {a.overlap_bound:.2f}×, in flight {a.max_inflight_tasks}, queue {a.queue_maxsize}"
    said += f", predicted staleness {a.predicted_staleness:.2f} (max_staleness {a.max_staleness})"
    rows.append(("", said, "", "", "", "", "", ""))
    header = ("mode", "best split", "gen s", "old log-probs s", "train s", "sync s", "step s", "")
    return [Section("Sync vs async (launch.mode; the same completions per step)", rows, header)]


def calibration_section(run_dir: str, rows: Sequence[Comparison]) -> Section:
    """Predicted (by the earlier run's plan) against measured, term by term, and what the new plan applies."""

    def fmt(x: float | None, unit: str) -> str:
        return "-" if x is None else (f"{x:.0f} {unit}" if unit == "tokens" else f"{x:.2f} {unit}")

    table = [
        (r.term, fmt(r.predicted, r.unit), fmt(r.measured, r.unit), f"{r.ratio:.2f}" if r.ratio else "-", r.note)
        for r in rows
    ]
    header = ("term", "predicted", "measured", "measured/predicted", "applied")
    return Section(f"Calibrated from {run_dir} (the estimate above uses these)", table, header)
