"""One split planned in full (pure): placement, the batch layout (TRL's rules), the training setting, vLLM's
sizing, the estimate and the trainer values, each step in its own module. The split search (:mod:`.search`)
calls it for each split it compares; it calls nothing above it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from grpo_launch.enums import Device, VllmMode
from grpo_launch.errors import PlanError
from grpo_launch.planning import async_grpo, placement, roles
from grpo_launch.planning.async_grpo import async_workload
from grpo_launch.planning.batch_layout import solve_layout
from grpo_launch.planning.dataset_rows import check_rows
from grpo_launch.planning.estimate import Draft, estimate_plan
from grpo_launch.planning.gpu_types import roles_line, serve_topology, train_topology, types_text
from grpo_launch.planning.parallel_and_batch import Batch, Layout
from grpo_launch.planning.plan_types import Plan, Trace, TrainHost, TrainPlan, VllmPlan
from grpo_launch.planning.save_steps import plan_saves
from grpo_launch.planning.search_context import Context
from grpo_launch.planning.splits.allowed import colocate_weights_warning
from grpo_launch.planning.splits.split import Split, SplitKind
from grpo_launch.planning.step_work import off_policy_lag, workload
from grpo_launch.planning.trainer_values import lora_decision, trainer_values
from grpo_launch.planning.training import choose_training
from grpo_launch.planning.vllm_sizing import size_vllm
from grpo_launch.recipe import Recipe, as_planned

DEFAULT_RUN_ROOT = "grpo_runs"


def default_run_dir(recipe: Recipe) -> str:
    return recipe.launch.run_dir or f"{DEFAULT_RUN_ROOT}/{recipe.name}"


def mixed_precision(device: Device, values: Mapping[str, Any]) -> str:
    """accelerate's mixed_precision: fp16 when the recipe asks for it, bf16 unless it turns bf16 off, none on CPU."""
    if device == Device.CPU:
        return "no"
    if values.get("fp16") is True:
        return "fp16"
    return "no" if values.get("bf16") is False else "bf16"


def plan_one(ctx: Context, split: Split | None, batch: Batch | None) -> Plan:
    """Plan one split (None: CPU) at ``batch`` per optimizer step (None: the recipe's own batch)."""
    is_async = split is not None and split.asynchronous
    recipe = async_grpo.async_recipe(ctx.recipe) if is_async else ctx.recipe
    trace = Trace(list(ctx.base.decisions), list(ctx.base.notices), list(ctx.base.warnings))
    if split is None:
        vllm, train_hosts = VllmPlan(VllmMode.OFF), roles.cpu_train_hosts(ctx.topology, recipe, trace)
    else:
        vllm, train_hosts = placement.place(ctx.topology, recipe, ctx.model, split, trace)
        if said := colocate_weights_warning(ctx.topology, recipe, ctx.model, split):
            trace.warn(said)
        if said := roles_line(ctx.topology, vllm, train_hosts):
            trace.decide("gpu_types", split.types or _types_value(ctx, split), said)
            if "; idle: " in said:
                trace.notice(f"mixed GPU types: {said.split('; idle: ')[1]}; they run nothing in this plan")
    n = sum(h.processes for h in train_hosts)
    layout = _layout(ctx, recipe, vllm, n, batch, trace)
    draft = _draft(ctx, recipe, vllm, train_hosts, layout, is_async, trace)
    if not is_async:  # AsyncGRPOTrainer's rollout worker cycles over the rows (``_repeat_iterator``): no sampler
        # After the memory: a per-device batch too large for both is refused with the fixes that fit the GPUs, and
        # those the rows then refuse are dropped when the refusal plans them again.
        check_rows(layout, recipe, draft.rows, ctx.runtime.dataset_rows_source, pinned=batch is not None)
    estimate = estimate_plan(draft)
    vllm, train = draft.vllm, draft.train
    values = trainer_values(recipe, layout, vllm, train, trace, dense=ctx.model is not None and not ctx.model.is_moe)
    values, estimate = plan_saves(recipe, values, estimate, ctx.topology, ctx.model, train, trace)
    settings = None
    if is_async:
        step = estimate.step if estimate else None
        settings = async_grpo.choose_async(
            recipe,
            vllm,
            step,
            layout.completions_per_optimizer_step,
            trace,
            lora_rank=async_grpo.lora_rank(recipe, vllm, trace),
            dtype=values.get("dtype"),
        )
        values = async_grpo.async_trainer_values(values, settings, vllm)
    else:
        lora_decision(recipe, vllm, trace)
    runtime = ctx.runtime
    # A migration's notice says the value the trainer recipe gets, not only the recipe's (dtype under DDP).
    notices = as_planned(recipe, trace.notices, values)
    return Plan(
        recipe=recipe,
        topology=ctx.topology,
        model=ctx.model,
        vllm=vllm,
        train=train,
        layout=layout,
        run_dir=runtime.run_dir or default_run_dir(recipe),
        python=runtime.python,
        vllm_version=runtime.vllm_version,
        runtime=runtime,
        trainer_values=values,
        roles=roles.gpu_roles(ctx.topology, vllm, train_hosts),
        decisions=tuple(trace.decisions),
        notices=(*notices, *runtime.notices),
        warnings=(*trace.warnings, *runtime.warnings),
        estimate=estimate,
        split=split.label if split is not None else "no vLLM (CPU)",
        asynchronous=settings,
    )


