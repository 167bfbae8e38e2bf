"""Placement: which splits the recipe allows (its vLLM mode, server GPUs and tensor-parallel size, and what fits),
and a split turned into the vLLM plan and the training hosts. Pure; every choice goes into the Trace."""

from __future__ import annotations

from grpo_launch.enums import VllmMode
from grpo_launch.errors import Fix, PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.constants import TRL_COLOCATE_UTILIZATION, VLLM_SERVER_UTILIZATION, VLLM_WEIGHTS_SHARE
from grpo_launch.planning.lengths import max_model_len, prompt_bound
from grpo_launch.planning.split import (
    Split,
    SplitKind,
    enumerate_splits,
    enumerate_uneven_splits,
    off_split,
    refuse_uneven_counts,
    refuse_uneven_mode,
)
from grpo_launch.planning.types import ServerNode, Trace, TrainHost, VllmPlan
from grpo_launch.recipe import Recipe


class NoGpuLeftForTraining(PlanError):
    """The vLLM server the recipe asks for would take every GPU."""


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


def server_weights(model: ModelShape | None, split: Split) -> float:
    """bf16 weight bytes on each server GPU (experts spread over every GPU of a mixture of experts with DP)."""
    if model is None:
        return 0.0
    return model.weight_bytes_per_gpu(split.tp, split.dp, ep=model.is_moe and split.dp > 1, pp=split.pp)


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
        _check_tp(model, tp, g)
    gpus = recipe.launch.vllm_gpus
    if gpus is not None and tp is not None and gpus % tp:
        raise PlanError(
            f"launch.vllm_gpus={gpus} is not a multiple of the tensor-parallel size {tp}",
            hint="A server of TP × DP GPUs: set launch.vllm_gpus to a multiple of the TP size, or leave one unset.",
        )
    if gpus is not None and n == 1 and gpus >= g:
        _refuse_no_trainer(model, gpus, g, mem)
    total = sum(topology.gpus_per_host)
    if gpus is not None and gpus >= total:
        raise PlanError(
            f"launch.vllm_gpus={gpus}: the {n} hosts have {total} GPUs in all "
            f"({' + '.join(map(str, topology.gpus_per_host))}), leaving none to train",
            hint=f"Set launch.vllm_gpus below {total} (or leave it unset to choose), or use more hosts.",
        )
    pp = recipe.launch.vllm_pipeline_parallel_size
    every = enumerate_uneven_splits(topology.gpus_per_host, model) if uneven else enumerate_splits(n, g, model, tp)
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
    fitting = [s for s in served if mem is None or server_weights(model, s) <= VLLM_WEIGHTS_SHARE * mem]
    # A pipeline only where no server of TP alone fits that size: within a host TP reads the weights faster, and
    # each stage adds a hop (over the network between hosts).
    tp_only = {(s.kind, s.server_gpus) for s in fitting if s.pp == 1}
    fitting = [s for s in fitting if s.pp == 1 or pp or (s.kind, s.server_gpus) not in tp_only]
    if mode == VllmMode.SERVER:
        if not served and pp:
            raise PlanError(
                f"no vLLM server of {pp} pipeline stages fits {n} host(s) of {g} GPUs"
                + (f" as {gpus} GPU(s)" if gpus else ""),
                hint="Each replica is TP × PP GPUs, within a host or over whole hosts, and leaves GPUs to train: "
                "change launch.vllm_pipeline_parallel_size (or launch.vllm_gpus), or leave it unset to choose.",
            )
        if not served and n * g == 1:
            raise PlanError(
                "launch.vllm=server on a single GPU: the server would take it, leaving none to train",
                hint="Use launch.vllm=colocate (vLLM shares the GPU with the trainer), or more GPUs.",
            )
        if not served:
            raise PlanError(
                f"no vLLM server{f' of {gpus} GPU(s) (launch.vllm_gpus)' if gpus else ''} leaves whole hosts or equal "
                f"trainers on {n} host(s) of {' + '.join(map(str, topology.gpus_per_host)) if uneven else g} GPUs"
                + ("" if headless else " with a launch.vllm_command that does not end in `serve`"),
                hint="On several hosts the server takes whole hosts (launch.vllm_gpus a multiple of the GPUs per "
                "host, fewer than all of them), the same number of GPUs on every host (a multiple of the hosts), or "
                "fewer GPUs than a host has on one of them"
                + (
                    "."
                    if headless
                    else "; a server over several hosts needs `vllm serve` (it starts the others "
                    "headless): end launch.vllm_command in `serve`, or keep the server on one host."
                ),
            )
        if not fitting:
            need = model.weight_bytes_bf16 / GIB if model else 0
            raise PlanError(
                f"{model.name if model else 'the model'} ({need:.0f} GiB of bf16 weights) does not fit a vLLM server "
                f"{_reach(served, g, mem, model)}",
                hint=_BIGGER,
            )
        return fitting
    if mode == VllmMode.COLOCATE or gpus is None:
        colocated = _fitting_colocate(colocated, recipe, model, mem, trace)
    if mode == VllmMode.COLOCATE:
        return colocated
    if not fitting and not colocated and model is not None and mem is not None:
        raise PlanError(
            f"{model.name} ({model.weight_bytes_bf16 / GIB:.0f} GiB of bf16 weights) does not fit vLLM "
            f"{_reach(served, g, mem, model)}: not as a server (the weights take over half of each GPU) "
            f"nor colocated (they take over {VLLM_SERVER_UTILIZATION:.0%} of each GPU)",
            hint=_BIGGER,
        )
    return colocated + fitting


