"""launch.mode: sync (TRL's GRPOTrainer), async (its AsyncGRPOTrainer) or auto, planned side by side. Pure.

Async candidates are the splits whose server and trainers hold different GPUs, planned by the same split search
(:mod:`.search`) at the same batch rule as the sync ones (compared per prompt: where the recipe's own values are
kept, a split's batch follows its trainers); the plan keeps both sets of candidates for ``--explain``, and says
what the chosen mode gains over the other.
"""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import LaunchMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.planning.parallel_and_batch import Batch
from grpo_launch.planning.plan_types import Decision, Plan
from grpo_launch.planning.refusal.async_problems import async_problems, async_warnings
from grpo_launch.planning.search import best_plan, default_split, search_splits
from grpo_launch.planning.search_context import Context
from grpo_launch.planning.split_in_full import plan_one
from grpo_launch.planning.splits.split import Split


def check_mode(ctx: Context) -> bool:
    """Whether this plan tries async: launch.mode async refuses here with every reason and its fixes; auto stays
    sync (and says why) where async cannot run."""
    mode = ctx.recipe.launch.mode
    if mode is LaunchMode.SYNC:
        return False
    problems = async_problems(ctx.topology, ctx.recipe, ctx.model)
    if not problems:
        return True
    if mode is LaunchMode.ASYNC:
        raise PlanError(
            "launch.mode=async: TRL 1.16's AsyncGRPOTrainer cannot run this plan:",
            problems=[why for why, _ in problems],
            fixes=[fix for _, fixes in problems for fix in fixes],
        )
    ctx.base.decide("launch.mode", LaunchMode.SYNC, f"auto: async cannot run here: {problems[0][0]}")
    return False


def plan_modes(ctx: Context, splits: list[Split], target: Batch | None) -> Plan:
    """The async plan (launch.mode async), or the faster of the two (auto), beside the best sync plan."""
    mode = ctx.recipe.launch.mode
    shared = [dataclasses.replace(s, asynchronous=True) for s in splits if s.disjoint]
    if not shared:
        why = "no split gives the vLLM server GPUs of its own (AsyncGRPOTrainer needs disjoint GPUs; TRL docs)"
        if mode is LaunchMode.ASYNC:
            raise PlanError(
                f"launch.mode=async: {why}",
                fixes=[
                    Fix("gpus", None, "at least 2 GPUs: one serves, one trains", 1, in_recipe=False),
                    Fix("launch.mode", "sync", "TRL's GRPOTrainer (colocated vLLM)", rank=2),
                ],
            )
        ctx.base.decide("launch.mode", LaunchMode.SYNC, f"auto: {why}")
        return best_plan(ctx, splits, target)
    if not ctx.estimable:
        if mode is LaunchMode.AUTO:
            ctx.base.decide("launch.mode", LaunchMode.SYNC, "auto: no estimate (model or GPU unknown) to compare")
            return best_plan(ctx, splits, target)
        split = default_split(shared)
        ctx.base.decide("split", split.label, "no estimate (model or GPU unknown): the default split")
        return _finish(plan_one(ctx, split, target), None, ctx)
    chosen = search_splits(ctx, shared, target)
    try:
        sync = best_plan(ctx, splits, target)
    except PlanError:
        sync = None
    if mode is LaunchMode.AUTO and sync is not None and _per_prompt(sync) <= _per_prompt(chosen):
        why = f"auto: sync {_step(sync):.1f} s per step ≤ async {_step(chosen):.1f} s at the same work"
        if _prompts(sync) != _prompts(chosen):  # the recipe's batch on each split's trainers: per prompt
            why = (
                f"auto: sync {_per_prompt(sync):.3f} s per prompt ≤ async {_per_prompt(chosen):.3f} s (the "
                f"recipe's batch on each: {_prompts(sync):g} and {_prompts(chosen):g} prompts)"
            )
        return _merge(sync, chosen, Decision("launch.mode", LaunchMode.SYNC, why))
    return _finish(chosen, sync, ctx, _deadlock_warning(ctx, shared, chosen, target))


def _step(plan: Plan) -> float:
    assert plan.estimate is not None and plan.estimate.step is not None
    return plan.estimate.step.total_s


def _prompts(plan: Plan) -> float:
    return plan.layout.completions_per_optimizer_step / plan.layout.num_generations


def _per_prompt(plan: Plan) -> float:
    """Seconds per prompt: the comparison of two plans whose batches may differ (the recipe's values kept on splits
    with different trainer counts); the same order as their steps when the batches are equal."""
    return _step(plan) / _prompts(plan)


