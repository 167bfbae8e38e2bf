"""What a backend is: the Backend protocol and the options each one declares (a backend that hands runs to a
batch system also has a Submitter: :mod:`.submission`).

A backend owns everything about one way of running processes: how it is chosen (``detect``), its options (a frozen
dataclass derived from :class:`BackendOptions` whose fields say which command-line flag fills them: the CLI reads
them, no backend sees argparse; the protocol is generic in it, so ``detect``/``create`` are typed per backend, as
torchx's ``Scheduler`` is in its request type), how
it reads the machines (``probe``), how a process is put on its host (``place``: pure, wraps the command in srun or
ssh), what it checks before anything starts (``preflight``), how it stops a process tree on another host
(``signal_remote``), what it holds around an attempt's processes (``attempt``: Ray's placement groups), what a
restart runs on (``before_restart``: Ray waits for a lost node or a replacement), what it does after the run
(``after_run``: e.g. requeue a Slurm job), and the state of the batch job a run belongs to (``job_id`` /
``job_state``, for ``grpo-launch status``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from grpo_launch.errors import LaunchError
from grpo_launch.machines.topology import Topology
from grpo_launch.spec import ProcessSpec, RunContext, RunResult, frozen

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.rundir.records import JobState


def option(flag: str, help: str, *, default: Any = None, metavar: str | None = None, **argparse: Any) -> Any:
    """A field of a backend's options, filled from the command-line ``flag`` (``argparse`` keywords pass through:
    ``type``, ``action``, ``required``; ``group`` names the help section)."""
    meta = {"flag": flag, "help": help, "metavar": metavar, **argparse}
    if isinstance(default, (list, tuple)):
        return dataclasses.field(default=tuple(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@frozen
class BackendOptions:
    """What every backend's and submitter's options derive from: a frozen dataclass of :func:`option` fields."""

    def chooses_backend(self) -> bool:
        """Whether these flags alone ask for their backend (--hostfile, --ray, --slurm): the part of its
        ``detect`` that does not read the environment."""
        return False

    def problems(self) -> list[str]:
        """What is wrong with the values given, each naming its flag: checked when the command line is read, before
        any plan, probe or dry run (a port out of range must not wait for the real run to fail)."""
        return []

    def given_flags(self) -> list[str]:
        """The flags whose values differ from their defaults, as the command line names them (``--hostfile``)."""
        return [
            f.metadata["flag"]
            for f in dataclasses.fields(self)
            if "flag" in f.metadata and getattr(self, f.name) != f.default
        ]


@frozen
class NoOptions(BackendOptions):
    """A backend without options of its own."""


# A backend's own options class. ``Options`` (a class variable, which cannot hold a type variable) names the same
# class at run time; tests/test_backends.py checks that they agree.
OptionsT = TypeVar("OptionsT", bound=BackendOptions)


class Backend(Protocol[OptionsT]):
    """One way of running the plan's processes (local, ssh hosts, a Slurm allocation, …), with options of type
    ``OptionsT``. The registry (:func:`grpo_launch.backends.select`) picks one by name: ``Backend[Any]`` there."""

    name: ClassVar[str]
    Options: ClassVar[type[BackendOptions]]  # OptionsT itself: what the CLI fills from the command line

    @classmethod
    def detect(cls, options: OptionsT, environ: Mapping[str, str]) -> bool:
        """Whether this backend is the one the options and environment ask for."""
        ...

    @classmethod
    def create(cls, options: OptionsT, environ: Mapping[str, str]) -> Backend[OptionsT]: ...

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

    def attempt(
        self, processes: Sequence[ProcessSpec], plan: Plan, ctx: RunContext, ask_stop: Callable[[str], None]
    ) -> contextlib.AbstractContextManager[None]:
        """Around one attempt's processes (as placed): what the backend holds for them (Ray's placement groups)
        and its cleanup after them. ``ask_stop(reason)`` asks the trainers for a checkpoint and stop through the
        run's stop channel (a platform taking machines away: a Ray node drain)."""
        ...

    def after_run(self, plan: Plan, result: RunResult, ctx: RunContext) -> RunResult: ...

    def machines_leaving(self, ctx: RunContext) -> str | None:
        """Why the platform is taking the last attempt's machines away (a Ray node drain), when that is why the
        attempt was asked to checkpoint and stop: its stop with a checkpoint is then a restart (launch.max_restarts)
        on the machines there are (:meth:`before_restart`). None: a stop with a checkpoint ends the run."""
        ...

    def before_restart(self, plan: Plan, result: RunResult, ctx: RunContext) -> Plan | RunResult:
        """Before a restart after ``result`` (a failure a restart may get past): the plan to restart with (``plan``,
        or the same shape on the machines the platform has now, e.g. a Ray node that replaced a lost one), or the
        result to end the run with, its reason added (the machines did not come back)."""
        ...

    def deadline(self, ctx: RunContext) -> float | None:
        """When the allocation ends (epoch seconds), if it does: the run saves a checkpoint before it."""
        ...

    def job_id(self, ctx: RunContext) -> str | None:
        """The batch job this run is part of (recorded in the run directory's lock), if any."""
        ...

    def stop_grace(self, ctx: RunContext) -> tuple[float, str] | None:
        """How long the platform leaves between its stop signal and its SIGKILL, and where that number comes from;
        None: launch.stop_grace_s's default applies."""
        ...

    def stops_at_once(self, signum: int, ctx: RunContext) -> str | None:
        """Why signal ``signum`` to grpo-launch cannot wait for a checkpoint (the platform is already killing the
        processes), or None: grpo-launch asks the trainers to checkpoint first."""
        ...

    @classmethod
    def job_state(cls, job_id: str) -> JobState | None:
        """What the batch system says of ``job_id`` (state, restarts, …) as a typed record, or None when it says
        nothing; no batch system's own keys cross the protocol."""
        ...


class BaseBackend(Generic[OptionsT]):
    """Defaults for the optional parts of :class:`Backend`; a backend derives from ``BaseBackend[ItsOptions]``."""

    name: ClassVar[str] = "base"
    Options: ClassVar[type[BackendOptions]] = NoOptions
    # A backend of another package may hand runs to its batch system as built-in Slurm does: ``grpo-launch VERB``
    # then plans for its Submitter's requested machines and submits (grpo_launch.cli.submit_verb).
    submit_verb: ClassVar[str | None] = None
    Submitter: ClassVar[type | None] = None

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        return spec

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        return None

    def signal_remote(self, spec: ProcessSpec, pgid: int, sig: int, ctx: RunContext) -> None:
        raise LaunchError(f"the {self.name} backend has no remote process groups to signal")

    def after_run(self, plan: Plan, result: RunResult, ctx: RunContext) -> RunResult:
        return result

    def attempt(
        self, processes: Sequence[ProcessSpec], plan: Plan, ctx: RunContext, ask_stop: Callable[[str], None]
    ) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def machines_leaving(self, ctx: RunContext) -> str | None:
        return None

    def before_restart(self, plan: Plan, result: RunResult, ctx: RunContext) -> Plan | RunResult:
        return plan

    def deadline(self, ctx: RunContext) -> float | None:
        return None

    def job_id(self, ctx: RunContext) -> str | None:
        return None

    def stop_grace(self, ctx: RunContext) -> tuple[float, str] | None:
        return None

    def stops_at_once(self, signum: int, ctx: RunContext) -> str | None:
        return None

    @classmethod
    def job_state(cls, job_id: str) -> JobState | None:
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