_BIGGER = (
    "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
    "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a smaller "
    "model."
)


def _reach(served: list[Split], per_host: int, mem: int | None, model: ModelShape | None) -> str:
    """How far the servers that were tried reach: "on up to 24 GPUs of 80 GiB (tensor parallel within a node of 8,
    pipeline stages over nodes)"."""
    most = max((s.server_gpus for s in served), default=per_host)
    size = f" of {mem / GIB:.0f} GiB" if mem else ""
    how = "experts spread over a data-parallel server" if model and model.is_moe else "pipeline stages over nodes"
    return f"on up to {most} GPUs{size} (tensor parallel within a node of {per_host}, {how})"


def unfit_servers(topology: Topology, model: ModelShape | None) -> list[str]:
    """Each server split left out because its weights take over the allowed share of a GPU, with its numbers
    (``--explain`` of a refusal)."""
    mem = topology.min_gpu_memory_bytes
    if model is None or mem is None or topology.is_cpu or len(set(topology.gpus_per_host)) > 1:
        return []
    out = []
    for s in enumerate_splits(len(topology.hosts), topology.gpus_per_host[0], model):
        w = server_weights(model, s)
        if s.kind != SplitKind.COLOCATE and w > VLLM_WEIGHTS_SHARE * mem:
            out.append(
                f"split {s.label}: {w / GIB:.1f} GiB of weights per GPU is over {VLLM_WEIGHTS_SHARE:.0%} of "
                f"{mem / GIB:.1f} GiB"
            )
    return out


def _check_tp(model: ModelShape | None, tp: int, per_host: int) -> None:
    problems = []
    if tp > per_host:
        problems.append(f"tensor-parallel size {tp} exceeds the {per_host} GPUs of one host (TP stays in a node)")
    if model and model.tp_problems(tp):
        problems.append(
            f"vLLM cannot shard {model.name} over {tp} GPUs: {tp} does not divide its "
            + ", ".join(model.tp_problems(tp))
        )
    if problems:
        valid = model.valid_tp_sizes(per_host) if model else tuple(range(1, per_host + 1))
        raise PlanError(
            "the vLLM tensor-parallel size is not possible:",
            problems=problems,
            hint=f"Valid sizes here: {', '.join(map(str, valid))} (or leave it unset to choose).",
        )


