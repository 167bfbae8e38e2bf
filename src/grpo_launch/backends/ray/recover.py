"""A restart after a planned node left the Ray cluster (lost, or drained and gone): re-probe the cluster, and restart
on the nodes it holds then, or wait a bounded time (``launch.node_wait_s``) for them, then stop with the reason.

- Every planned node is back (the same address; Ray gives a rejoined raylet a new node id, which the placement
  groups do not depend on: they are pinned by the ``node:ADDRESS`` resource): the same plan restarts.
- A node the plan does not use has the lost node's GPUs (the same count and model; a CPU node for a CPU node): the
  plan is made again on the plan's hosts with that node in the lost one's place (:func:`moved_plan`), so the
  layout is the same shape, machine ranks and addresses are recomputed, and the run resumes there from the newest
  complete checkpoint. A replan that comes out another shape is not taken.
- Neither within the wait: the run stops with the lost nodes named and how long it waited.

The decision (:func:`replacements`, :func:`moved_plan`) is pure; :func:`wait_for_nodes` takes the cluster's views
as callables, so its course is tested without a cluster (tests/test_ray_recover.py).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING

from grpo_launch.errors import PlanError, ProbeError
from grpo_launch.machines.topology import Host, Topology
from grpo_launch.planning.planner import make_plan
from grpo_launch.spec import RunResult

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan

POLL_S = 5.0  # how often the wait looks at the cluster's nodes (a probe runs only when a node joined)


def lost_hosts(plan: Plan, alive: Set[str]) -> list[Host]:
    """The plan's hosts whose address no alive node has."""
    return [h for h in plan.topology.hosts if h.addr not in alive]


def gpu_kind(host: Host) -> str:
    """A host's GPUs as one comparable text: "2 x NVIDIA H100 80GB HBM3", or "CPU"."""
    names = sorted({g.name for g in host.gpus})
    return f"{len(host.gpus)} x {' + '.join(names)}" if host.gpus else "CPU"


def replacements(plan: Plan, probed: Topology) -> dict[str, Host] | None:
    """Lost host name → the probed node that takes its place: one the plan does not use, with the same GPUs (count
    and model), each node taken once. None when some lost host has none."""
    present = {h.addr for h in probed.hosts}
    used = {h.addr for h in plan.topology.hosts}
    free = [h for h in probed.hosts if h.addr not in used]
    chosen: dict[str, Host] = {}
    for lost in (h for h in plan.topology.hosts if h.addr not in present):
        match = next((h for h in free if gpu_kind(h) == gpu_kind(lost)), None)
        if match is None:
            return None
        free.remove(match)
        chosen[lost.name] = match
    return chosen


def moved_plan(plan: Plan, chosen: Mapping[str, Host]) -> Plan | None:
    """``plan`` made again with each lost host replaced, in its position, by its replacement (a name another host
    of the plan has is replaced by the node's address); None when the new plan is not the same shape."""
    kept = {h.name for h in plan.topology.hosts if h.name not in chosen}
    hosts = []
    for h in plan.topology.hosts:
        new = chosen.get(h.name)
        if new is not None and new.name in kept:
            new = dataclasses.replace(new, name=new.addr)
        hosts.append(new or h)
    topology = dataclasses.replace(plan.topology, hosts=tuple(hosts))
    runtime = dataclasses.replace(
        plan.runtime, run_dir=plan.run_dir, python=plan.python, vllm_version=plan.vllm_version
    )
    try:
        new_plan = make_plan(topology, plan.recipe, plan.model, runtime=runtime, calibration=plan.calibration)
    except PlanError:
        return None
    same = (new_plan.split, new_plan.vllm.mode, new_plan.train.num_processes, new_plan.train.num_machines) == (
        plan.split,
        plan.vllm.mode,
        plan.train.num_processes,
        plan.train.num_machines,
    )
    return new_plan if same else None


@dataclasses.dataclass
class Cluster:
    """What the wait needs of the cluster: the alive nodes' addresses, a probe of every usable node (its own
    report), and the clock (callables: a fake one in the fast tests)."""

    alive: Callable[[], Set[str]]
    probe: Callable[[], Topology]
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def wait_for_nodes(
    plan: Plan, result: RunResult, cluster: Cluster, emit: Callable[[str], None], *, wait_s: float
) -> Plan | RunResult:
    """The plan to restart with once the cluster again holds the plan's nodes or replacements for the lost ones,
    looking for up to ``wait_s`` seconds; else ``result`` with the reason the run stops."""
    deadline = cluster.clock() + wait_s
    said, probed_with = False, None
    while True:
        alive = cluster.alive()
        lost = lost_hosts(plan, alive)
        if not lost:
            if said:
                emit("[grpo-launch] ray: the plan's nodes are all in the cluster again: restarting on them")
            return plan
        names = ", ".join(h.name for h in lost)
        others = frozenset(alive) - {h.addr for h in plan.topology.hosts}
        if others and others != probed_with:  # a node the plan does not use: probe it only once per set of nodes
            probed_with = others
            try:
                chosen = replacements(plan, cluster.probe())
            except ProbeError:  # no usable node at all: keep waiting
                chosen = None
            moved = moved_plan(plan, chosen) if chosen else None
            if moved is not None and chosen:
                instead = ", ".join(f"{old} by {new.name} ({new.addr})" for old, new in chosen.items())
                emit(
                    f"[grpo-launch] ray: node(s) {names} of the plan left the Ray cluster; replaced by nodes with "
                    f"the same GPUs: {instead}; restarting there"
                )
                return moved
        if not said:
            kinds = ", ".join(f"{h.name}: {gpu_kind(h)}" for h in lost)
            emit(
                f"[grpo-launch] ray: node(s) {names} of the plan left the Ray cluster; waiting up to {wait_s:.0f} s "
                f"(launch.node_wait_s) for them to rejoin or for a node with the same GPUs ({kinds})"
            )
            said = True
        if cluster.clock() >= deadline:
            why = (
                f"node(s) {names} of the plan left the Ray cluster and neither they nor a node with the same GPUs "
                f"joined within {wait_s:.0f} s (launch.node_wait_s); nothing more was started"
            )
            emit(f"[grpo-launch] ray: {why}")
            again = shlex.join(["grpo-launch", "resume", plan.run_dir])
            hint = f"Bring the node back or add one like it, then `{again}` resumes from the newest checkpoint; or "
            hint += "raise launch.node_wait_s."
            detail = f"{result.detail or ''}\n{why}. {hint}".strip()
            return dataclasses.replace(result, detail=detail)
        cluster.sleep(min(POLL_S, max(0.0, deadline - cluster.clock())))
