"""A split's candidate row and the lower bound of its step (pure): the TP × DP of one server size (or of colocated
engines) is chosen by its generation time alone, since training does not depend on it; its bound adds the old
log-probs and training at the cheapest setting (DDP without offload). The search plans a size in full only where
its bound can beat the best plan so far."""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import DistBackend, Offload, VllmMode
from grpo_launch.errors import PlanError
from grpo_launch.planning import placement
from grpo_launch.planning.batch_layout import solve_layout
from grpo_launch.planning.context import Context
from grpo_launch.planning.cost.steptime import old_logprobs_time, training_time
from grpo_launch.planning.estimate import generation_part, workload
from grpo_launch.planning.sizes import Batch
from grpo_launch.planning.splits.split import Split, SplitKind
from grpo_launch.planning.types import Candidate, Plan, Trace
from grpo_launch.planning.vllm_sizing import size_vllm


def reason(exc: PlanError) -> str:
    return ": ".join([exc.message.rstrip(":"), "; ".join(exc.problems)]) if exc.problems else exc.message


def prompts_of(plan: Plan) -> float:
    return plan.layout.completions_per_optimizer_step / plan.layout.num_generations


def candidate(
    split: Split, plan: Plan | None, *, prompts: float = 0.0, rejected: str | None = None, bound_s: float | None = None
) -> Candidate:
    mode = {SplitKind.COLOCATE: VllmMode.COLOCATE, SplitKind.OFF: VllmMode.OFF}.get(split.kind, VllmMode.SERVER)
    return Candidate(
        split.label,
        mode,
        split.par,
        server_gpus=split.server_gpus,
        trainers=split.trainers,
        idle=split.idle,
        step=plan.estimate.step if plan and plan.estimate else None,
        prompts_per_step=prompts,
        rejected=rejected,
        bound_s=bound_s,
    )


def best_variant(
    ctx: Context, variants: list[Split], target: Batch | None, rejected: list[Candidate]
) -> tuple[float, Split] | None:
    """The TP × DP of one server size (or colocated TP) with the shortest generation, and the lower bound of its
    step: that generation and sync, the old log-probs, and training at the cheapest setting (DDP, no offload).
    Raises LayoutError when no batch layout fits its trainers; None when no variant's vLLM fits."""
    s0 = variants[0]
    gpu, model = ctx.gpu, ctx.model
    assert model is not None and gpu is not None
    completions = target.completions if target else None
    layout, _ = solve_layout(s0.trainers, ctx.request, completions=completions)
    work = workload(ctx.recipe, layout, ctx.calibration)
    if s0.asynchronous:
        from grpo_launch.planning.async_grpo import async_workload  # only for async plans (one_split.plan_one)

        work = async_workload(work, ctx.recipe)
    best: tuple[float, Split] | None = None
    best_parts = (0.0, 0.0)
    for split in variants:
        scratch = Trace()
        vllm, hosts = placement.place(ctx.topology, ctx.recipe, model, split, scratch)
        try:
            vllm, _ = size_vllm(ctx.topology, model, vllm, work, scratch, split.trainers)
        except PlanError as exc:
            rejected.append(candidate(split, None, rejected=reason(exc)))
            continue
        gen, sync, _ = generation_part(model, gpu, vllm, hosts, work)
        if best is None or gen + sync < best[0]:
            best, best_parts = (gen + sync, split), (gen, sync)
    if best is None:
        return None
    forced = ctx.recipe.get("gradient_checkpointing") is True
    cheapest = dataclasses.replace(work, gradient_checkpointing=forced)
    backend = DistBackend.FSDP if s0.asynchronous else DistBackend.DDP
    train, _ = training_time(model, gpu, s0.trainers, backend, Offload.NONE, cheapest)
    if s0.asynchronous:  # the slower side plus the sync (planning/cost/overlap.py)
        gen, sync = best_parts
        return max(gen, train) + sync * work.sync_weight_bytes / 2, best[1]
    old = old_logprobs_time(model, gpu, s0.trainers, work)
    return best[0] + train + old, best[1]