def _refuse_no_trainer(model: ModelShape | None, gpus: int, per_host: int, mem: int | None) -> None:
    # launch.vllm_gpus goes with it: a server size asks for a server (requested_mode), and colocate has none.
    fixes = [
        Fix("launch.vllm", "colocate", "vLLM shares the training GPUs", rank=1, also=(("launch.vllm_gpus", None),))
    ]
    smaller = [
        t
        for t in (model.valid_tp_sizes(per_host - 1) if model else range(1, per_host))
        if mem is None or model is None or model.weight_bytes_bf16 / t <= VLLM_WEIGHTS_SHARE * mem
    ]
    if smaller:
        fixes.insert(0, Fix("launch.vllm_gpus", max(smaller), "a smaller server leaves GPUs to train", 0))
    fixes.append(Fix("gpus", None, f"more GPUs: at least {gpus + 1}", rank=3, in_recipe=False))
    raise NoGpuLeftForTraining(
        f"the vLLM server needs {gpus} GPU(s), leaving none of the {per_host} for training", fixes=fixes
    )


def _fitting_colocate(
    splits: list[Split], recipe: Recipe, model: ModelShape | None, mem: int | None, trace: Trace
) -> list[Split]:
    """Colocated engines whose weights take at most the allowed share of their vLLM share of a GPU; when none
    does, the largest TP, with a warning."""
    util = colocate_utilization(recipe)
    share = VLLM_WEIGHTS_SHARE * util * mem if mem else None
    fits = [s for s in splits if model is None or share is None or model.weight_bytes_bf16 / s.tp <= share]
    if fits or not splits:
        return fits
    last = splits[-1]
    if model is not None and mem is not None and model.weight_bytes_bf16 / last.tp >= VLLM_SERVER_UTILIZATION * mem:
        return []  # not even the weights fit a GPU, whatever its share
    if model is not None and mem is not None:
        trace.warn(
            f"colocated vLLM: {model.weight_bytes_bf16 / last.tp / GIB:.1f} GiB of weights per GPU at TP {last.tp} is "
            f"over half of the {util:.0%} vLLM share ({util * mem / GIB:.1f} GiB): expect a small KV cache"
        )
    return [last]


def colocate_utilization(recipe: Recipe) -> float:
    return float(
        recipe.launch.vllm_gpu_memory_utilization
        or recipe.get("vllm_gpu_memory_utilization")
        or TRL_COLOCATE_UTILIZATION
    )


