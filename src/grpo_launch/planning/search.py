"""The split search: every split the recipe allows, planned at the same prompts per optimizer step and the same
algorithm (group size, one generation per step); the shortest predicted step wins. Pure.

- The TP × DP of one server size (or of colocated engines) is chosen by its generation time alone: training does
  not depend on it.
- Each server size is then planned in full, best lower bound first (its generation and sync, the old log-probs,
  and training at the cheapest setting: DDP without offload); one whose bound cannot beat the best plan so far is
  not planned in full.
- GPUs idle only when every split that uses them is slower, and the plan says by how much.
- When the chosen batch keeps a faster split out (its trainers cannot take the batch evenly), the plan names the
  batch that split could take and what it would gain, as a ``launch.prompts_per_step`` to set: the batch is the
  recipe's algorithm and is never changed without the user.
- Every candidate stays in the plan for ``--explain``, with why it lost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from grpo_launch.enums import DistBackend, Offload, VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning import placement
from grpo_launch.planning.async_grpo import async_workload
from grpo_launch.planning.cost.steptime import old_logprobs_time, training_time
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.estimate import generation_part, size_vllm, workload
from grpo_launch.planning.layout import LayoutError, LayoutRequest, solve_layout
from grpo_launch.planning.split import Split, SplitKind, feasible
from grpo_launch.planning.types import Candidate, Decision, Plan, Runtime, Trace
from grpo_launch.planning.values import Batch
from grpo_launch.recipe import Recipe

BALANCED = 2.0  # a server split's generation within this factor of its training (either way) counts as balanced
WORTH_IT = 0.05  # a batch that lets a split do at least this much better per prompt is worth naming


@dataclasses.dataclass
class Search:
    """One search's inputs, shared by every split it plans."""

    topology: Topology
    recipe: Recipe
    model: ModelShape | None
    calibration: Calibration | None
    runtime: Runtime
    base: Trace  # what was decided or noticed before any split


PlanOne = Callable[[Search, Split | None, Batch | None], Plan]


def search_splits(search: Search, splits: list[Split], target: Batch | None, plan_one: PlanOne) -> Plan:
    """The best of ``splits`` at ``target`` completions per step (None: the recipe's own, one trainer count)."""
    groups: dict[tuple[SplitKind, int, int], list[Split]] = {}
    for s in splits:
        groups.setdefault((s.kind, s.server_gpus, s.trainers), []).append(s)
    rejected: list[Candidate] = []
    layouts: list[tuple[int, LayoutError]] = []  # (trainers, why) of the splits no batch layout fits
    misses: list[Split] = []  # server sizes whose trainers cannot take the batch evenly
    bounded: list[tuple[float, Split]] = []
    req = LayoutRequest.from_values(search.recipe.values)
    per_device = req.per_device
    for variants in groups.values():
        if target is not None and not feasible(target.completions, variants[0].trainers, per_device):
            misses.append(variants[0])
        try:
            found = best_variant(search, variants, target, rejected)
        except LayoutError as exc:
            rejected += [candidate(s, None, rejected=reason(exc)) for s in variants]
            layouts.append((variants[0].trainers, exc))
            continue
        if found is not None:
            bounded.append(found)
    bounded.sort(key=lambda b: b[0])
    scored: list[tuple[Candidate, Plan]] = []
    planned: dict[str, Split] = {}
    skipped: list[Candidate] = []
    for bound, split in bounded:
        if scored and bound >= min(c.step.total_s for c, _ in scored if c.step):
            prompts = float(target.prompts) if target else 0.0
            skipped.append(candidate(split, None, bound_s=bound, prompts=prompts))
            continue
        try:
            plan = plan_one(search, split, target)
        except PlanError as exc:
            rejected.append(candidate(split, None, rejected=reason(exc)))
            continue
        assert plan.estimate is not None
        scored.append((candidate(split, plan, prompts=_prompts(plan)), plan))
        planned[split.label] = split
    if not scored and layouts and len(layouts) == len(groups):
        # The recipe's batch fits no split: its layout problem, as the split with the most trainers meets it.
        raise max(layouts, key=lambda lt: lt[0])[1]
    if not scored:
        raise PlanError(
            "no split of the GPUs between vLLM and the trainers plans:",
            problems=[f"{c.label}: {c.rejected}" for c in rejected],
            hint="grpo-launch plan --explain shows each split's arithmetic.",
            fixes=_batch_fixes(search, misses, target),
        )
    scored.sort(key=lambda cp: cp[0].step.total_s if cp[0].step else 0.0)
    best, plan = scored[0]
    others = [c for c, _ in scored[1:]]
    decisions = [Decision("split", best.label, _why_split(best, others, skipped))]
    decisions += _idle_and_balance(best, others, skipped)
    notices: list[str] = []
    if misses:
        better = _better_batch(search, misses, best, planned[best.label], plan_one)
        if better is not None:
            decisions.append(Decision("prompts_per_step_alternative", better[0], better[1]))
            notices.append(better[1])
    larger = _latency_bound(search, best, planned[best.label], target, plan_one) if target is not None else None
    if larger is not None:
        decisions.append(Decision("prompts_per_step_larger", larger[0], larger[1]))
        notices.append(larger[1])
    candidates = (dataclasses.replace(best, chosen=True), *others, *skipped, *rejected)
    return dataclasses.replace(
        plan, decisions=(*decisions, *plan.decisions), candidates=candidates, notices=(*plan.notices, *notices)
    )


