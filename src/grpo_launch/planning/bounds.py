"""A split's candidate row and the lower bound of its step (pure): the TP × DP of one server size (or of colocated
engines) is chosen by its generation time alone, since training does not depend on it; its bound adds the old
log-probs and training at the cheapest setting (DDP without offload). The search plans a size in full only where
its bound can beat the best plan so far."""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import DistBackend, Offload, VllmMode
from grpo_launch.errors import PlanError
from grpo_launch.machines.gpus import GpuSpec
from grpo_launch.planning import placement
from grpo_launch.planning.async_grpo import async_workload
from grpo_launch.planning.batch_layout import solve_layout
from grpo_launch.planning.cost.constants import STEP_UNCERTAINTY
from grpo_launch.planning.cost.steptime import old_logprobs_time, training_time
from grpo_launch.planning.gpu_types import role_specs, serve_topology
from grpo_launch.planning.parallel_and_batch import Batch
from grpo_launch.planning.plan_types import Candidate, Plan, Trace
from grpo_launch.planning.search_context import Context
from grpo_launch.planning.splits.split import Split, SplitKind
from grpo_launch.planning.step_estimate import generation_part
from grpo_launch.planning.step_work import workload
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
    ctx: Context, variants: list[Split], target: Batch | None, rejected: list[Candidate], outscored: list[Candidate]
) -> tuple[float, Split] | None:
    """The TP × DP of one server size (or colocated TP) with the shortest generation, and the lower bound of its
    step: that generation and sync, the old log-probs, and training at the cheapest setting (DDP, no offload).
    Variants within the model's uncertainty (:data:`STEP_UNCERTAINTY`) of the fastest are not told apart: the one
    with the fewest GPUs per engine is chosen (not in a plan calibrated on measurements, whose figures are fitted).
    The others go to ``outscored`` with the figures they lost by.
    Raises LayoutError when no batch layout fits its trainers; None when no variant's vLLM fits."""
    s0 = variants[0]
    model, ctx_gpu = ctx.model, ctx.gpu
    assert model is not None and ctx_gpu is not None
    gpu: GpuSpec = ctx_gpu
    completions = target.completions if target else None
    layout, _ = solve_layout(s0.trainers, ctx.request, completions=completions)
    work = workload(ctx.recipe, layout, ctx.calibration)
    if s0.asynchronous:
        work = async_workload(work, ctx.recipe)
    scored: list[tuple[float, float, Split]] = []  # (generation, sync, split)
    for split in variants:
        scratch = Trace()
        vllm, hosts = placement.place(ctx.topology, ctx.recipe, model, split, scratch)
        try:
            vllm, _ = size_vllm(serve_topology(ctx.topology, vllm, hosts), model, vllm, work, scratch, split.trainers)
        except PlanError as exc:
            rejected.append(candidate(split, None, rejected=reason(exc)))
            continue
        serve_gpu, train_gpu = role_specs(ctx.topology, vllm, hosts)  # a mixed cluster: each role on its own type
        serve_gpu, gpu = serve_gpu or ctx_gpu, train_gpu or ctx_gpu  # a split's variants share their trainers
        gen, sync, _, _ = generation_part(model, serve_gpu, vllm, hosts, work)
        scored.append((gen, sync, split))
    if not scored:
        return None
    fastest = min(g + s for g, s, _ in scored)
    # A plan calibrated on this run's own measurements (--calibrate-from, launch.adapt) is trusted as fitted.
    window = 0.0 if ctx.calibration is not None else STEP_UNCERTAINTY
    close = [v for v in scored if v[0] + v[1] <= fastest * (1 + window)]
    gen, sync, chosen = min(close, key=lambda v: (v[2].par.tp * v[2].par.pp, v[0] + v[1]))
    best, best_parts = (gen + sync, chosen), (gen, sync)
    for g, s, split in scored:
        if split is chosen:
            continue
        faster = g + s < gen + sync
        why = f"generation + sync {g + s:.2f} s against {gen + sync:.2f} s for {chosen.label}"
        if faster:
            why += f": within the model's {window:.0%}, the layout with fewer GPUs per engine is chosen"
        prompts = layout.completions_per_optimizer_step / layout.num_generations  # the batch it was compared at
        outscored.append(dataclasses.replace(candidate(split, None, prompts=prompts), outscored=why))
    forced = ctx.recipe.get("gradient_checkpointing") is True
    cheapest = dataclasses.replace(work, gradient_checkpointing=forced)
    backend = DistBackend.FSDP if s0.asynchronous else DistBackend.DDP
    train, _ = training_time(model, gpu, s0.trainers, backend, Offload.NONE, cheapest)
    if s0.asynchronous:  # the slower side plus the sync (planning/cost/overlap.py)
        gen, sync = best_parts
        return max(gen, train) + sync * work.sync_weight_bytes / 2, best[1]
    old = old_logprobs_time(model, gpu, s0.trainers, work)
    return best[0] + train + old, best[1]
