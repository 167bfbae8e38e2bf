"""The planner: :func:`make_plan` (the planning stage's face, with ``grpo_launch.planning``) and the one planning
pass it repeats, :func:`plan_once`. Pure: no torch/trl import, no environment reads, no files.

One pass plans a recipe on a topology, or raises :class:`PlanError` naming the problem: first the refusals a recipe
meets before any split (no bf16 on the GPU, a GPU-sized model on CPU), then :mod:`.modes` (launch.mode, sync and async
side by side) → :mod:`.search` (the split search) → :mod:`.split_in_full` (one split in full: placement, layout (TRL's
batch rules), training settings, vLLM sizing, the estimate (the cost model, :mod:`.cost`) and the trainer values).
What every split shares is computed once, in a :class:`~grpo_launch.planning.search_context.Context`. When the pass
refuses, :func:`make_plan` plans every fix the refusal offers again with the same pass before it is shown
(:mod:`.refusal.verify`), and a refusal for want of GPUs says how many would do.
"""

from __future__ import annotations

import dataclasses

from grpo_launch.enums import Device, LaunchMode, VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning import modes
from grpo_launch.planning.adapt_terms import adapt_notice
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.exposure import public_address_notice
from grpo_launch.planning.lengths import check_positions
from grpo_launch.planning.parallel_and_batch import Batch
from grpo_launch.planning.plan_types import Plan, Runtime, Trace
from grpo_launch.planning.refusal import verify
from grpo_launch.planning.search import best_plan
from grpo_launch.planning.search_context import Context
from grpo_launch.planning.split_in_full import DEFAULT_RUN_ROOT, default_run_dir, mixed_precision, plan_one
from grpo_launch.planning.splits.allowed import allowed_splits, fewer_hosts, requested_mode
from grpo_launch.planning.splits.batch_target import planned_batch, sets_its_batch
from grpo_launch.planning.splits.split import Split, SplitKind
from grpo_launch.recipe import Recipe

__all__ = ["CPU_MODEL_LIMIT", "DEFAULT_RUN_ROOT", "Plan", "default_run_dir", "make_plan", "plan_once", "plan_split"]


