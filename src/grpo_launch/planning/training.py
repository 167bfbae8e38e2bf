"""The training settings (backend, offload, gradient checkpointing): the cheapest whose memory per GPU fits,
from the cost model; else a refusal with the nearest fixes and the arithmetic. Pure."""

from __future__ import annotations

import dataclasses
from typing import NoReturn

from grpo_launch.enums import DistBackend, LaunchMode, Offload, VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import (
    HEADROOM,
    HOST_HEADROOM,
)
from grpo_launch.planning.cost.memory import (
    TrainMemory,
    host_memory_per_node,
    train_memory,
)
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.plan_types import Trace, Training, VllmPlan
from grpo_launch.planning.refusal.explain import Setting, setting_label, training_explain
from grpo_launch.planning.refusal.memory_fixes import memory_fixes
from grpo_launch.recipe import Recipe

# Cheapest first: no offload before offload, ZeRO-2 before ZeRO-3, checkpointing (a third more compute) only when
# needed.
TRAINING_SETTINGS: tuple[Setting, ...] = (
    (DistBackend.DDP, Offload.NONE, False),
    (DistBackend.ZERO2, Offload.NONE, False),
    (DistBackend.DDP, Offload.NONE, True),
    (DistBackend.ZERO2, Offload.NONE, True),
    (DistBackend.ZERO3, Offload.NONE, False),
    (DistBackend.ZERO3, Offload.NONE, True),
    (DistBackend.ZERO2, Offload.OPTIMIZER, True),
    (DistBackend.ZERO3, Offload.OPTIMIZER, True),
    (DistBackend.ZERO3, Offload.OPTIMIZER_PARAMS, True),
)


