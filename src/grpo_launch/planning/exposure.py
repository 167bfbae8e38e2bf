"""The notice a plan over several hosts carries when the addresses its hosts reach each other at are public (pure).

Over several hosts the ports a run opens cannot all be bound to one private address: torch's rendezvous store
listens on every interface of the main host (TCPStore has no listen address), and gloo's and NCCL's own ports are
picked by them. Where those addresses are reachable from the internet, a firewall must keep all but the run's hosts
out. README.md, "Ports", lists each port and who must reach it.
"""

from __future__ import annotations

import ipaddress

from grpo_launch.enums import VllmMode
from grpo_launch.planning.plan_types import Plan
from grpo_launch.recipe.trl_schema import DEFAULTS as TRL_DEFAULTS


def public_addresses(plan: Plan) -> tuple[str, ...]:
    """The IP addresses of the plan (the trainers' hosts, the vLLM server's hosts and the address it binds) that are
    public: not private (RFC 1918, unique local), loopback, link-local, shared (CGNAT 100.64/10) or reserved. A
    host known by name is not judged."""
    v = plan.vllm
    candidates = [h.address for h in plan.train.hosts]
    if v.mode == VllmMode.SERVER:
        candidates += [v.address or "", v.bind_host, *(n.address for n in v.nodes)]
    public = []
    for text in dict.fromkeys(candidates):
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if address.is_global:
            public.append(text)
    return tuple(public)


def run_ports(plan: Plan) -> tuple[str, ...]:
    """The ports other hosts must reach in a plan over several hosts, each with what listens there."""
    ports = []
    train = plan.train
    if train.num_machines > 1:
        main = train.hosts[0].name
        ports.append(f"{train.main_process_port} (the trainers' rendezvous store, every interface of {main})")
    v = plan.vllm
    if v.mode == VllmMode.SERVER:
        ports.append(f"{v.port} (the vLLM server on {v.host}, token-guarded)")
        if v.nodes and v.data_parallel_size > 1:
            ports.append(f"{v.rpc_port} (vLLM's data-parallel coordination on {v.host})")
        if v.spans_hosts:
            ports.append(f"{v.master_port} (vLLM's group over its hosts, on {v.host})")
        group = plan.trainer_values.get("vllm_group_port") or TRL_DEFAULTS["vllm_group_port"]
        ports.append(f"{group} (TRL's weight sync, on {train.hosts[0].name})")
    launch = plan.recipe.launch
    if launch.metrics_port is not None and not _loopback(launch.metrics_host):
        ports.append(
            f"{launch.metrics_port} (the run's metrics endpoint on the launcher's host, read-only, "
            "no authentication: only your Prometheus server needs it)"
        )
    ports.append("the ports gloo and NCCL pick between the hosts")
    return tuple(ports)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def public_address_notice(plan: Plan) -> str | None:
    """The notice for a plan over several hosts whose addresses are public, or None."""
    if len(plan.topology.hosts) < 2:
        return None
    public = public_addresses(plan)
    if not public:
        return None
    return (
        f"public address{'es' if len(public) > 1 else ''} {', '.join(public)}: the run's ports are open to the "
        f"internet unless a firewall lets only the run's hosts reach {'; '.join(run_ports(plan))}. Use the hosts' "
        'private addresses where they have them (README.md, "Ports")'
    )