def make_plan(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None = None,
    *,
    runtime: Runtime | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """Plan a GRPO run of ``recipe`` on ``topology``. Raises :class:`PlanError` listing every problem.

    ``runtime`` holds what the plan needs of where it runs (run directory, Python, vLLM version, dataset rows);
    ``calibration`` scales the estimates by a previous run's measurements (``plan --calibrate-from``).
    """
    runtime = runtime or Runtime()
    try:
        return plan_once(topology, recipe, model, calibration, runtime)
    except PlanError as exc:
        error = verify.verified(exc, recipe, lambda r: plan_once(topology, r, model, calibration, runtime))
        raise verify.with_gpu_count(
            error, topology, lambda t: plan_once(t, recipe, model, calibration, runtime)
        ) from None


def plan_once(
    topology: Topology, recipe: Recipe, model: ModelShape | None, calibration: Calibration | None, runtime: Runtime
) -> Plan:
    """Plan ``recipe`` on ``topology`` once (raises :class:`PlanError` naming the problem), with launch.adapt's
    notice when the recipe asks for it."""
    plan = _with_exposure_notice(_plan(topology, recipe, model, calibration, runtime))
    return _with_adapt_notice(plan) if recipe.launch.adapt else plan


def _with_exposure_notice(plan: Plan) -> Plan:
    notice = public_address_notice(plan)
    return dataclasses.replace(plan, notices=(*plan.notices, notice)) if notice else plan


def _with_adapt_notice(plan: Plan) -> Plan:
    return dataclasses.replace(plan, notices=(*plan.notices, adapt_notice(plan)))


def _plan(
    topology: Topology, recipe: Recipe, model: ModelShape | None, calibration: Calibration | None, runtime: Runtime
) -> Plan:
    base = Trace(notices=list(recipe.notices), warnings=[*recipe.warnings, *topology.warnings])
    if recipe.values.get("use_cpu") is True and not topology.is_cpu:
        topology = dataclasses.replace(topology, hosts=tuple(dataclasses.replace(h, gpus=()) for h in topology.hosts))
        base.decide("device", Device.CPU, "use_cpu: true in the recipe: the GPUs are left unused")
    if recipe.launch.num_processes and not topology.is_cpu:
        base.notice(
            f"launch.num_processes={recipe.launch.num_processes} is ignored: it sets the processes of a CPU run; on "
            "GPUs every training GPU runs one trainer process (launch.vllm_gpus sets how many GPUs serve vLLM)"
        )
    _refuse_silent_cpu_fallback(topology, recipe, model)
    _refuse_bf16_without_support(topology, recipe)
    ctx = Context.of(topology, recipe, model, calibration, runtime, base)
    asynchronous = False
    if recipe.launch.mode is not LaunchMode.SYNC:
        asynchronous = modes.check_mode(ctx)  # launch.mode async refuses here what AsyncGRPOTrainer cannot run
    if topology.is_cpu:
        requested_mode(topology, recipe)  # refuses a vLLM mode asked for on CPU
        base.decide("vllm", VllmMode.OFF, "no GPU: generation runs in the trainers with transformers")
        pinned = recipe.launch.prompts_per_step  # the batch rule holds on CPU too: a pinned batch, or the recipe's
        return plan_one(ctx, None, Batch(pinned, ctx.group) if pinned else None)
    splits = allowed_splits(topology, recipe, model, base)
    if any(s.kind != SplitKind.OFF for s in splits):
        check_positions(recipe, model)  # vLLM generates: its max length must fit the model's positions
    target = _batch(ctx, splits)
    if target is not None and ctx.estimable:
        # After the batch (it never depends on the splits compared): the hosts a fixed batch can use, when it cannot
        # use every host's trainers; picked only where predicted faster, and said so.
        splits = [*splits, *fewer_hosts(topology, splits, target.completions, ctx.request.per_device)]
    if asynchronous:
        return modes.plan_modes(ctx, splits, target)
    return best_plan(ctx, splits, target)


def _batch(ctx: Context, splits: list[Split]) -> Batch | None:
    """The batch every split is planned at (None: the recipe's own values on each split), with why
    (:mod:`.splits.batch_target`: the batch is the user's algorithm)."""
    counts = {s.trainers for s in splits}
    gpus, served = ctx.topology.num_gpus, ctx.recipe.launch.vllm_gpus
    if ctx.recipe.launch.prompts_per_step is not None and ctx.request.generation_batch_size is not None:
        raise PlanError(
            "launch.prompts_per_step and generation_batch_size both pin the batch",
            fixes=[
                Fix("generation_batch_size", None, "keep launch.prompts_per_step (one generation per step)"),
                Fix("launch.prompts_per_step", None, "keep the recipe's generation_batch_size", rank=1),
            ],
        )
    # Every GPU a trainer, less the server GPUs the recipe pins (or the one trainer count the recipe and the model
    # leave): the recipe and the topology decide it, never the splits compared.
    trainers = counts.pop() if len(counts) == 1 else gpus - served if served and served < gpus else gpus
    planned = planned_batch(ctx.request, ctx.recipe.launch.prompts_per_step, trainers, gpus)
    if planned is None:
        key = sets_its_batch(ctx.request)
        ctx.base.decide(
            "prompts_per_step",
            None,
            f"the recipe sets its batch ({key}): every split keeps the recipe's "
            "values and runs TRL's per_device × its trainers × accumulation, so a split with fewer "
            "trainers runs a smaller batch; the splits are compared per completion",
        )
        return None
    prompts, why = planned
    ctx.base.decide("prompts_per_step", prompts, why)
    return Batch(prompts, ctx.group)


def _refuse_bf16_without_support(topology: Topology, recipe: Recipe) -> None:
    """A V100 or T4 has no bf16 arithmetic: transformers refuses ``bf16=True`` there ("Your setup doesn't support
    bf16/gpu", TrainingArguments.__post_init__), and TRL turns bf16 on unless the recipe sets fp16. Refuse at plan
    time with the fp16 fix instead of at the first trainer's start."""
    spec = topology.planning_gpu_spec
    if spec is None or spec.bf16 or recipe.values.get("use_cpu") is True:
        return
    if mixed_precision(Device.CUDA, recipe.values) != "bf16":
        return
    raise PlanError(
        f"{spec.name} GPUs have no bf16 arithmetic, and the recipe trains in bf16"
        + ("" if "bf16" in recipe.values else " (TRL's default)"),
        fixes=[Fix("bf16", False, "train in fp16 mixed precision (loss scaling)", also=(("fp16", True),))],
    )


# A model this large trains at a few tokens per second on CPU, in float32: planned there only when asked for.
CPU_MODEL_LIMIT = 1e9


def _refuse_silent_cpu_fallback(topology: Topology, recipe: Recipe, model: ModelShape | None) -> None:
    """No GPU was found (no driver, NVML failing, CPU-only hosts), and the recipe names a GPU-sized model: say so
    instead of quietly planning a float32 CPU run. ``use_cpu: true`` or ``--gpus cpu`` ask for CPU."""
    if not topology.is_cpu or model is None or model.params < CPU_MODEL_LIMIT:
        return
    if recipe.values.get("use_cpu") is True or topology.named_by_user:
        return
    why = "; ".join(topology.warnings) or f"no GPU in the {topology.source} topology"
    raise PlanError(
        f"{model.name} ({model.params / 1e9:.1f}B parameters) would train on CPU: {why}",
        fixes=[
            Fix("gpus", None, topology.naming_gpus, 0, in_recipe=False),
            Fix("use_cpu", True, "train on CPU anyway (float32, slow)", rank=1),
        ],
    )


def plan_split(
    topology: Topology, recipe: Recipe, model: ModelShape | None, split: Split, *, prompts: int | None = None
) -> Plan:
    """One split, planned on its own (what the search compares; benchmarks use it), at ``prompts`` per step when
    given, else at the recipe's own batch for its trainers."""
    ctx = Context.of(topology, recipe, model, None, Runtime(), Trace(notices=list(recipe.notices)))
    return plan_one(ctx, split, Batch(prompts, ctx.group) if prompts else None)