def choose_training(
    topology: Topology,
    recipe: Recipe,
    model: ModelShape | None,
    n: int,
    vllm: VllmPlan,
    work: Workload,
    trace: Trace,
    *,
    nodes: int = 1,
) -> Training:
    """The cheapest training setting whose memory per GPU fits, and whose offload fits the hosts' RAM when that is
    known (local /proc/meminfo, Slurm's RealMemory); else a PlanError with the nearest fixes."""
    backend, offload = recipe.launch.backend, recipe.launch.offload
    _refuse_fsdp_optimizer_offload(backend, offload)
    if topology.is_cpu:
        if backend == DistBackend.FSDP:
            raise PlanError("FSDP is not supported on CPU here", hint="Use launch.backend=ddp, zero2 or zero3.")
        trace.decide("backend", backend or DistBackend.DDP, "set in the recipe" if backend else "CPU: plain DDP (gloo)")
        return Training(backend or DistBackend.DDP, offload or Offload.NONE, None, None)
    mem = topology.min_gpu_memory_bytes
    if model is None or mem is None:
        why = "set in the recipe" if backend else "model size or GPU memory unknown: ZeRO-2 is a safe default"
        trace.decide("backend", backend or DistBackend.ZERO2, why)
        return Training(backend or DistBackend.ZERO2, offload or Offload.NONE, None, None)
    share = (vllm.gpu_memory_utilization or 0.0) if vllm.mode == VllmMode.COLOCATE else 0.0
    budget = HEADROOM * mem - share * mem
    candidates = _candidates(recipe, n)
    host_ram = topology.min_host_memory_bytes
    host_short: tuple[Setting, float] | None = None
    tried: list[tuple[Setting, TrainMemory, float]] = []
    for setting in candidates:
        b, o, c = setting
        need = train_memory(model, n, b, o, dataclasses.replace(work, gradient_checkpointing=c))
        host = host_memory_per_node(model, max(1, n // nodes), nodes, b, o)
        tried.append((setting, need, host))
        if need.total > budget:
            continue
        if host_ram is not None and host > HOST_HEADROOM * host_ram:
            host_short = host_short or (setting, host)
            continue
        trace.decide("backend", setting_label(setting), _fit_why(recipe, need.total, host, budget, mem, share))
        if host and host_ram is None:
            trace.warn(
                f"{setting_label(setting)} needs {host / GIB:,.0f} GiB of host RAM per node (DeepSpeed's "
                "estimate), and the hosts' RAM is not known here (as with --gpus): check it, or plan on the "
                "hosts themselves (--hostfile, Slurm), where a node with less is refused"
            )
        return Training(b, o, c, need, host)
    explain = training_explain(tried, mem, share, budget, host_ram, n)
    if host_short is not None:
        _refuse_host_ram(model, host_short, host_ram, explain)
    _refuse_gpu_memory(model, n, mem, budget, candidates[-1], work, recipe, explain)


def _refuse_fsdp_optimizer_offload(backend: DistBackend | None, offload: Offload | None) -> None:
    if backend == DistBackend.FSDP and offload == Offload.OPTIMIZER:
        raise PlanError(
            "FSDP offloads parameters and optimizer state together (fsdp_offload_params); it has no "
            "optimizer-only offload",
            fixes=[
                Fix("launch.offload", "optimizer+params", "FSDP's CPU offload", rank=0),
                Fix("launch.backend", "zero2", "ZeRO-2 offloads the optimizer alone", rank=1),
            ],
        )


def _candidates(recipe: Recipe, n: int) -> list[Setting]:
    """The settings the recipe leaves open, cheapest first (one trainer has nothing for ZeRO-2 to shard)."""
    backend, offload = recipe.launch.backend, recipe.launch.offload
    ckpt_set = recipe.get("gradient_checkpointing")
    candidates = [
        (b, o, c)
        for b, o, c in TRAINING_SETTINGS
        if (backend is None or b == backend)
        and (offload is None or o == offload)
        and (ckpt_set is None or c == bool(ckpt_set))
        and not (n == 1 and b == DistBackend.ZERO2 and o == Offload.NONE)
    ]
    if not candidates:  # FSDP, or a combination the table lacks: the recipe's own choice, cheapest first
        b = backend or DistBackend.ZERO3
        offloads = [Offload.NONE, Offload.OPTIMIZER_PARAMS] if offload is None else [offload]
        ckpts = [False, True] if ckpt_set is None else [bool(ckpt_set)]
        candidates = [(b, o, c) for o in offloads for c in ckpts]
    return candidates


def _fit_why(recipe: Recipe, need: float, host: float, budget: float, mem: int, share: float) -> str:
    set_by = [x for x, v in (("backend", recipe.launch.backend), ("offload", recipe.launch.offload)) if v is not None]
    said = f"{', '.join(set_by)} set in the recipe; " if set_by else "cheapest that fits: "
    if recipe.launch.mode == LaunchMode.ASYNC:  # planning.async_grpo.async_recipe set the backend, not the user
        said = "FSDP, AsyncGRPOTrainer's only backend (launch.mode=async)" + (
            "; offload set in the recipe; " if recipe.launch.offload is not None else ", the cheapest that fits: "
        )
    return (
        said + f"{need / GIB:.1f} GiB per training GPU ≤ {budget / GIB:.1f} GiB "
        f"({HEADROOM:.0%} of {mem / GIB:.0f} GiB"
        + (f" minus the colocated vLLM's {share:.0%}" if share else "")
        + ")"
        + (f"; offload needs {host / GIB:.0f} GiB of host RAM per node" if host else "")
    )


def _refuse_host_ram(
    model: ModelShape, short: tuple[Setting, float], host_ram: int | None, explain: list[str]
) -> NoReturn:
    setting, host = short
    raise PlanError(
        f"{model.name} fits the GPUs only with {setting_label(setting)}, and that offload needs "
        f"{host / GIB:.0f} GiB of host RAM per node (DeepSpeed's estimate); the hosts have "
        f"{(host_ram or 0) / GIB:.0f} GiB",
        fixes=[
            Fix("gpus", None, "more nodes: ZeRO-3's offloaded states shard over them", 1, in_recipe=False),
            Fix("use_peft", True, "LoRA: no optimizer state to offload", rank=1),
            Fix("gpus", None, f"hosts with at least {host / HOST_HEADROOM / GIB:.0f} GiB of RAM", 3, in_recipe=False),
        ],
        explain=explain,
    )


def _refuse_gpu_memory(
    model: ModelShape,
    n: int,
    mem: int,
    budget: float,
    last: Setting,
    work: Workload,
    recipe: Recipe,
    explain: list[str],
) -> NoReturn:
    w_last = dataclasses.replace(work, gradient_checkpointing=last[2])
    need = train_memory(model, n, last[0], last[1], w_last)
    cause = ""
    one = train_memory(model, n, last[0], last[1], dataclasses.replace(w_last, per_device=1))
    if work.per_device > 1 and one.total <= budget:  # the per-device batch alone keeps it out: name that key
        cause = (
            f"; per_device_train_batch_size={work.per_device} puts {work.per_device} completions in each forward "
            f"pass ({(need.activations + need.lm_head) / GIB:.1f} GiB of activations; 1 would need "
            f"{one.total / GIB:.1f} GiB)"
        )
    raise PlanError(
        f"{model.name} does not fit on {n} training GPU(s) of {mem / GIB:.0f} GiB: even {setting_label(last)} needs "
        f"{need.total / GIB:.1f} GiB per GPU (budget {budget / GIB:.1f} GiB){cause}",
        fixes=memory_fixes(model, n, mem, budget, last, work, recipe),
        hint="Each fix listed would fit by the estimate (grpo-launch plan --explain).",
        explain=explain,
    )