def place(
    topology: Topology, recipe: Recipe, model: ModelShape | None, split: Split, trace: Trace
) -> tuple[VllmPlan, tuple[TrainHost, ...]]:
    """The vLLM plan and the training hosts of ``split`` (machine ranks from 0, the first training host the main
    process's)."""
    hosts = topology.hosts
    per = split.trainers_per_host
    train_hosts = tuple(
        TrainHost(hosts[i].name, hosts[i].addr, r, tuple(g.visible_id for g in hosts[i].gpus[:per]), per)
        for r, i in enumerate(split.train_hosts)
    )
    if topology.is_cpu or split.kind == SplitKind.OFF:
        return VllmPlan(VllmMode.OFF), train_hosts
    if split.kind == SplitKind.COLOCATE:
        return _colocate(recipe, split, trace), train_hosts

    def serving(i: int) -> tuple[str, ...]:  # a host serves its last GPUs
        return tuple(g.visible_id for g in hosts[i].gpus[len(hosts[i].gpus) - split.server_gpus_per_host :])

    host = hosts[split.server_hosts[0]]
    gpus = serving(split.server_hosts[0])
    nodes = tuple(ServerNode(hosts[i].name, hosts[i].addr, serving(i)) for i in split.server_hosts[1:])
    moe = bool(model and model.is_moe and split.dp > 1)
    shape = split.shape + (" with expert parallelism" if moe else "")
    trace.decide("vllm_tensor_parallel_size", split.tp, f"{split.server_gpus} server GPU(s) as {shape}")
    if split.pp > 1 and model is not None:
        pinned = recipe.launch.vllm_pipeline_parallel_size
        trace.decide(
            "vllm_pipeline_parallel_size",
            split.pp,
            (
                "set in the recipe (launch.vllm_pipeline_parallel_size)"
                if pinned
                else f"no server of tensor parallelism alone holds {model.name} "
                f"({model.weight_bytes_bf16 / GIB:.0f} GiB of bf16 weights) in half of each GPU"
            )
            + f": {split.pp} pipeline stages of TP {split.tp}, "
            f"{server_weights(model, split) / GIB:.1f} GiB per GPU"
            + (f", each replica over {split.replica_hosts} hosts" if split.replica_hosts > 1 else ""),
        )
    if split.dp > 1:
        why = (
            f"{model.name} is a mixture of experts: the {model.experts} experts spread over all {split.server_gpus} "
            f"GPUs ({server_weights(model, split) / GIB:.1f} GiB of weights per GPU), a KV cache per rank"
            if moe and model
            else f"{split.dp} replicas of the model, each with its own KV cache and decode batch"
        )
        trace.decide("vllm_data_parallel_size", split.dp, why)
    where = " ".join(f"{name}:{','.join(ids)}" for name, ids in ((host.name, gpus), *((n.name, n.gpus) for n in nodes)))
    trace.decide("server_gpus", where, split.label)
    if nodes and split.replica_hosts > 1:
        trace.decide(
            "vllm_nodes",
            len(nodes) + 1,
            f"vLLM's multi-node serving (--nnodes): the API server and the first stage on {host.name}, {len(nodes)} "
            "more host(s) run their stages headless; TRL's weight sync reaches every rank through the API server",
        )
    elif nodes:
        trace.decide(
            "vllm_nodes",
            len(nodes) + 1,
            f"vLLM's multi-node data parallel: the API server and {len(gpus) // (split.tp * split.pp)} rank(s) on "
            f"{host.name}, {len(nodes)} more host(s) run their ranks headless; TRL's weight sync reaches every rank "
            "through the API server",
        )
    launch = recipe.launch
    util = launch.vllm_gpu_memory_utilization
    if util is None and recipe.is_set("vllm_gpu_memory_utilization"):
        util = float(recipe.values["vllm_gpu_memory_utilization"])
        trace.notice(
            f"vllm_gpu_memory_utilization={util}: moved to the vLLM server's --gpu-memory-utilization "
            "(TRL only reads it in colocate mode)"
        )
    multi = len(hosts) > 1
    vllm = VllmPlan(
        mode=VllmMode.SERVER,
        host=host.name,
        address=host.addr if multi else "127.0.0.1",
        gpus=gpus,
        nodes=nodes,
        tensor_parallel_size=split.tp,
        data_parallel_size=split.dp,
        pipeline_parallel_size=split.pp,
        expert_parallel=moe,
        port=launch.vllm_port,
        bind_host=launch.vllm_host or ("0.0.0.0" if multi else "127.0.0.1"),
        gpu_memory_utilization=util or VLLM_SERVER_UTILIZATION,
        max_model_len=max_model_len(recipe),
        max_prompt_length=prompt_bound(recipe),
    )
    return vllm, train_hosts


def _colocate(recipe: Recipe, split: Split, trace: Trace) -> VllmPlan:
    util = colocate_utilization(recipe)
    trace.decide("vllm_tensor_parallel_size", split.tp, f"colocate: {split.dp} engine(s) of TP {split.tp}")
    trace.decide("vllm_gpu_memory_utilization", util, "vLLM shares each training GPU (colocate)")
    sleep = bool(recipe.get("vllm_enable_sleep_mode"))
    trace.decide(
        "vllm_enable_sleep_mode",
        sleep,
        "set in the recipe: vLLM frees its memory while the trainers train (a wake-up each step)"
        if sleep
        else "TRL's default: vLLM keeps its share while the trainers train, and the training budget leaves it",
    )
    return VllmPlan(
        mode=VllmMode.COLOCATE,
        tensor_parallel_size=split.tp,
        gpu_memory_utilization=util,
        max_model_len=max_model_len(recipe),
        max_prompt_length=prompt_bound(recipe),
        sleep_mode=sleep,
    )
