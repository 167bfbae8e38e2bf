"""Placement: a split turned into the vLLM plan and the training hosts. Pure; every choice goes into the Trace.
Which splits the recipe allows is :mod:`grpo_launch.planning.splits.allowed`'s."""

from __future__ import annotations

import ipaddress

from grpo_launch.enums import VllmMode
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.lengths import max_model_len, prompt_bound
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.planning.plan_types import ServerNode, Trace, TrainHost, VllmPlan
from grpo_launch.planning.splits.split import Split, SplitKind, served, server_weights
from grpo_launch.planning.vllm_share import colocate_utilization, server_utilization
from grpo_launch.recipe import Recipe
from grpo_launch.recipe.launch import LaunchSettings


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
    return _server(topology, recipe, model, split, trace), train_hosts


def _server(topology: Topology, recipe: Recipe, model: ModelShape | None, split: Split, trace: Trace) -> VllmPlan:
    """The server of ``split``: on the last GPUs of its serving hosts, the API server on the first of them."""
    hosts = topology.hosts

    def serving(i: int) -> tuple[str, ...]:  # a host serves its last GPUs
        return tuple(g.visible_id for g in hosts[i].gpus[len(hosts[i].gpus) - split.server_gpus_per_host :])

    host = hosts[split.server_hosts[0]]
    gpus = serving(split.server_hosts[0])
    nodes = tuple(ServerNode(hosts[i].name, hosts[i].addr, serving(i)) for i in split.server_hosts[1:])
    par = served(model, split)
    _decide_shape(recipe, model, split, par, trace)
    where = " ".join(f"{name}:{','.join(ids)}" for name, ids in ((host.name, gpus), *((n.name, n.gpus) for n in nodes)))
    trace.decide("server_gpus", where, split.label)
    if nodes:
        trace.decide("vllm_nodes", len(nodes) + 1, _nodes_why(split, host.name, len(nodes), len(gpus)))
    launch = recipe.launch
    util, moved = server_utilization(recipe)
    if moved:
        trace.notice(moved)
    multi = len(hosts) > 1
    return VllmPlan(
        mode=VllmMode.SERVER,
        host=host.name,
        address=host.addr if multi else "127.0.0.1",
        gpus=gpus,
        nodes=nodes,
        tensor_parallel_size=par.tp,
        data_parallel_size=par.dp,
        pipeline_parallel_size=par.pp,
        expert_parallel=par.ep,
        port=launch.vllm_port,
        bind_host=launch.vllm_host or (_bind_address(host.addr) if multi else "127.0.0.1"),
        gpu_memory_utilization=util,
        max_model_len=max_model_len(recipe),
        max_prompt_length=prompt_bound(recipe),
    )


def _bind_address(addr: str) -> str:
    """Where a server over several hosts listens: the address the trainers reach it at when that is an IP, so a
    neighbour on another network of the host does not reach the port at all (the guard, grpo_launch.node.vllm_guard,
    refuses whoever does without the token). A host known by name binds every interface: on its own host a name
    may resolve to loopback (Debian's ``127.0.1.1 HOSTNAME`` line), where the other hosts could not reach it."""
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return "0.0.0.0"
    return addr


def _decide_shape(recipe: Recipe, model: ModelShape | None, split: Split, par: Parallelism, trace: Trace) -> None:
    """The server's TP, pipeline stages and data-parallel ranks, each with why."""
    shape = par.label + (" with expert parallelism" if par.ep else "")
    trace.decide("vllm_tensor_parallel_size", par.tp, f"{split.server_gpus} server GPU(s) as {shape}")
    if par.pp > 1 and model is not None:
        pinned = recipe.launch.vllm_pipeline_parallel_size
        trace.decide(
            "vllm_pipeline_parallel_size",
            par.pp,
            (
                "set in the recipe (launch.vllm_pipeline_parallel_size)"
                if pinned
                else f"no server of tensor parallelism alone holds {model.name} "
                f"({model.weight_bytes_bf16 / GIB:.0f} GiB of bf16 weights) in half of each GPU"
            )
            + f": {par.pp} pipeline stages of TP {par.tp}, "
            f"{server_weights(model, split) / GIB:.1f} GiB per GPU"
            + (f", each replica over {split.replica_hosts} hosts" if split.replica_hosts > 1 else ""),
        )
    if par.dp > 1:
        why = (
            f"{model.name} is a mixture of experts: the {model.experts} experts spread over all {split.server_gpus} "
            f"GPUs ({server_weights(model, split) / GIB:.1f} GiB of weights per GPU), a KV cache per rank"
            if par.ep and model
            else f"{par.dp} replicas of the model, each with its own KV cache and decode batch"
        )
        trace.decide("vllm_data_parallel_size", par.dp, why)


def _nodes_why(split: Split, head: str, others: int, local_gpus: int) -> str:
    """How a server over several hosts runs: one replica's stages over them, or data-parallel ranks on each."""
    if split.replica_hosts > 1:
        return (
            f"vLLM's multi-node serving (--nnodes): the API server and the first stage on {head}, {others} "
            "more host(s) run their stages headless; TRL's weight sync reaches every rank through the API server"
        )
    return (
        f"vLLM's multi-node data parallel: the API server and {local_gpus // split.par.replica_gpus} rank(s) on "
        f"{head}, {others} more host(s) run their ranks headless; TRL's weight sync reaches every rank "
        "through the API server"
    )


def _colocate(recipe: Recipe, split: Split, trace: Trace) -> VllmPlan:
    if unused := server_only_settings(recipe):
        # As the key ledger names what vLLM off leaves unused (recipe/ledger.py), whether colocate was pinned or chosen.
        trace.notice(
            f"not used by this run: {', '.join(unused)} (vLLM is colocated: TRL builds its engine inside each trainer "
            "with vllm.LLM from GRPOConfig's vllm_* keys, and no server is started; environment variables for "
            "that engine go in launch.train_env; launch.vllm=server uses these settings)"
        )
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


def server_only_settings(recipe: Recipe) -> list[str]:
    """The launch settings the recipe sets that only a vLLM server reads (its command line, its environment, its
    address): a colocated engine takes none of them."""
    launch, default = recipe.launch, LaunchSettings()
    given = (
        ("launch.vllm_command", launch.vllm_command != default.vllm_command),
        ("launch.vllm_extra_args", bool(launch.vllm_extra_args)),
        ("launch.vllm_env", bool(launch.vllm_env)),
        ("launch.vllm_host", launch.vllm_host is not None),
        ("launch.vllm_port", launch.vllm_port != default.vllm_port),
    )
    return [name for name, set_ in given if set_]
