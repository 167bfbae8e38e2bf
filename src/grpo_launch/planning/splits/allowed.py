"""The splits the recipe allows (pure): what the recipe asks of vLLM (its mode, its tensor-parallel size, each
refused when it contradicts itself or the topology), and the filter over every split of the topology (:mod:`.split`)
by the recipe's vLLM mode, server size, tensor-parallel size and pipeline stages, and by the
weights-fit rule (:func:`grpo_launch.planning.cost.memory.weights_fit`). Each refusal is built apart, in
:mod:`.refusals`."""

from __future__ import annotations

from grpo_launch.enums import VllmMode
from grpo_launch.errors import PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import VLLM_SERVER_UTILIZATION
from grpo_launch.planning.cost.memory import weights_fit
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.planning.plan_types import Trace
from grpo_launch.planning.splits.batch_target import feasible
from grpo_launch.planning.splits.refusals import (
    check_tp,
    refuse_no_server,
    refuse_server_size,
    refuse_uneven_counts,
    refuse_uneven_mode,
    refuse_unfit,
)
from grpo_launch.planning.splits.split import (
    Split,
    SplitKind,
    enumerate_splits,
    enumerate_type_splits,
    enumerate_uneven_splits,
    off_split,
    server_weights,
)
from grpo_launch.planning.vllm_share import colocate_utilization
from grpo_launch.recipe import Recipe


def requested_mode(topology: Topology, recipe: Recipe) -> VllmMode | None:
    """The vLLM mode the recipe asks for (launch.vllm, TRL's use_vllm / vllm_mode, a server size), or None: the
    split search chooses. On CPU there is no vLLM."""
    wanted = recipe.launch.vllm
    trl_mode = VllmMode(recipe.get("vllm_mode")) if recipe.get("vllm_mode") else None
    if recipe.values.get("use_vllm") is False:
        if wanted not in (None, VllmMode.OFF):
            raise PlanError(
                f"the recipe sets use_vllm: false but launch.vllm={wanted}",
                hint="Remove one of them: use_vllm: true with launch.vllm, or launch.vllm=off.",
            )
        wanted = VllmMode.OFF
    if trl_mode and wanted is None:
        wanted = trl_mode
    elif trl_mode and wanted not in (None, trl_mode):
        raise PlanError(
            f"the recipe sets vllm_mode: {trl_mode} but launch.vllm={wanted}",
            hint="Keep one: grpo-launch writes vllm_mode for the trainer from launch.vllm.",
        )
    if topology.is_cpu:
        if wanted in (VllmMode.SERVER, VllmMode.COLOCATE):
            raise PlanError(
                f"vLLM {wanted} mode needs CUDA GPUs, and this topology has none",
                hint="On CPU, generate with transformers: launch.vllm=off (or use_vllm: false). "
                "To plan for GPUs from here, pass --gpus, e.g. --gpus 4xL20-48GB.",
            )
        return VllmMode.OFF
    launch = recipe.launch
    pp = launch.vllm_pipeline_parallel_size
    if wanted == VllmMode.COLOCATE and pp is not None and pp > 1:
        raise PlanError(
            f"launch.vllm_pipeline_parallel_size={pp} with colocated vLLM: TRL's colocate mode runs tensor "
            "parallelism only",
            hint="Drop launch.vllm_pipeline_parallel_size, or use launch.vllm=server.",
        )
    if wanted is None and (launch.vllm_gpus is not None or launch.vllm_tensor_parallel_size is not None or pp):
        return VllmMode.SERVER  # a server size asks for a server
    return wanted


def requested_tp(recipe: Recipe, mode: VllmMode | None, trace: Trace) -> int | None:
    """The tensor-parallel size the recipe sets (launch.vllm_tensor_parallel_size, or TRL's key)."""
    tp = recipe.launch.vllm_tensor_parallel_size
    if tp is None and recipe.is_set("vllm_tensor_parallel_size"):
        tp = int(recipe.values["vllm_tensor_parallel_size"])
        if mode == VllmMode.SERVER:
            trace.notice(f"vllm_tensor_parallel_size={tp}: used as the vLLM server's --tensor-parallel-size")
    return tp