def _types_value(ctx: Context, split: Split) -> str:
    """Which GPU types serve and train in a split not made by type (a mixed cluster's other splits)."""
    train = types_text(ctx.topology, split.train_hosts)
    if split.kind == SplitKind.COLOCATE:
        return f"{train} colocate (at the slowest)"
    return f"{types_text(ctx.topology, split.server_hosts)} serves, {train} trains"


def _layout(ctx: Context, recipe: Recipe, vllm: VllmPlan, n: int, batch: Batch | None, trace: Trace) -> Layout:
    """The batch layout of ``n`` trainers (TRL's rules), with the notice when a generation serves more than one
    optimizer step, and colocated vLLM's rule that its TP divides the trainers."""
    colocate_n = ctx.topology.num_gpus if vllm.mode == VllmMode.SERVER else None
    completions = batch.completions if batch else None
    layout, layout_why = solve_layout(n, ctx.request, completions=completions, colocate_n=colocate_n)
    for why in layout_why:
        trace.decide("layout", None, why)
    asked = ctx.request.grad_accum
    if batch is not None and asked is not None and layout.gradient_accumulation_steps != asked:
        # No plan changes a value the recipe set without a notice (DESIGN.md, "The batch rule").
        trace.notice(
            f"gradient_accumulation_steps {asked} (the recipe's) → {layout.gradient_accumulation_steps}: "
            f"launch.prompts_per_step={batch.prompts} pins the global batch ({batch.completions} completions = "
            f"{layout.per_device_train_batch_size} per device × {n} trainers × {layout.gradient_accumulation_steps})"
        )
    if lag := off_policy_lag(layout, int(recipe.values.get("num_iterations") or 1)):
        trace.notice(
            f"off policy: one generation (steps_per_generation={layout.steps_per_generation}) serves more than one "
            f"optimizer step of gradient_accumulation_steps={layout.gradient_accumulation_steps}, so its last "
            f"micro-batches train on completions from a policy up to {lag} step(s) old; set steps_per_generation="
            f"{layout.gradient_accumulation_steps} to stay on policy"
        )
    if vllm.mode == VllmMode.COLOCATE and n % vllm.tensor_parallel_size:
        raise PlanError(
            f"colocated vLLM with tensor_parallel_size={vllm.tensor_parallel_size} needs the "
            f"{n} training processes to be a multiple of it",
            hint=f"Set vllm_tensor_parallel_size to a divisor of {n}.",
        )
    return layout


def _draft(
    ctx: Context,
    recipe: Recipe,
    vllm: VllmPlan,
    hosts: tuple[TrainHost, ...],
    layout: Layout,
    is_async: bool,
    trace: Trace,
) -> Draft:
    """The workload, the training setting and vLLM's sizing of a placed split: everything its estimate prices."""
    topology, model = ctx.topology, ctx.model
    n = sum(h.processes for h in hosts)
    work = workload(recipe, layout, ctx.calibration)
    if is_async:
        work = async_workload(work, recipe)
    # Each side's memory on its own GPUs (a mixed cluster: the trainers' type, the server's type).
    training = choose_training(train_topology(topology, hosts), recipe, model, n, vllm, work, trace, nodes=len(hosts))
    vllm, sizing = size_vllm(serve_topology(topology, vllm, hosts), model, vllm, work, trace, n)
    device = Device.CPU if topology.is_cpu else Device.CUDA
    train = TrainPlan(
        device=device,
        hosts=hosts,
        backend=training.backend,
        offload=training.offload,
        main_process_port=recipe.launch.main_process_port,
        mixed_precision=mixed_precision(device, recipe.values),
        gradient_checkpointing=training.gradient_checkpointing,
    )
    if training.gradient_checkpointing is not None:
        work = dataclasses.replace(work, gradient_checkpointing=training.gradient_checkpointing)
    rows = recipe.launch.dataset_rows or ctx.runtime.dataset_rows
    return Draft(
        topology, recipe, model, vllm, train, layout, work, training, sizing, rows, ctx.runtime.dataset_rows_source
    )
