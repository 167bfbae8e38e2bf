"""make_plan(topology, recipe, model) → Plan. Pure: no torch/trl import, no environment reads, no files.

The steps, each in its own module: placement (vLLM mode, server TP and GPUs, which GPUs train), layout (TRL's
batch rules), resources (backend, offload, checkpointing, vLLM sizing, the estimate) and the trainer values; the
cost model holds every memory and time term. When the GPU split is free, every split is planned as a Candidate and
the shortest predicted time per prompt group wins; the candidates stay in the plan for ``--explain``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from grpo_launch.enums import Device, VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.gpus import find_gpu_spec
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning import placement
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.planning.estimate import estimate_plan, size_vllm, workload
from grpo_launch.planning.layout import LayoutRequest, solve_layout
from grpo_launch.planning.refusal import verify
from grpo_launch.planning.trainer_values import trainer_values
from grpo_launch.planning.training import choose_training
from grpo_launch.planning.types import Candidate, Decision, Plan, Runtime, Trace, TrainPlan, VllmPlan
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
        return _plan(topology, recipe, model, calibration, runtime)
    except PlanError as exc:
        raise verify.verified(exc, recipe, lambda r: _plan(topology, r, model, calibration, runtime)) from None


def _plan(
    topology: Topology, recipe: Recipe, model: ModelShape | None, calibration: Calibration | None, runtime: Runtime
) -> Plan:
    rejected: list[Candidate] = []
    free = _split_is_free(topology, recipe, model)
    plan = _search(topology, recipe, model, calibration, runtime, rejected) if free else None
    if plan is not None:
        return plan
    try:
        return _plan_one(topology, recipe, model, None, calibration, runtime)
    except PlanError as exc:
        if rejected:  # every split the search tried was refused: say why, for --explain
            exc.explain = (*exc.explain, *(f"split {c.label}: {c.rejected}" for c in rejected))
        raise


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
            Fix("gpus", None, "plan for GPUs: --gpus 8xH100-80GB, or fix the NVIDIA driver / NVML", 0, in_recipe=False),
            Fix("use_cpu", True, "train on CPU anyway (float32, slow)", rank=1),
        ],
    )


def _mixed_precision(device: Device, values: Mapping[str, Any]) -> str:
    """accelerate's mixed_precision: fp16 when the recipe asks for it, bf16 unless it turns bf16 off, none on CPU."""
    if device == Device.CPU:
        return "no"
    if values.get("fp16") is True:
        return "fp16"
    return "no" if values.get("bf16") is False else "bf16"


def plan_split(topology: Topology, recipe: Recipe, model: ModelShape | None, mode: VllmMode, tp: int) -> Plan:
    """One split candidate of the search, planned on its own (what the search compares; benchmarks use it)."""
    return _plan_one(topology, recipe, model, (VllmMode(mode), tp), None, Runtime())


def _split_is_free(topology: Topology, recipe: Recipe, model: ModelShape | None) -> bool:
    launch = recipe.launch
    return (
        len(topology.hosts) == 1
        and not topology.is_cpu
        and topology.num_gpus > 1
        and model is not None
        and find_gpu_spec(topology.planning_gpu_name) is not None
        and topology.min_gpu_memory_bytes is not None
        and placement.auto_mode(recipe)
        and launch.vllm_gpus is None
        and launch.vllm_tensor_parallel_size is None
        and not recipe.is_set("vllm_tensor_parallel_size")
    )


