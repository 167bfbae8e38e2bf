"""The hosts' roles outside the split search: the training processes of a CPU plan, and every GPU's role in a
plan (vLLM, training, shared by both, or idle). Pure."""

from __future__ import annotations

from grpo_launch.enums import GpuUse, VllmMode
from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import Topology
from grpo_launch.planning.plan_types import GpuRole, Trace, TrainHost, VllmPlan
from grpo_launch.recipe import Recipe


def cpu_train_hosts(topology: Topology, recipe: Recipe, trace: Trace) -> tuple[TrainHost, ...]:
    hosts = topology.hosts
    if len(hosts) == 1:
        n = recipe.launch.num_processes or 1
        trace.decide(
            "num_processes", n, "set in launch.num_processes" if recipe.launch.num_processes else "CPU default"
        )
        h = hosts[0]
        return (TrainHost(h.name, h.addr, 0, (), n),)
    if recipe.launch.num_processes:
        total = recipe.launch.num_processes
        if total % len(hosts):
            raise PlanError(
                f"launch.num_processes={total} cannot be split evenly over {len(hosts)} CPU hosts",
                hint=f"Use a multiple of {len(hosts)} (accelerate runs the same number of processes on every host).",
            )
        per = total // len(hosts)
        why = f"launch.num_processes={total} over {len(hosts)} hosts"
    else:
        counts = {h.slots or h.cpus or 1 for h in hosts}
        if len(counts) > 1:
            raise PlanError(
                "CPU hosts have different slot counts: " + ", ".join(f"{h.name}={h.slots or h.cpus}" for h in hosts),
                hint="Give every host the same slots=N, or set launch.num_processes.",
            )
        per = counts.pop()
        why = "one process per slot / CPU of each host"
    trace.decide("num_processes", per * len(hosts), why)
    return tuple(TrainHost(h.name, h.addr, r, (), per) for r, h in enumerate(hosts))


def gpu_roles(topology: Topology, vllm: VllmPlan, train_hosts: tuple[TrainHost, ...]) -> tuple[GpuRole, ...]:
    training = {(h.name, g) for h in train_hosts for g in h.gpus}
    serving = set()
    if vllm.mode == VllmMode.SERVER:
        serving = {(vllm.host, g) for g in vllm.gpus} | {(n.name, g) for n in vllm.nodes for g in n.gpus}
    roles = []
    for h in topology.hosts:
        for g in h.gpus:
            key = (h.name, g.visible_id)
            use = GpuUse.VLLM if key in serving else GpuUse.TRAIN if key in training else GpuUse.IDLE
            if vllm.mode == VllmMode.COLOCATE and use == GpuUse.TRAIN:
                use = GpuUse.SHARED
            roles.append(GpuRole(h.name, g.visible_id, g.name, g.memory_gib, use))
    return tuple(roles)