def allowed_splits(topology: Topology, recipe: Recipe, model: ModelShape | None, trace: Trace) -> list[Split]:
    """The splits the recipe allows on ``topology``, each of whose vLLM weights fit; one PlanError otherwise."""
    mode = requested_mode(topology, recipe)
    uneven = len(set(topology.gpus_per_host)) > 1
    if uneven:
        refuse_uneven_mode(topology, mode)
    if topology.is_cpu or mode == VllmMode.OFF:
        return [off_split(len(topology.hosts), len(topology.hosts[0].gpus))]
    n, g, mem = len(topology.hosts), min(topology.gpus_per_host), topology.min_gpu_memory_bytes
    tp = requested_tp(recipe, mode, trace)
    if tp is not None:
        check_tp(model, tp, g)
    gpus = recipe.launch.vllm_gpus
    refuse_server_size(topology, model, gpus, tp)
    pp = recipe.launch.vllm_pipeline_parallel_size
    every = enumerate_uneven_splits(topology.gpus_per_host, model) if uneven else enumerate_splits(n, g, model, tp)
    if len(topology.gpu_types) > 1:
        every = _by_type(topology, model, every)
    if uneven and not every:
        refuse_uneven_counts(topology)
    splits = [s for s in every if (tp is None or s.tp == tp) and s.pp == (pp or s.pp)]
    # Only `vllm serve` runs the other hosts' engines headless (vllm/entrypoints/cli/serve.py); the API server module
    # alone would start them as API servers, which TRL's weight sync cannot reach.
    headless = recipe.launch.vllm_command[-1] == "serve" or not any(len(s.server_hosts) > 1 for s in splits)
    if not headless:
        splits = [s for s in splits if len(s.server_hosts) <= 1]
        trace.notice(
            "launch.vllm_command does not end in `serve`: a vLLM server over several hosts (which needs `vllm "
            "serve --headless` on the others) is not considered"
        )
    colocated = [s for s in splits if s.kind == SplitKind.COLOCATE]
    served = [s for s in splits if s.kind != SplitKind.COLOCATE and (gpus is None or s.server_gpus == gpus)]
    if mode != VllmMode.COLOCATE and gpus is None and tp is None and n * g == 1:
        served = []  # one GPU: nothing left to train beside a server
    fitting = _fitting_servers(served, model, mem, pp, topology)
    if mode == VllmMode.SERVER:
        if not fitting:
            refuse_no_server(topology, model, served, gpus, pp, headless)
        return fitting
    if mode == VllmMode.COLOCATE or gpus is None:
        colocated = _fitting_colocate(colocated, recipe, model, mem, topology)
    if mode == VllmMode.COLOCATE:
        return colocated
    if not fitting and not colocated and model is not None and mem is not None:
        refuse_unfit(topology, model, served)
    return colocated + fitting