def _search(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    calibration: Calibration | None,
    runtime: Runtime,
    rejected: list[Candidate],
) -> Plan | None:
    """Plan colocate and every server size (TP 1, 2, 4, …); the shortest predicted time per prompt group wins.
    None when no candidate plans with an estimate (the caller then plans without the search, for its error);
    ``rejected`` receives the refused candidates."""
    assert model is not None
    choices = [(VllmMode.COLOCATE, 1), *((VllmMode.SERVER, t) for t in model.valid_tp_sizes(topology.num_gpus - 1))]
    scored: list[tuple[Candidate, Plan]] = []
    for mode, tp in choices:
        label = f"server TP {tp}" if mode == VllmMode.SERVER else "colocate"
        try:
            plan = _plan_one(topology, recipe, model, (mode, tp), calibration, runtime)
        except PlanError as exc:
            rejected.append(
                Candidate(
                    label,
                    mode,
                    tp,
                    rejected=": ".join([exc.message.rstrip(":"), "; ".join(exc.problems)])
                    if exc.problems
                    else exc.message,
                )
            )
            continue
        if plan.estimate is None:
            return None
        # Splits give different optimizer steps (more trainers, more completions per step): compare per prompt.
        prompts = plan.layout.completions_per_optimizer_step / plan.layout.num_generations
        v = plan.vllm
        if v.data_parallel_size > 1:  # a MoE server: its GPUs as TP × DP ranks
            label = f"server {len(v.gpus)} GPUs (TP {v.tensor_parallel_size} × DP {v.data_parallel_size})"
        scored.append((Candidate(label, mode, tp, step=plan.estimate.step, prompts_per_step=prompts), plan))
    if not scored:
        return None
    scored.sort(key=lambda cp: cp[0].per_prompt_s or 0.0)
    best, plan = scored[0]
    others = ", ".join(f"{c.label} {c.per_prompt_s:.2f} s" for c, _ in scored[1:])
    why = f"shortest predicted time per prompt group: {best.label} {best.per_prompt_s:.2f} s" + (
        f" (vs {others})" if others else ""
    )
    candidates = (dataclasses.replace(best, chosen=True), *(c for c, _ in scored[1:]), *rejected)
    return dataclasses.replace(
        plan, decisions=(Decision("split", best.label, why), *plan.decisions), candidates=candidates
    )


def _plan_one(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    forced: tuple[VllmMode, int] | None,
    calibration: Calibration | None,
    runtime: Runtime,
) -> Plan:
    trace = Trace(notices=list(recipe.notices), warnings=list(topology.warnings))
    values = recipe.values
    if values.get("use_cpu") is True and not topology.is_cpu:
        topology = dataclasses.replace(topology, hosts=tuple(dataclasses.replace(h, gpus=()) for h in topology.hosts))
        trace.decide("device", Device.CPU, "use_cpu: true in the recipe: the GPUs are left unused")
    _refuse_silent_cpu_fallback(topology, recipe, model)
    mode = forced[0] if forced else placement.choose_mode(topology, recipe, trace)
    vllm = None
    if topology.is_cpu:
        vllm, train_hosts = VllmPlan(VllmMode.OFF), placement.cpu_train_hosts(topology, recipe, trace)
    else:
        if len(set(topology.gpus_per_host)) > 1:
            raise PlanError(
                "hosts have different GPU counts: " + ", ".join(f"{h.name}={len(h.gpus)}" for h in topology.hosts),
                hint="accelerate runs the same number of processes on every machine: give every host the same "
                "number of GPUs (hostfile slots / --gpus-per-node).",
            )
        if mode == VllmMode.SERVER:
            try:
                vllm, train_hosts = placement.plan_server(
                    topology, recipe, model, trace, forced_tp=forced[1] if forced else None
                )
            except placement.NoGpuLeftForTraining as exc:
                if forced or not placement.auto_mode(recipe):
                    raise
                trace.decide("vllm", VllmMode.COLOCATE, f"a server would not leave a GPU to train: {exc.message}")
                mode = VllmMode.COLOCATE
        if vllm is None:
            train_hosts = placement.whole_gpu_train_hosts(topology)
            vllm = (
                placement.plan_colocate(topology, recipe, model, train_hosts, trace)
                if mode == VllmMode.COLOCATE
                else VllmPlan(VllmMode.OFF)
            )

    n = sum(h.processes for h in train_hosts)
    colocate_n = topology.num_gpus if mode == VllmMode.SERVER else None
    layout, layout_why = solve_layout(n, LayoutRequest.from_values(values), colocate_n=colocate_n)
    for why in layout_why:
        trace.decide("layout", None, why)
    if vllm.mode == VllmMode.COLOCATE and n % vllm.tensor_parallel_size:
        raise PlanError(
            f"colocated vLLM with tensor_parallel_size={vllm.tensor_parallel_size} needs the "
            f"{n} training processes to be a multiple of it",
            hint=f"Set vllm_tensor_parallel_size to a divisor of {n}.",
        )

    work = workload(recipe, layout, calibration)
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
    estimate = estimate_plan(topology, recipe, model, vllm, train, layout, work, training, sizing, rows=rows)
    values_out = trainer_values(recipe, layout, vllm, train, trace, dense=model is not None and not model.is_moe)
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
        roles=placement.gpu_roles(topology, vllm, train_hosts),
        decisions=tuple(trace.decisions),
        notices=tuple(trace.notices),
        warnings=(*trace.warnings, *runtime.warnings),
        estimate=estimate,
    )
