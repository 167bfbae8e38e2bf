"""GPU types by role (pure): on a cluster of mixed GPU models, what each role of a placed split runs on. Decoding is
priced on the serving hosts' GPUs (memory bandwidth bound), training on the training hosts' (compute bound), and each
side's memory is checked on its own GPUs; on one GPU type every role is priced on it, as before.

A role spanning several types is priced at its slowest (its GPUs step together), so colocating on every GPU of a
mixed cluster is priced at its slowest type, a candidate like any other."""

from __future__ import annotations

from grpo_launch.enums import VllmMode
from grpo_launch.machines.gpus import GpuSpec
from grpo_launch.machines.topology import Topology
from grpo_launch.planning.plan_types import TrainHost, VllmPlan


def train_topology(topology: Topology, hosts: tuple[TrainHost, ...]) -> Topology:
    """The training hosts' part of ``topology`` (all of it when they are every host)."""
    return topology.only([h.name for h in hosts])


def serve_topology(topology: Topology, vllm: VllmPlan, hosts: tuple[TrainHost, ...]) -> Topology:
    """The hosts vLLM runs on: the server's (its API host and headless nodes), else the training hosts (colocated)."""
    if vllm.mode == VllmMode.SERVER and vllm.host is not None:
        return topology.only([vllm.host, *(n.name for n in vllm.nodes)])
    return train_topology(topology, hosts)


def role_specs(
    topology: Topology, vllm: VllmPlan, hosts: tuple[TrainHost, ...]
) -> tuple[GpuSpec | None, GpuSpec | None]:
    """(serving GPU, training GPU) the step time is priced on: each role's slowest GPU the table (or --gpus) knows,
    slowest to decode (memory bandwidth) for the server, slowest to train (FLOPs) for the trainers."""
    return _slowest_to_decode(serve_topology(topology, vllm, hosts)), train_topology(topology, hosts).planning_gpu_spec


def _slowest_to_decode(topology: Topology) -> GpuSpec | None:
    """The GPU of the least memory bandwidth among the topology's models (all of one model: its spec)."""
    specs = [topology.spec_of(name) for name in topology.gpu_types]
    if len(specs) < 2 or any(s is None for s in specs):
        return topology.planning_gpu_spec
    return min((s for s in specs if s is not None), key=lambda s: (s.bandwidth_tbs, s.bf16_tflops, s.name))


def roles_line(topology: Topology, vllm: VllmPlan, hosts: tuple[TrainHost, ...]) -> str | None:
    """Which GPU type does what, and why, on a mixed cluster (None on one type)."""
    if len(topology.gpu_types) < 2:
        return None
    serve, train = role_specs(topology, vllm, hosts)
    used = {h.name for h in hosts} | (
        {vllm.host, *(n.name for n in vllm.nodes)} if vllm.mode == VllmMode.SERVER and vllm.host else set()
    )
    idle = [h.name for h in topology.hosts if h.name not in used]
    if vllm.mode != VllmMode.SERVER or serve is None or train is None:
        said = f"every role on {train_topology(topology, hosts).describe()}"
        if len(train_topology(topology, hosts).gpu_types) > 1 and train is not None:
            said += f", priced at the slowest, {train.name}: they step together"
    else:
        serving = serve_topology(topology, vllm, hosts).gpu_types
        who = serve.name if len(serving) == 1 else f"{'+'.join(serving)} (priced at the slowest, {serve.name})"
        said = (
            f"{who} serves vLLM (decoding reads the weights at {serve.bandwidth_tbs:g} TB/s); "
            f"{train.name} trains ({train.bf16_tflops:g} dense bf16 TFLOP/s); the weights cross between their hosts"
        )
    if idle:
        said += f"; idle: {', '.join(idle)} (every split that uses them is predicted slower)"
    return said


def types_text(topology: Topology, indices: tuple[int, ...]) -> str:
    """The GPU models of the hosts at ``indices``, joined (a split's label on a mixed cluster)."""
    names = dict.fromkeys(g.name for i in indices for g in topology.hosts[i].gpus)
    return "+".join(names)