def reason(exc: PlanError) -> str:
    return ": ".join([exc.message.rstrip(":"), "; ".join(exc.problems)]) if exc.problems else exc.message


def _prompts(plan: Plan) -> float:
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
    search: Search, variants: list[Split], target: Batch | None, rejected: list[Candidate]
) -> tuple[float, Split] | None:
    """The TP × DP of one server size (or colocated TP) with the shortest generation, and the lower bound of its
    step: that generation and sync, the old log-probs, and training at the cheapest setting (DDP, no offload).
    Raises LayoutError when no batch layout fits its trainers; None when no variant's vLLM fits."""
    s0 = variants[0]
    gpu = search.topology.planning_gpu_spec
    assert search.model is not None and gpu is not None
    completions = target.completions if target else None
    layout, _ = solve_layout(s0.trainers, LayoutRequest.from_values(search.recipe.values), completions=completions)
    work = workload(search.recipe, layout, search.calibration)
    if s0.asynchronous:
        work = async_workload(work, search.recipe)
    best: tuple[float, Split] | None = None
    best_parts = (0.0, 0.0)
    for split in variants:
        scratch = Trace()
        vllm, hosts = placement.place(search.topology, search.recipe, search.model, split, scratch)
        try:
            vllm, _ = size_vllm(search.topology, search.model, vllm, work, scratch, split.trainers)
        except PlanError as exc:
            rejected.append(candidate(split, None, rejected=reason(exc)))
            continue
        gen, sync, _ = generation_part(search.model, gpu, vllm, hosts, work)
        if best is None or gen + sync < best[0]:
            best, best_parts = (gen + sync, split), (gen, sync)
    if best is None:
        return None
    forced = search.recipe.get("gradient_checkpointing") is True
    cheapest = dataclasses.replace(work, gradient_checkpointing=forced)
    backend = DistBackend.FSDP if s0.asynchronous else DistBackend.DDP
    train, _ = training_time(search.model, gpu, s0.trainers, backend, Offload.NONE, cheapest)
    if s0.asynchronous:  # the slower side plus the sync (planning/cost/overlap.py)
        gen, sync = best_parts
        return max(gen, train) + sync * work.sync_weight_bytes / 2, best[1]
    old = old_logprobs_time(search.model, gpu, s0.trainers, work)
    return best[0] + train + old, best[1]


