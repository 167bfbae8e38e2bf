"""make_plan(topology, recipe, model) → Plan. Pure: no torch/trl import, no environment reads, no files.

Every split the recipe allows (:mod:`.split`, :mod:`.placement`) is compared by the split search (:mod:`.search`)
at the same prompts per optimizer step and the same algorithm; each split is planned by the same steps, each in its
own module: placement, layout (TRL's batch rules), training settings, vLLM sizing, the estimate (the cost model,
:mod:`.cost`) and the trainer values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from grpo_launch.enums import Device, VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning import modes, placement, roles
from grpo_launch.planning.async_grpo import async_recipe, async_trainer_values, async_workload, choose_async, lora_rank
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.estimate import estimate_plan, off_policy_lag, size_vllm, workload
from grpo_launch.planning.layout import LayoutRequest, solve_layout
from grpo_launch.planning.lengths import check_positions
from grpo_launch.planning.refusal import verify
from grpo_launch.planning.search import Search, search_splits
from grpo_launch.planning.split import Split, SplitKind, prompts_target
from grpo_launch.planning.trainer_values import trainer_values
from grpo_launch.planning.training import choose_training
from grpo_launch.planning.types import Plan, Runtime, Trace, TrainPlan, VllmPlan
from grpo_launch.planning.values import Batch
from grpo_launch.recipe import Recipe

__all__ = ["DEFAULT_RUN_ROOT", "Plan", "default_run_dir", "make_plan", "plan_split"]

DEFAULT_RUN_ROOT = "grpo_runs"


def default_run_dir(recipe: Recipe) -> str:
    return recipe.launch.run_dir or f"{DEFAULT_RUN_ROOT}/{recipe.name}"


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
        plan = _plan(topology, recipe, model, calibration, runtime)
    except PlanError as exc:
        error = verify.verified(exc, recipe, lambda r: _plan(topology, r, model, calibration, runtime))
        raise verify.with_gpu_count(error, topology, lambda t: _plan(t, recipe, model, calibration, runtime)) from None
    return _with_adapt_notice(plan) if recipe.launch.adapt else plan


def _with_adapt_notice(plan: Plan) -> Plan:
    from grpo_launch.planning.adapt import adapt_notice

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
    search = Search(topology, recipe, model, calibration, runtime, base)
    asynchronous = modes.check_mode(search)  # launch.mode async refuses here what AsyncGRPOTrainer cannot run
    if topology.is_cpu:
        placement.requested_mode(topology, recipe)  # refuses a vLLM mode asked for on CPU
        base.decide("vllm", VllmMode.OFF, "no GPU: generation runs in the trainers with transformers")
        return _plan_one(search, None, None)
    splits = placement.allowed_splits(topology, recipe, model, base)
    if any(s.kind != SplitKind.OFF for s in splits):
        check_positions(recipe, model)  # vLLM generates: its max length must fit the model's positions
    req = LayoutRequest.from_values(recipe.values)
    pinned = recipe.launch.prompts_per_step
    counts = {s.trainers for s in splits}
    target: Batch | None = None
    if pinned is not None or len(counts) > 1:
        prompts, why = prompts_target(req, pinned, counts, topology.num_gpus)
        target = Batch(prompts, req.group)
        base.decide("prompts_per_step", prompts, why)
    if asynchronous:
        return modes.plan_modes(search, splits, target, _plan_one, lambda: _sync(search, splits, target),
                                _default_split, _estimable(topology, model))  # fmt: skip
    return _sync(search, splits, target)


def _sync(search: Search, splits: list[Split], target: Batch | None) -> Plan:
    """The best synchronous plan (TRL's GRPOTrainer) over ``splits``."""
    topology, model, base = search.topology, search.model, search.base
    pinned = search.recipe.launch.prompts_per_step
    req = LayoutRequest.from_values(search.recipe.values)
    if len(splits) == 1 or not _estimable(topology, model):
        split = splits[0] if len(splits) == 1 else _default_split(splits)
        if len(splits) > 1:
            base.decide("split", split.label, "no estimate (model or GPU unknown): the default split")
            target = Batch(pinned, req.group) if pinned else None
        if split.idle:
            base.decide("idle_gpus", split.idle, _only_split_reason(split, model, search.recipe))
        try:
            return _plan_one(search, split, target)
        except PlanError as exc:
            if len(splits) == 1:  # the others were left out for their weights: say which, and why
                exc.explain = (*exc.explain, *placement.unfit_servers(topology, model))
            raise
    return search_splits(search, splits, target, _plan_one)


def _only_split_reason(split: Split, model: ModelShape | None, recipe: Recipe) -> str:
    """Why GPUs idle when the recipe and the model leave one split: the recipe's pins when it has any (else the
    model, which no split that uses every GPU fits)."""
    launch = recipe.launch
    pins = [f"launch.{k}={v}" for k, v in (("vllm", launch.vllm), ("vllm_gpus", launch.vllm_gpus),
            ("vllm_tensor_parallel_size", launch.vllm_tensor_parallel_size)) if v not in (None, "auto")]  # fmt: skip
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


def _estimable(topology: Topology, model: ModelShape | None) -> bool:
    return model is not None and topology.planning_gpu_spec is not None and topology.min_gpu_memory_bytes is not None


# Without an estimate, in this order (then the fewest server GPUs): a server on whole hosts or some GPUs of one,
# colocated engines, a server spread over every host, a shared server (idle GPUs), none.
DEFAULT_ORDER = (
    (SplitKind.SERVER, SplitKind.NODES),
    (SplitKind.COLOCATE,),
    (SplitKind.SPREAD,),
    (SplitKind.SHARED,),
    (SplitKind.OFF,),
)


def _default_split(splits: list[Split]) -> Split:
    """Without an estimate: colocate on one GPU, else the smallest server (one whole host of several)."""
    order = {kind: rank for rank, kinds in enumerate(DEFAULT_ORDER) for kind in kinds}
    gpus = splits[0].gpus
    if gpus == 1:
        order[SplitKind.COLOCATE] = -1
    return min(splits, key=lambda s: (order[s.kind], s.server_gpus, s.tp))


def _refuse_bf16_without_support(topology: Topology, recipe: Recipe) -> None:
    """A V100 or T4 has no bf16 arithmetic: transformers refuses ``bf16=True`` there ("Your setup doesn't support
    bf16/gpu", TrainingArguments.__post_init__), and TRL turns bf16 on unless the recipe sets fp16. Refuse at plan
    time with the fp16 fix instead of at the first trainer's start."""
    spec = topology.planning_gpu_spec
    if spec is None or spec.bf16 or recipe.values.get("use_cpu") is True:
        return
    if _mixed_precision(Device.CUDA, recipe.values) != "bf16":
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
    if recipe.values.get("use_cpu") is True or topology.source == "spec":
        return
    why = "; ".join(topology.warnings) or f"no GPU in the {topology.source} topology"
    raise PlanError(
        f"{model.name} ({model.params / 1e9:.1f}B parameters) would train on CPU: {why}",
        fixes=[
            Fix("gpus", None, _gpus_fix(topology), 0, in_recipe=False),
            Fix("use_cpu", True, "train on CPU anyway (float32, slow)", rank=1),
        ],
    )


def _gpus_fix(topology: Topology) -> str:
    """How to plan for GPUs with the flags the topology came from (--gpus is refused beside them)."""
    if topology.source == "hostfile":
        return f"name the hosts' GPUs in the hostfile: {topology.hosts[0].name} slots=8 gpu=H100-80GB"
    if topology.source == "sbatch":
        return "name the nodes' GPUs: --gpus-per-node 8 --gpu-type H100-80GB"
    return "plan for GPUs: --gpus 8xH100-80GB, or fix the NVIDIA driver / NVML"


def _mixed_precision(device: Device, values: Mapping[str, Any]) -> str:
    """accelerate's mixed_precision: fp16 when the recipe asks for it, bf16 unless it turns bf16 off, none on CPU."""
    if device == Device.CPU:
        return "no"
    if values.get("fp16") is True:
        return "fp16"
    return "no" if values.get("bf16") is False else "bf16"


def plan_split(
    topology: Topology, recipe: Recipe, model: ModelShape | None, split: Split, *, prompts: int | None = None
) -> Plan:
    """One split, planned on its own (what the search compares; benchmarks use it), at ``prompts`` per step when
    given, else at the recipe's own batch for its trainers."""
    k = LayoutRequest.from_values(recipe.values).group
    search = Search(topology, recipe, model, None, Runtime(), Trace(notices=list(recipe.notices)))
    return _plan_one(search, split, Batch(prompts, k) if prompts else None)


def _plan_one(search: Search, split: Split | None, batch: Batch | None) -> Plan:
    """Plan one split (None: CPU) at ``batch`` per optimizer step (None: the recipe's own batch)."""
    topology, recipe, model, runtime = search.topology, search.recipe, search.model, search.runtime
    is_async = split is not None and split.asynchronous
    if is_async:
        recipe = async_recipe(recipe)
    trace = Trace(list(search.base.decisions), list(search.base.notices), list(search.base.warnings))
    values = recipe.values
    if split is None:
        vllm, train_hosts = VllmPlan(VllmMode.OFF), roles.cpu_train_hosts(topology, recipe, trace)
    else:
        vllm, train_hosts = placement.place(topology, recipe, model, split, trace)
    n = sum(h.processes for h in train_hosts)
    colocate_n = topology.num_gpus if vllm.mode == VllmMode.SERVER else None
    completions = batch.completions if batch else None
    layout, layout_why = solve_layout(n, LayoutRequest.from_values(values), completions=completions,
                                      colocate_n=colocate_n)  # fmt: skip
    for why in layout_why:
        trace.decide("layout", None, why)
    if lag := off_policy_lag(layout, int(values.get("num_iterations") or 1)):
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
    work = workload(recipe, layout, search.calibration)
    if is_async:
        work = async_workload(work, recipe)
    training = choose_training(topology, recipe, model, n, vllm, work, trace, nodes=len(train_hosts))
    vllm, sizing = size_vllm(topology, model, vllm, work, trace, n)
    device = Device.CPU if topology.is_cpu else Device.CUDA
    train = TrainPlan(
        device=device,
        hosts=train_hosts,
        backend=training.backend,
        offload=training.offload,
        main_process_port=recipe.launch.main_process_port,
        mixed_precision=_mixed_precision(device, values),
        gradient_checkpointing=training.gradient_checkpointing,
    )
    if training.gradient_checkpointing is not None:
        work = dataclasses.replace(work, gradient_checkpointing=training.gradient_checkpointing)
    rows = recipe.launch.dataset_rows or runtime.dataset_rows
    estimate = estimate_plan(topology, recipe, model, vllm, train, layout, work, training, sizing, rows=rows,
                             rows_why=runtime.dataset_rows_source)  # fmt: skip
    values_out = trainer_values(recipe, layout, vllm, train, trace, dense=model is not None and not model.is_moe)
    settings = None
    if is_async:
        step = estimate.step if estimate else None
        settings = choose_async(recipe, vllm, step, layout.completions_per_optimizer_step, trace,
                                lora_rank=lora_rank(recipe, vllm, trace), dtype=values_out.get("dtype"),
                                trainers=n)  # fmt: skip
        values_out = async_trainer_values(values_out, settings, vllm)
    return Plan(
        recipe=recipe,
        topology=topology,
        model=model,
        vllm=vllm,
        train=train,
        layout=layout,
        run_dir=runtime.run_dir or default_run_dir(recipe),
        python=runtime.python,
        vllm_version=runtime.vllm_version,
        runtime=runtime,
        trainer_values=values_out,
        roles=roles.gpu_roles(topology, vllm, train_hosts),
        decisions=tuple(trace.decisions),
        notices=tuple(trace.notices),
        warnings=(*trace.warnings, *runtime.warnings),
        estimate=estimate,
        split=split.label if split is not None else "no vLLM (CPU)",
        asynchronous=settings,
    )
