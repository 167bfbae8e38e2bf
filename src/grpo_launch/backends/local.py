"""The local backend: every process on this machine, each in its own process group."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BaseBackend, NoOptions
from grpo_launch.enums import VllmMode
from grpo_launch.errors import LaunchError
from grpo_launch.machines.topology import Topology
from grpo_launch.render.processes import weight_sync_port
from grpo_launch.spec import ProcessSpec, RunContext

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan


def check_ports(plan: Plan) -> None:
    """The server, weight-sync and rendezvous ports are free here."""
    from grpo_launch.probe.local import port_free

    busy = []
    if plan.vllm.mode == VllmMode.SERVER:
        if not port_free(plan.vllm.port):
            busy.append(f"vLLM server port {plan.vllm.port} is in use: set launch.vllm_port to a free port")
        group = weight_sync_port(plan)
        if not port_free(group):
            busy.append(
                f"weight-sync port {group} (vllm_group_port) is in use on the trainer head: set vllm_group_port"
            )
    if plan.train.num_processes > 1 and not port_free(plan.train.main_process_port):
        busy.append(f"trainer rendezvous port {plan.train.main_process_port} is in use: set launch.main_process_port")
    if busy:
        raise LaunchError(
            "ports needed by the run are taken:",
            problems=busy,
            hint="Another run may still be going: check with `ss -ltnp`.",
        )


class LocalBackend(BaseBackend[NoOptions]):
    name: ClassVar[str] = "local"

    @classmethod
    def detect(cls, options: NoOptions, environ: Mapping[str, str]) -> bool:
        return True  # the fallback

    @classmethod
    def create(cls, options: NoOptions, environ: Mapping[str, str]) -> LocalBackend:
        return cls()

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        return dataclasses.replace(local, trainers_share_this_cache=True)

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        if plan.train.num_machines > 1 or spec.host:
            raise LaunchError(
                f"this plan spans {len(plan.topology.hosts)} machines (from --gpus); grpo-launch starts processes on "
                "other machines from a hostfile (--hostfile) or inside a Slurm job",
                hint="Use --hostfile FILE, submit with `grpo-launch sbatch RECIPE --nodes N`, or plan for this "
                "machine only (omit --gpus).",
            )
        return spec

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        check_ports(plan)
