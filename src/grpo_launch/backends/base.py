"""What a backend is: the Backend and Submitter protocols, their capabilities, and the RunContext every run gets.

A backend owns everything about one way of running processes: how it is chosen (``detect``), its command-line
options, how it reads the machines (``probe``), how a process is put on its host (``place``: pure, wraps the
command in srun or ssh), what it checks before anything starts (``preflight``), how it stops a process tree on
another host (``signal_remote``) and what it does after the run (``after_run``: e.g. requeue a Slurm job).
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from grpo_launch.errors import LaunchError
from grpo_launch.spec import ProcessSpec, RunResult
from grpo_launch.topology import Topology

if TYPE_CHECKING:
    from grpo_launch.planning.types import Plan
    from grpo_launch.recipe import Recipe


class Capability(enum.Flag):
    NONE = 0
    MULTI_HOST = enum.auto()  # starts processes on other machines
    REQUEUE = enum.auto()  # can requeue itself after a checkpoint-and-stop
    SUBMIT = enum.auto()  # has a Submitter (a batch system)


@dataclass(frozen=True)
class RunContext:
    """What a run needs from the process that starts it, read once (instead of sys.executable, os.getcwd() and
    os.environ here and there). ``emit`` prints one line; the CLI owns it."""

    python: str
    workdir: str
    environ: Mapping[str, str]
    emit: Callable[[str], None]

    @classmethod
    def current(cls, environ: Mapping[str, str], emit: Callable[[str], None]) -> RunContext:
        """This process's interpreter and working directory."""
        return cls(sys.executable, os.getcwd(), dict(environ), emit)


class Backend(Protocol):
    """One way of running the plan's processes (local, ssh hosts, a Slurm allocation, …)."""

    name: ClassVar[str]
    capabilities: ClassVar[Capability]

    @classmethod
    def detect(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
        """Whether this backend is the one the command line and environment ask for."""
        ...

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, run: bool) -> None:
        """This backend's options (``run``: the options that only starting processes needs)."""
        ...

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> Backend: ...

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        """The machines this backend runs on; ``local`` is this machine as probed here."""
        ...

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        """``spec`` as it must be started from here to run on its host (pure)."""
        ...

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        """Checks before anything starts; raises one error listing every problem."""
        ...

    def signal_remote(self, spec: ProcessSpec, pgid: int, sig: int, ctx: RunContext) -> None:
        """Send ``sig`` to process group ``pgid`` on ``spec.host`` (only for specs with ``remote_group``)."""
        ...

    def after_run(self, plan: Plan, result: RunResult, ctx: RunContext) -> RunResult: ...

    def deadline(self, ctx: RunContext) -> float | None:
        """When the allocation ends (epoch seconds), if it does: the run saves a checkpoint before it."""
        ...


class BaseBackend:
    """Defaults for the optional parts of :class:`Backend`."""

    name: ClassVar[str] = "base"
    capabilities: ClassVar[Capability] = Capability.NONE

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, run: bool) -> None:
        return None

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        return spec

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        return None

    def signal_remote(self, spec: ProcessSpec, pgid: int, sig: int, ctx: RunContext) -> None:
        raise LaunchError(f"the {self.name} backend has no remote process groups to signal")

    def after_run(self, plan: Plan, result: RunResult, ctx: RunContext) -> RunResult:
        return result

    def deadline(self, ctx: RunContext) -> float | None:
        return None


def check_addresses(plan: Plan) -> None:
    """Every host the processes must reach (trainer head, vLLM server) resolves to an address."""
    import socket

    targets = {h.address: f"training host {h.name}" for h in plan.train.hosts}
    if plan.vllm.base_url and plan.vllm.address:
        targets.setdefault(plan.vllm.address, f"vLLM host {plan.vllm.host}")
    problems = []
    for address, what in targets.items():
        try:
            socket.getaddrinfo(address, None)
        except (socket.gaierror, UnicodeError) as exc:
            problems.append(f"{what}: address {address!r} does not resolve ({exc})")
    if problems:
        raise LaunchError(
            "hosts of the plan cannot be reached:",
            problems=problems,
            hint="Fix name resolution (DNS or /etc/hosts) on this node, or give the hosts by IP address.",
        )


@dataclass(frozen=True)
class Submission:
    """What a Submitter would submit: the script text (``--dry-run`` prints it) and where it is written."""

    text: str
    path: str
    summary: str = ""


class Submitter(Protocol):
    """A backend that hands the run to a batch system (``grpo-launch sbatch``)."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None: ...

    @classmethod
    def requested_topology(cls, args: argparse.Namespace, local: Topology) -> Topology:
        """The machines the submission asks for, to plan before submitting."""
        ...

    def request(self, recipe: Recipe, plan: Plan, args: argparse.Namespace, ctx: RunContext) -> Submission:
        """The submission as data (pure)."""
        ...

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        """Submit; returns the job id."""
        ...