def _why_split(best: Candidate, others: list[Candidate], skipped: list[Candidate]) -> str:
    assert best.step is not None
    said = ", ".join(f"{c.label} {c.step.total_s:.2f} s" for c in others[:4] if c.step)
    why = f"shortest predicted step at {best.prompts_per_step:g} prompts per step: {best.label} "
    why += f"{best.step.total_s:.2f} s"
    if said:
        why += f" (vs {said})"
    if skipped:
        why += f"; {len(skipped)} more split(s) could not beat it even at their lower bound"
    return why


def _idle_and_balance(best: Candidate, others: list[Candidate], skipped: list[Candidate]) -> list[Decision]:
    """Why GPUs idle (only when every split that uses them is slower), and generation against training."""
    assert best.step is not None
    out = []
    if best.idle:
        busy = [c for c in others if not c.idle and c.step]
        why = "no split that uses every GPU plans"
        if busy:
            c = busy[0]
            assert c.step is not None
            why = (
                f"the fastest split that uses every GPU, {c.label}, predicts {c.step.total_s:.2f} s per step, "
                f"{(c.step.total_s / best.step.total_s - 1):.0%} slower"
            )
        elif any(not c.idle for c in skipped):
            c = next(c for c in skipped if not c.idle)
            why = f"every split that uses every GPU is slower: {c.label} cannot beat it even at its lower bound"
        out.append(Decision("idle_gpus", best.idle, why))
    ratio = best.balance
    if ratio is None:
        return out
    said = f"generation {best.step.trainer_generation_s:.2f} s vs training {best.step.training_s:.2f} s per step"
    if best.mode == VllmMode.COLOCATE:
        out.append(Decision("balance", round(ratio, 2), f"{said}, one after the other on every GPU: none waits"))
    elif 1 / BALANCED <= ratio <= BALANCED:
        out.append(Decision("balance", round(ratio, 2), f"{said}: balanced within {BALANCED:g}×"))
    else:
        waiting = "the trainers wait" if ratio > 1 else "the server waits"
        factor = ratio if ratio >= 1 else 1 / ratio
        why = f"{said}: {waiting} ({factor:.1f}×)"
        balanced = [c for c in others if c.balance and 1 / BALANCED <= c.balance <= BALANCED and c.step]
        if balanced:
            c = balanced[0]
            assert c.step is not None
            why += (
                f"; the more balanced {c.label} ({c.balance:.2f}×) predicts {c.step.total_s:.2f} s, "
                f"{(c.step.total_s / best.step.total_s - 1):.0%} slower"
            )
        elif skipped:
            why += f"; the other splits are slower even at their lower bounds (e.g. {skipped[0].label})"
        else:
            why += "; no other split plans"
        out.append(Decision("balance", round(ratio, 2), why))
    return out


