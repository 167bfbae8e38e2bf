"""The Slurm backend. Two halves, as in submitit: outside a job, the Submitter (:mod:`.submit`) writes and submits
the batch script (``grpo-launch sbatch``); inside the job, this Backend reads the allocation, starts one ``srun``
step per process on its node, and after a checkpoint-and-stop (SIGUSR2 before the time limit, or SIGTERM to the
trainers at a preemption: :mod:`.preempt`) requeues the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BackendOptions, BaseBackend, check_addresses
from grpo_launch.backends.options import SlurmOptions
from grpo_launch.backends.slurm.allocation import het_groups, job_end_time, probe_slurm, srun_spec
from grpo_launch.backends.slurm.env import SLURM_VARIABLES, run_scontrol, slurm_values
from grpo_launch.backends.slurm.job_state import job_state_of
from grpo_launch.backends.slurm.preempt import read_stop_grace, stops_at_once
from grpo_launch.backends.slurm.sbatch import requeue_slurm_job
from grpo_launch.enums import RunState
from grpo_launch.machines.topology import Topology
from grpo_launch.spec import ProcessSpec, RunContext, RunResult

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.rundir.records import JobState


class SlurmBackend(BaseBackend[SlurmOptions]):
    name: ClassVar[str] = "slurm"
    Options: ClassVar[type[BackendOptions]] = SlurmOptions

    @classmethod
    def detect(cls, options: SlurmOptions, environ: Mapping[str, str]) -> bool:
        values = slurm_values(environ)
        return options.chooses_backend() or bool(values.get("job_id") and values.get("nodelist"))

    @classmethod
    def create(cls, options: SlurmOptions, environ: Mapping[str, str]) -> SlurmBackend:
        return cls()

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        return probe_slurm(environ, local=local)

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        host = next(h for h in plan.topology.hosts if h.name == (spec.host or plan.topology.hosts[0].name))
        return srun_spec(
            replace(spec, host=host.name),
            python=ctx.python,
            gpus_on_node=len(host.gpus),
            cpus_on_node=host.cpus,
            het_group=het_groups(ctx.environ).get(host.name, 0),
        )

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        check_addresses(plan)

    def deadline(self, ctx: RunContext) -> float | None:
        job = ctx.environ.get("SLURM_JOB_ID")
        return job_end_time(job) if job else None

    def job_id(self, ctx: RunContext) -> str | None:
        return ctx.environ.get(SLURM_VARIABLES["job_id"]) or None

    def stop_grace(self, ctx: RunContext) -> tuple[float, str] | None:
        return read_stop_grace(ctx.environ) if ctx.environ.get("SLURM_JOB_ID") else None

    def stops_at_once(self, signum: int, ctx: RunContext) -> str | None:
        return stops_at_once(signum)

    @classmethod
    def job_state(cls, job_id: str) -> JobState | None:
        """A Slurm job's state, restarts, run time, limit and nodes (``scontrol show job -o``), or None (finished
        long ago, no Slurm)."""
        text = run_scontrol(["show", "job", "-o", job_id])
        return job_state_of(text) if text else None

    def after_run(self, plan: Plan, result: RunResult, ctx: RunContext) -> RunResult:
        job = ctx.environ.get("SLURM_JOB_ID")
        if result.state == RunState.STOPPED_FOR_CHECKPOINT and job:
            requeue_slurm_job(job)
            ctx.emit(f"[grpo-launch] requeued Slurm job {job}")
        return result