# TRL 1.16's AsyncGRPOTrainer full-weight sync is reported to deadlock beyond 2 FSDP ranks (huggingface/trl#6797,
# #7103; the fixes, #6798 and #7131, are not in 1.16): an adapter-only (LoRA) sync is not affected.
ASYNC_SAFE_RANKS = 2


def _deadlock_warning(ctx: Context, shared: list[Split], chosen: Plan, target: Batch | None) -> str | None:
    """The warning of an async plan with more than :data:`ASYNC_SAFE_RANKS` ranks syncing full weights, with the
    best async plan of 2 ranks at most beside it (planned: its split and step), so the user chooses knowingly."""
    n = chosen.train.num_processes
    if n <= ASYNC_SAFE_RANKS or ctx.recipe.values.get("use_peft"):
        return None
    settings = chosen.asynchronous
    timeout = settings.weight_sync_timeout if settings else None
    said = (
        f"{n} trainer ranks: TRL 1.16's full-weight sync to vLLM is reported to deadlock with more than "
        f"{ASYNC_SAFE_RANKS} FSDP ranks (huggingface/trl#6797, #7103; fixes in #6798/#7131 are not in 1.16): a "
        f"hang raises after weight_sync_timeout={timeout} s, and launch.hang_timeout_s stops the run with every "
        "rank's stack"
    )
    safe = [s for s in shared if s.trainers <= ASYNC_SAFE_RANKS]
    try:
        two = search_splits(ctx, safe, target) if safe else None
    except PlanError:
        two = None
    if two is None or not (two.estimate and two.estimate.step and chosen.estimate and chosen.estimate.step):
        return said + "; no async split of 2 trainers fits here (LoRA, use_peft=true, syncs only the adapter)"
    return (
        said + f"; {two.train.num_processes} ranks avoid it: launch.vllm_gpus={two.vllm.parallelism.gpus} "
        f"({two.split}), predicted {_step(two):.1f} s per step against {_step(chosen):.1f} s, or LoRA "
        "(use_peft=true), whose adapter-only sync is not affected"
    )


def _finish(plan: Plan, sync: Plan | None, ctx: Context, deadlock: str | None = None) -> Plan:
    """The async plan with its speed-up over the best sync plan (the same work per step) and the warnings."""
    if deadlock:
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, deadlock))
    settings = plan.asynchronous
    assert settings is not None
    said = "set in the recipe" if ctx.recipe.launch.mode is LaunchMode.ASYNC else "auto"
    if sync is not None and sync.estimate and sync.estimate.step and plan.estimate and plan.estimate.step:
        speedup = _per_prompt(sync) / _per_prompt(plan)  # per step when both run one batch
        best_sync = next((c.label for c in sync.candidates if c.chosen), sync.vllm.mode)
        settings = dataclasses.replace(
            settings, sync_step_s=round(_step(sync), 3), sync_label=str(best_sync), speedup=round(speedup, 3)
        )
        why = (
            f"{said}: predicted {_step(plan):.1f} s per step against {_step(sync):.1f} s for the best sync plan "
            f"({best_sync}) at the same completions per step: {speedup:.2f}× (overlap alone gains at most "
            f"{settings.overlap_bound:.2f}× on this split); samples lag {settings.predicted_staleness:.1f} weight "
            "versions on average (off-policy by that much)"
        )
        if speedup < 1:
            plan = dataclasses.replace(
                plan,
                warnings=(
                    *plan.warnings,
                    (
                        f"async is predicted slower than the best sync plan ({_step(plan):.1f} s against "
                        f"{_step(sync):.1f} s per step, {best_sync}): set launch.mode=sync, or auto to let the planner "
                        "choose"
                    ),
                ),
            )
    else:
        why = f"{said}: no sync plan to compare" if plan.estimate else f"{said}: no estimate"
    decision = Decision("launch.mode", LaunchMode.ASYNC, why)
    plan = dataclasses.replace(
        plan, asynchronous=settings, warnings=(*plan.warnings, *async_warnings(ctx.topology, ctx.recipe))
    )
    return _merge(plan, sync, decision) if sync is not None else _with(plan, decision)


def _merge(chosen: Plan, other: Plan | None, decision: Decision) -> Plan:
    """``chosen`` with the other mode's candidates beside its own (none of them chosen)."""
    others = tuple(dataclasses.replace(c, chosen=False) for c in (other.candidates if other else ()))
    return dataclasses.replace(_with(chosen, decision), candidates=(*chosen.candidates, *others))


def _with(plan: Plan, decision: Decision) -> Plan:
    return dataclasses.replace(plan, decisions=(decision, *plan.decisions))