def _better_batch(
    search: Search, misses: list[Split], best: Candidate, chosen_split: Split, plan_one: PlanOne
) -> tuple[int, str] | None:
    """A batch near the chosen one that a faster split could take, and what it would gain per prompt."""
    assert best.step is not None
    req = LayoutRequest.from_values(search.recipe.values)
    k = req.group
    chosen = best.step.total_s / best.prompts_per_step
    found: tuple[float, int, Split] | None = None
    for split in misses:
        unit = _unit(split.trainers, req.per_device, k)
        for prompts in {max(unit, unit * math.floor(best.prompts_per_step / unit)),
                        unit * math.ceil(best.prompts_per_step / unit)}:  # fmt: skip
            try:
                bound = best_variant(search, [split], Batch(prompts, k), [])
            except LayoutError:
                continue
            if bound is None or bound[0] / prompts >= chosen * (1 - WORTH_IT):
                continue
            if found is None or bound[0] / prompts < found[0]:
                found = (bound[0] / prompts, prompts, bound[1])
    if found is None:
        return None
    _, prompts, split = found
    try:
        plan = plan_one(search, split, Batch(prompts, k))
    except PlanError:
        return None
    assert plan.estimate is not None
    assert plan.estimate is not None and plan.estimate.step is not None
    per_prompt = plan.estimate.step.total_s / prompts
    # Like for like: the chosen split at that batch too, when it can take it (a larger batch is cheaper per prompt
    # on any split; only what the other split adds counts).
    against, where = chosen, f"the chosen {chosen:.2f} s"
    try:
        same = plan_one(search, chosen_split, Batch(prompts, k))
    except PlanError:
        same = None
    if same is not None and same.estimate is not None:
        against = same.estimate.step.total_s / prompts  # type: ignore[union-attr]  # an estimate of a candidate has its step
        where = f"{against:.2f} s with the chosen split at that batch"
    if per_prompt >= against * (1 - WORTH_IT):
        return None
    return prompts, (
        f"at {best.prompts_per_step:g} prompts per step the {split.trainers} trainers of {split.label} cannot take "
        f"the batch evenly; with launch.prompts_per_step={prompts} it would take {per_prompt:.2f} s per prompt, "
        f"{1 - per_prompt / against:.0%} less than {where} (a different batch: your choice)"
    )


LATENCY_BOUND = 10.0  # generation this many times the training (colocated) suggests a batch too small for the GPUs
LARGER = 4  # … and the batch this many times larger is tried


def _latency_bound(
    search: Search, best: Candidate, split: Split, target: Batch, plan_one: PlanOne
) -> tuple[int, str] | None:
    """Colocated generation many times the training at a small batch is decode latency: every engine runs the
    longest completion's steps whatever its batch, so a larger batch costs little more generation per step. Name
    the batch that would use the GPUs better (the batch is the recipe's algorithm: never changed without the user)."""
    if best.balance is None or best.balance < LATENCY_BOUND or best.mode != VllmMode.COLOCATE or best.step is None:
        return None
    try:
        bigger = plan_one(search, split, target.times(LARGER))
    except PlanError:
        return None
    assert bigger.estimate is not None
    prompts = best.prompts_per_step * LARGER
    now, then = best.step.total_s / best.prompts_per_step, bigger.estimate.step.total_s / prompts  # type: ignore[union-attr]  # an estimate of a candidate has its step
    if then >= now * (1 - WORTH_IT):
        return None
    return int(prompts), (
        f"generation is {best.balance:.0f}× the training at {best.prompts_per_step:g} prompts per step: decode "
        f"latency, not throughput (each engine runs the longest completion's steps whatever its batch); "
        f"launch.prompts_per_step={prompts:g} would take {bigger.estimate.step.total_s:.1f} s per step, "  # type: ignore[union-attr]  # an estimate of a candidate has its step
        f"{1 - then / now:.0%} less per prompt (a different batch: your choice)"
    )


def _unit(trainers: int, per_device: int | None, k: int) -> int:
    """The least prompts per step ``trainers`` can take in whole groups of ``k``."""
    share = trainers * (per_device or 1)
    return share // math.gcd(share, k)


def _batch_fixes(search: Search, misses: list[Split], target: Batch | None) -> list[Fix]:
    """When no split plans: the batches nearest the chosen one that the splits it kept out could take evenly
    (each is planned again before it is shown)."""
    if target is None:
        return []
    req = LayoutRequest.from_values(search.recipe.values)
    k, prompts = target.group, target.prompts
    fixes = []
    for split in misses:
        unit = _unit(split.trainers, req.per_device, k)
        for near in {max(unit, unit * math.floor(prompts / unit)), unit * math.ceil(prompts / unit)}:
            fixes.append(Fix("launch.prompts_per_step", near, f"{split.trainers} trainers of {split.label} take it "
                             "evenly (a different batch)", rank=1, cost=abs(math.log(near / prompts))))  # fmt: skip
    return fixes
