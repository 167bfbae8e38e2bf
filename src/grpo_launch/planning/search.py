"""The split search: every split the recipe allows, planned at the batch the batch rule gives it
(:mod:`.splits.batch_target`: a pinned or default batch, the same on every split; or the recipe's own values on
each split's trainers) and the same algorithm (group size, one generation per step); the shortest predicted time
per completion wins (the shortest step when the batches are equal). Pure.

- The TP × DP of one server size (or of colocated engines) is chosen by its generation time alone: training does
  not depend on it.
- Each server size is then planned in full, best lower bound per completion first (its generation and sync, the
  old log-probs, and training at the cheapest setting: DDP without offload); one whose bound cannot beat the best
  plan so far is not planned in full.
- GPUs idle only when every split that uses them is slower, and the plan says by how much.
- When the chosen batch keeps a faster split out (its trainers cannot take the batch evenly), the plan names the
  batch that split could take and what it would gain, as a ``launch.prompts_per_step`` to set: the batch is the
  recipe's algorithm and is never changed without the user.
- Every candidate stays in the plan for ``--explain``, with why it lost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from grpo_launch.enums import VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.batch_advice import batch_fixes, better_batch, latency_bound, least_prompts
from grpo_launch.planning.batch_layout import LayoutError, solve_layout
from grpo_launch.planning.bounds import best_variant, candidate, prompts_of, reason
from grpo_launch.planning.cost.steptime import StepTime
from grpo_launch.planning.parallel_and_batch import Batch
from grpo_launch.planning.plan_types import Candidate, Decision, Plan
from grpo_launch.planning.search_context import Context
from grpo_launch.planning.split_in_full import plan_one
from grpo_launch.planning.splits.batch_target import feasible
from grpo_launch.planning.splits.refusals import unfit_servers
from grpo_launch.planning.splits.split import Split, SplitKind
from grpo_launch.recipe import Recipe

BALANCED = 2.0  # a server split's generation within this factor of its training (either way) counts as balanced


def best_plan(ctx: Context, splits: list[Split], target: Batch | None) -> Plan:
    """The best plan over ``splits``: the search's winner, or without an estimate (or with one split) the default
    split, planned at ``target`` (None: the recipe's own batch)."""
    if len(splits) != 1 and ctx.estimable:
        return search_splits(ctx, splits, target)
    if len(splits) > 1 and target is not None:
        # Without an estimate, the default split among those whose trainers take the batch (a split that cannot
        # take it is never planned at another batch).
        splits = [s for s in splits if feasible(target.completions, s.trainers, ctx.request.per_device)] or splits
    split = splits[0] if len(splits) == 1 else default_split(splits)
    if len(splits) > 1:
        ctx.base.decide("split", split.label, "no estimate (model or GPU unknown): the default split")
    if split.idle:
        ctx.base.decide("idle_gpus", split.idle, _only_split_reason(split, ctx.model, ctx.recipe))
    try:
        plan = plan_one(ctx, split, target)
    except PlanError as exc:
        if len(splits) == 1:  # the others were left out for their weights: say which, and why
            exc.explain = (*exc.explain, *unfit_servers(ctx.topology, ctx.model))
        raise
    if target is None and len({s.trainers for s in splits}) > 1:
        plan = dataclasses.replace(plan, notices=(*plan.notices, _unestimated_batch(ctx, plan, split)))
    return plan


def _unestimated_batch(ctx: Context, plan: Plan, split: Split) -> str:
    """Without an estimate the default split decides the trainers, and with the recipe's own batch values the global
    batch follows them: say so, since a plan that can compare the splits (the GPU model named, or the job inside its
    allocation) may choose other trainers, and with them another global batch, the recipe's values kept."""
    lay = plan.layout
    unknown = "the model's shape" if ctx.model is None else "the GPU model"
    per_trainer = lay.per_device_train_batch_size * lay.gradient_accumulation_steps
    said = (
        f"{unknown} is unknown, so no split is compared: the default one, {split.label}, runs the recipe's batch on "
        f"its {lay.num_processes} trainers ({lay.per_device_train_batch_size} per device × {lay.num_processes} × "
        f"{lay.gradient_accumulation_steps} accumulation = {lay.completions_per_optimizer_step} completions per "
        f"step); the recipe's values are kept on every split, so a split with other trainers runs another global "
        f"batch ({per_trainer} completions per trainer per step)"
    )
    if ctx.topology.planned_again_at_start:
        said += (
            f": the job plans its split on the machines it is given, with these values (to compare the splits here, "
            f"{ctx.topology.naming_gpus})"
        )
    return said


def _only_split_reason(split: Split, model: ModelShape | None, recipe: Recipe) -> str:
    """Why GPUs idle when the recipe and the model leave one split: the recipe's pins when it has any (else the
    model, which no split that uses every GPU fits)."""
    launch = recipe.launch
    pins = [
        f"launch.{k}={v}"
        for k, v in (
            ("vllm", launch.vllm),
            ("vllm_gpus", launch.vllm_gpus),
            ("vllm_tensor_parallel_size", launch.vllm_tensor_parallel_size),
        )
        if v not in (None, "auto")
    ]
    if len(split.train_hosts) > 1 and split.kind == SplitKind.SHARED:
        why = (
            f"{'the recipe pins ' + ', '.join(pins) if pins else 'the only split that fits'}: accelerate runs "
            f"{split.trainers_per_host} trainers on every host, so the {split.server_gpus_per_host} GPU(s) the "
            "server takes on one host stay free on the others"
        )
    else:
        why = f"the only split {'the recipe allows (' + ', '.join(pins) + ')' if pins else 'the model allows'}"
    if pins:
        why += "; unpin them to let the search use every GPU"
    elif model is not None:
        why += f" (vLLM can shard {model.name} over {', '.join(map(str, model.valid_tp_sizes(split.gpus_per_host)))} "
        why += "GPUs of a host; no split that uses every GPU fits its weights)"
    return why


# Without an estimate, in this order (then the fewest server GPUs): a server on whole hosts or some GPUs of one,
# colocated engines, a server spread over every host, a shared server (idle GPUs), none.
DEFAULT_ORDER = (
    (SplitKind.SERVER, SplitKind.NODES),
    (SplitKind.COLOCATE,),
    (SplitKind.SPREAD,),
    (SplitKind.SHARED,),
    (SplitKind.OFF,),
)


def default_split(splits: list[Split]) -> Split:
    """Without an estimate: colocate on one GPU, else the smallest server (one whole host of several)."""
    order = {kind: rank for rank, kinds in enumerate(DEFAULT_ORDER) for kind in kinds}
    gpus = splits[0].gpus
    if gpus == 1:
        order[SplitKind.COLOCATE] = -1
    return min(splits, key=lambda s: (order[s.kind], s.server_gpus, s.tp))


@dataclass(eq=False, repr=False)  # a working record: no generated comparison or repr
class _Tally:
    """What the search has found so far: candidates rejected (in the order met), the layout problems of the server
    sizes no batch layout fits, the sizes whose trainers cannot take the batch evenly, each size's lower bound,
    and the splits planned in full (by label) with their candidates, and those their bound kept out."""

    rejected: list[Candidate] = field(default_factory=list)
    layouts: list[tuple[int, LayoutError]] = field(default_factory=list)  # (trainers, why)
    misses: list[Split] = field(default_factory=list)
    bounded: list[tuple[float, float, Split]] = field(default_factory=list)  # (bound per prompt, bound, split)
    scored: list[tuple[Candidate, Plan]] = field(default_factory=list)
    planned: dict[str, Split] = field(default_factory=dict)
    skipped: list[Candidate] = field(default_factory=list)
    outscored: list[Candidate] = field(default_factory=list)  # TP × DP variants that lost on generation alone
    fixes: list[Fix] = field(default_factory=list)  # the recipe changes the refused splits' own refusals offer


def search_splits(ctx: Context, splits: list[Split], target: Batch | None) -> Plan:
    """The best of ``splits`` at ``target`` per step (None: the recipe's own, one trainer count)."""
    groups: dict[tuple[SplitKind, int, int, str], list[Split]] = {}
    for s in splits:  # one server size's TP × DP variants (on a mixed cluster, of one assignment of types)
        groups.setdefault((s.kind, s.server_gpus, s.trainers, s.types), []).append(s)
    tally = _Tally()
    for variants in groups.values():
        _bound(ctx, variants, target, tally)
    tally.bounded.sort(key=lambda b: b[0])
    for _, bound, split in tally.bounded:
        _plan_in_full(ctx, split, bound, target, tally)
    if not tally.scored and tally.layouts and len(tally.layouts) == len(groups):
        # The recipe's batch fits no split: its layout problem, as the split with the most trainers meets it.
        raise max(tally.layouts, key=lambda lt: lt[0])[1]
    if not tally.scored:
        raise PlanError(
            "no split of the GPUs between vLLM and the trainers plans:",
            problems=[f"{c.label}: {c.rejected}" for c in tally.rejected],
            hint="grpo-launch plan --explain shows each split's arithmetic.",
            # The splits' own fixes too (per_device_train_batch_size for activations that fit no split): the
            # refusal's verification plans each again and shows only those that plan.
            fixes=[*batch_fixes(ctx, tally.misses, target), *_nearest_of_each(tally.fixes)],
        )
    return _chosen(ctx, tally, target)


def _nearest_of_each(fixes: list[Fix]) -> list[Fix]:
    """One fix per change the splits' refusals offer (their values differ with each split's memory budget): the
    nearest to the recipe, as applied it plans on the split that allows it."""
    best: dict[tuple[str, tuple[str, ...]], Fix] = {}
    for f in fixes:
        key = (f.setting, tuple(k for k, _ in f.also))
        if key not in best or f.cost < best[key].cost:
            best[key] = f
    return list(best.values())


def _bound(ctx: Context, variants: list[Split], target: Batch | None, tally: _Tally) -> None:
    """One server size: whether its trainers take the batch evenly, and its best variant's lower bound."""
    if target is not None and not feasible(target.completions, variants[0].trainers, ctx.request.per_device):
        tally.misses.append(variants[0])
    try:
        found = best_variant(ctx, variants, target, tally.rejected, tally.outscored)
    except LayoutError as exc:
        tally.rejected += [candidate(s, None, rejected=reason(exc)) for s in variants]
        tally.layouts.append((variants[0].trainers, exc))
        return
    if found is not None:
        tally.bounded.append((found[0] / _prompts(ctx, found[1], target), *found))


def _prompts(ctx: Context, split: Split, target: Batch | None) -> float:
    """The prompts per step ``split`` is planned at: the target, else the recipe's own values on its trainers
    (a fraction of a group when the recipe's own generation rhythm spans optimizer steps)."""
    if target is not None:
        return target.prompts
    layout, _ = solve_layout(split.trainers, ctx.request)
    return layout.completions_per_optimizer_step / layout.num_generations


def _best_per_prompt(tally: _Tally) -> float | None:
    """The best time per prompt planned so far (per completion, as every candidate has the same group size)."""
    times = [c.per_prompt_s for c, _ in tally.scored if c.per_prompt_s is not None]
    return min(times) if times else None


def _plan_in_full(ctx: Context, split: Split, bound: float, target: Batch | None, tally: _Tally) -> None:
    """Plan ``split`` in full unless its lower bound cannot beat the best plan so far."""
    prompts = _prompts(ctx, split, target)
    best = _best_per_prompt(tally)
    if best is not None and bound / prompts >= best:
        tally.skipped.append(candidate(split, None, bound_s=bound, prompts=prompts))
        return
    try:
        plan = plan_one(ctx, split, target)
    except PlanError as exc:
        tally.rejected.append(candidate(split, None, rejected=reason(exc)))
        tally.fixes += [f for f in exc.fixes if f.in_recipe]  # another split's GPU counts are not this plan's
        return
    assert plan.estimate is not None
    tally.scored.append((candidate(split, plan, prompts=prompts_of(plan)), plan))
    tally.planned[split.label] = split


def _chosen(ctx: Context, tally: _Tally, target: Batch | None) -> Plan:
    """The fastest plan, with why it won, why GPUs idle, the balance, the batches worth naming, and every
    candidate for ``--explain``."""
    # Per completion: a split with fewer trainers may run a smaller batch (the recipe's values kept).
    tally.scored.sort(key=lambda cp: cp[0].per_prompt_s or 0.0)
    best, plan = tally.scored[0]
    others, skipped = [c for c, _ in tally.scored[1:]], tally.skipped
    decisions = [Decision("split", best.label, _why_split(best, others, skipped))]
    decisions += _idle_and_balance(best, others, skipped)
    decisions += _simpler_variant(best, tally.outscored)
    notices: list[str] = []
    chosen_split = tally.planned[best.label]
    if tally.misses:
        better = better_batch(ctx, tally.misses, best, chosen_split)
        if better is not None:
            decisions.append(Decision("prompts_per_step_alternative", better[0], better[1]))
            notices.append(better[1])
    if said := _idle_hosts(ctx, chosen_split, plan, (best, *others), skipped):
        notices.append(said)
    own = target or Batch(round(best.prompts_per_step), ctx.group)  # the recipe's batch on the chosen split
    larger = latency_bound(ctx, best, chosen_split, own) if own.prompts == best.prompts_per_step else None
    if larger is not None:
        decisions.append(Decision("prompts_per_step_larger", larger[0], larger[1]))
        notices.append(larger[1])
    candidates = (dataclasses.replace(best, chosen=True), *others, *skipped, *tally.outscored, *tally.rejected)
    return dataclasses.replace(
        plan, decisions=(*decisions, *plan.decisions), candidates=candidates, notices=(*plan.notices, *notices)
    )


def _simpler_variant(best: Candidate, outscored: list[Candidate]) -> list[Decision]:
    """A Why row when a faster variant of the chosen size lost to it within the model's uncertainty."""
    same = (best.mode, best.server_gpus, best.trainers)
    passed = [c for c in outscored if (c.mode, c.server_gpus, c.trainers) == same and "within" in (c.outscored or "")]
    if not passed:
        return []
    said = "; ".join(f"{c.label}: {c.outscored}" for c in passed)
    return [
        Decision("vLLM engines", best.par.label, f"the fewest GPUs per engine among layouts predicted alike ({said})")
    ]


def _why_split(best: Candidate, others: list[Candidate], skipped: list[Candidate]) -> str:
    assert best.step is not None
    if all(c.prompts_per_step == best.prompts_per_step for c in (*others, *skipped)):
        said = ", ".join(f"{c.label} {c.step.total_s:.2f} s" for c in others[:4] if c.step)
        why = f"shortest predicted step at {best.prompts_per_step:g} prompts per step: {best.label} "
        why += f"{best.step.total_s:.2f} s"
    else:
        # The recipe's batch kept on every split: fewer trainers run fewer prompts per step, so per completion.
        said = ", ".join(
            f"{c.label} {c.step.total_s:.2f} s at {c.prompts_per_step:g} prompts, {_per_completion(c)}"
            for c in others[:4]
            if c.step
        )
        why = (
            f"shortest predicted time per completion (the recipe's batch on each split's trainers: the batches "
            f"differ): {best.label} {best.step.total_s:.2f} s at {best.prompts_per_step:g} prompts per step, "
            f"{_per_completion(best)}"
        )
    if said:
        why += f" (vs {said})"
    if skipped:
        why += f"; {len(skipped)} more split(s) could not beat it even at their lower bound"
    return why


def _per_completion(c: Candidate) -> str:
    return f"{(c.per_prompt_s or 0.0) * 1e3:.1f} ms per prompt"


def _slower(c: Candidate, best: Candidate) -> str:
    """How much slower ``c`` is than ``best`` per prompt (per step when both run the same batch)."""
    return f"{((c.per_prompt_s or 0.0) / (best.per_prompt_s or 1.0) - 1):.0%} slower"


def _idle_hosts(
    ctx: Context, split: Split, plan: Plan, planned: tuple[Candidate, ...], skipped: list[Candidate]
) -> str | None:
    """The notice of a batch too small for every host (:func:`.splits.allowed.fewer_hosts`): which hosts idle, why
    (the trainers it keeps busy, the split that uses every GPU and how much slower it is) and the two ways to use
    them, neither applied: the batch is the user's."""
    if split.kind != SplitKind.COLOCATE or split.types or len(split.train_hosts) == split.hosts:
        return None
    best = planned[0]
    assert best.step is not None
    hosts = ctx.topology.hosts
    idle = [hosts[i].name for i in range(split.hosts) if i not in split.train_hosts]
    layout = plan.layout
    busy = [c for c in planned if not c.idle and c.step]
    bounded = [c for c in skipped if not c.idle]
    if busy:
        c = busy[0]
        assert c.step is not None
        slower = f"faster than every split that uses every GPU ({c.label}: {c.step.total_s:.2f} s, {_slower(c, best)})"
    elif bounded:
        c = bounded[0]
        slower = (
            f"faster than every split that uses every GPU ({c.label}: at least {c.bound_s or 0.0:.2f} s, its "
            "lower bound)"
        )
    else:
        slower = "and no split that uses every GPU plans (the recipe's vLLM settings, or the batch, leave none)"
    every = split.hosts * split.gpus_per_host
    unit = least_prompts(every, ctx.request.per_device, ctx.group)
    prompts = round(best.prompts_per_step)
    return (
        f"{split.idle} GPUs idle ({', '.join(idle)}): {prompts} prompts per step "
        f"({layout.completions_per_optimizer_step} completions, per_device_train_batch_size "
        f"{layout.per_device_train_batch_size}) keep at most {split.trainers} of the {every} GPUs training, and "
        f"colocating on {len(split.train_hosts)} of the {split.hosts} hosts predicts {best.step.total_s:.2f} s per "
        f"step, {slower}; to use them, raise launch.prompts_per_step "
        f"(the batch is yours: {unit * -(-prompts // unit)} is the least that colocating on every host takes "
        f"evenly), or free them: the same plan runs on {len(split.train_hosts)} hosts"
    )


def _generation_phase(step: StepTime) -> str:
    """What the trainers time as generation, by its terms: the estimate's "generation" is vLLM's generating alone, and
    the balance weighs it with the old log-probs and the weight sync (``generation 2.70 s + old log-probs 0.13 s =
    2.83 s``), so the two numbers never share a name."""
    terms = [("generation", step.generation_s), ("old log-probs", step.old_logprobs_s), ("sync", step.sync_s)]
    shown = [f"{name} {s:.2f} s" for name, s in terms if s or name == "generation"]
    return " + ".join(shown) + (f" = {step.trainer_generation_s:.2f} s" if len(shown) > 1 else "")


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
                f"the fastest split that uses every GPU, {c.label}, predicts {c.step.total_s:.2f} s per step at "
                f"{c.prompts_per_step:g} prompts, {_slower(c, best)}"
            )
        elif any(not c.idle for c in skipped):
            c = next(c for c in skipped if not c.idle)
            why = f"every split that uses every GPU is slower: {c.label} cannot beat it even at its lower bound"
        out.append(Decision("idle_gpus", best.idle, why))
    ratio = best.balance
    if ratio is None:
        return out
    said = f"{_generation_phase(best.step)} vs training {best.step.training_s:.2f} s per step"
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
                f"; the more balanced {c.label} ({c.balance:.2f}×) predicts {c.step.total_s:.2f} s, {_slower(c, best)}"
            )
        elif skipped:
            why += f"; the other splits are slower even at their lower bounds (e.g. {skipped[0].label})"
        else:
            why += "; no other split plans"
        out.append(Decision("balance", round(ratio, 2), why))
    return out