def fewer_hosts(topology: Topology, splits: list[Split], completions: int, per_device: int | None) -> list[Split]:
    """Colocated engines on fewer whole hosts, for a fixed batch (pinned or default: decided before, never by the
    splits compared) of ``completions`` per step that colocating on every host cannot take evenly (more trainers than
    it has completions per ``per_device`` batch, or trainers that do not divide it): on the most hosts whose trainers
    do take it, the others idle. Each TP of the allowed colocated splits (their weights fit: one GPU type, so the
    same fit). The search compares them at the same batch beside the splits that use every GPU, and picks one only
    where it predicts a shorter step (it then says which GPUs idle, and why). One GPU type and count on every host
    (a mixed cluster has its own: one type alone)."""
    every = [s for s in splits if s.kind == SplitKind.COLOCATE and not s.types and len(s.train_hosts) == s.hosts]
    n = len(topology.hosts)
    if not every or n < 2 or len(set(topology.gpus_per_host)) > 1 or len(topology.gpu_types) > 1:
        return []
    if any(feasible(completions, s.trainers, per_device) for s in every):
        return []
    g = every[0].gpus_per_host
    m = next((m for m in range(n - 1, 0, -1) if feasible(completions, m * g, per_device)), None)
    if m is None:
        return []
    return [
        Split(SplitKind.COLOCATE, n, g, g, tuple(range(m)), Parallelism(s.tp, dp=m * g // s.tp))
        for s in every
        if (m * g) % s.tp == 0
    ]


def _by_type(topology: Topology, model: ModelShape | None, every: list[Split]) -> list[Split]:
    """A mixed cluster: the splits by GPU type (one type serves, another trains; one type alone), and of the
    others colocating on every GPU (priced at the slowest type) and those whose trainers are all of one type."""
    types = [h.gpus[0].name if h.gpus and len({g.name for g in h.gpus}) == 1 else "mixed" for h in topology.hosts]
    if "mixed" in types:  # a host of several GPU types: priced at the slowest, as before
        return every

    def one_type(s: Split) -> bool:
        return s.kind == SplitKind.COLOCATE or len({types[i] for i in s.train_hosts}) == 1

    by_type = enumerate_type_splits(topology.gpus_per_host, types, model)

    def where(s: Split) -> tuple[object, ...]:
        return (s.kind, s.train_hosts, s.server_hosts, s.server_gpus_per_host, s.par)

    named = {where(s) for s in by_type}  # the same split under its type's name ("H20 serves, H100 trains")
    return [s for s in every if one_type(s) and where(s) not in named] + by_type


def _memory_of(topology: Topology | None, hosts: tuple[int, ...], mem: int | None) -> int | None:
    """The smallest GPU memory of the hosts at ``hosts`` (a mixed cluster: each role's own), else ``mem``."""
    if topology is None or len(topology.gpu_types) < 2 or not hosts:
        return mem
    return topology.only([topology.hosts[i].name for i in hosts]).min_gpu_memory_bytes or mem


def _fitting_servers(
    served: list[Split], model: ModelShape | None, mem: int | None, pp: int | None, topology: Topology | None = None
) -> list[Split]:
    """The servers whose weights fit (on a mixed cluster, in their own hosts' memory); a pipeline only where no
    server of TP alone fits that size (unless the recipe sets the stages): within a host TP reads the weights faster,
    and each stage adds a hop (over the network between hosts)."""
    fitting = [s for s in served if weights_fit(server_weights(model, s), _memory_of(topology, s.server_hosts, mem))]
    tp_only = {(s.kind, s.server_gpus) for s in fitting if s.pp == 1}
    return [s for s in fitting if s.pp == 1 or pp or (s.kind, s.server_gpus) not in tp_only]


def _fitting_colocate(
    splits: list[Split], recipe: Recipe, model: ModelShape | None, mem: int | None, topology: Topology | None = None
) -> list[Split]:
    """Colocated engines whose weights take at most the allowed share of their vLLM share of a GPU (on a mixed
    cluster, of their own hosts' GPUs); when none does, the largest TP (:func:`colocate_weights_warning` then warns,
    if that split is the one chosen)."""
    util = colocate_utilization(recipe)

    def fits_on(s: Split) -> bool:
        own = _memory_of(topology, s.train_hosts, mem)
        return model is None or not own or weights_fit(model.weight_bytes_bf16 / s.tp, own, util)

    fits = [s for s in splits if fits_on(s)]
    if fits or not splits:
        return fits
    last = splits[-1]
    if model is not None and mem is not None and model.weight_bytes_bf16 / last.tp >= VLLM_SERVER_UTILIZATION * mem:
        return []  # not even the weights fit a GPU, whatever its share
    return [last]


def colocate_weights_warning(topology: Topology, recipe: Recipe, model: ModelShape | None, split: Split) -> str | None:
    """The warning a colocated split whose weights take over the allowed share of vLLM's GPU share carries: said
    only by the plan that chose it, never by a server plan that beat it."""
    util, mem = colocate_utilization(recipe), topology.min_gpu_memory_bytes
    if split.kind != SplitKind.COLOCATE or model is None or not mem:
        return None
    if weights_fit(model.weight_bytes_bf16 / split.tp, mem, util):
        return None
    return (
        f"colocated vLLM: {model.weight_bytes_bf16 / split.tp / GIB:.1f} GiB of weights per GPU at TP {split.tp} is "
        f"over half of the {util:.0%} vLLM share ({util * mem / GIB:.1f} GiB): expect a small KV cache"
    )
