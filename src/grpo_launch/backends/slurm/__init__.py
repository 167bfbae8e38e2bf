"""The Slurm backend. Two halves, as in submitit: outside a job, the Submitter writes and submits the batch script
(``grpo-launch sbatch``); inside the job, the Backend reads the allocation, starts one ``srun`` step per process on
its node, and after a checkpoint-and-stop (SIGUSR2 before the time limit) requeues the job."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BaseBackend, Capability, RunContext, Submission, check_addresses
from grpo_launch.backends.slurm.env import slurm_values
from grpo_launch.catalog import GIB, find_gpu_spec
from grpo_launch.errors import ConfigError
from grpo_launch.spec import ProcessSpec, RunResult, RunState
from grpo_launch.topology import Gpu, Host, Topology

if TYPE_CHECKING:
    from grpo_launch.planning.types import Plan
    from grpo_launch.recipe import Recipe

SBATCH_SCRIPT = "job.sbatch"


class SlurmBackend(BaseBackend):
    name: ClassVar[str] = "slurm"
    capabilities: ClassVar[Capability] = Capability.MULTI_HOST | Capability.REQUEUE | Capability.SUBMIT

    @classmethod
    def detect(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
        values = slurm_values(environ)
        return bool(getattr(args, "slurm", False)) or bool(values.get("job_id") and values.get("nodelist"))

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, run: bool) -> None:
        parser.add_argument(
            "--slurm",
            action="store_true",
            help="use the current Slurm allocation (an error outside one); without it, used when SLURM_JOB_ID is set",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> SlurmBackend:
        return cls()

    # The allocation and sbatch modules load only when used: choosing a backend and declaring its options must stay
    # cheap for `grpo-launch plan`.
    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        from grpo_launch.backends.slurm.allocation import probe_slurm

        return probe_slurm(environ, local=local)

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        from grpo_launch.backends.slurm.allocation import srun_spec

        host = next(h for h in plan.topology.hosts if h.name == (spec.host or plan.topology.hosts[0].name))
        return srun_spec(
            replace(spec, host=host.name), python=ctx.python, gpus_on_node=len(host.gpus), cpus_on_node=host.cpus
        )

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        check_addresses(plan)

    def deadline(self, ctx: RunContext) -> float | None:
        from grpo_launch.backends.slurm.allocation import job_end_time

        job = ctx.environ.get("SLURM_JOB_ID")
        return job_end_time(job) if job else None

    def after_run(self, plan: Plan, result: RunResult, ctx: RunContext) -> RunResult:
        from grpo_launch.backends.slurm.sbatch import requeue_slurm_job

        job = ctx.environ.get("SLURM_JOB_ID")
        if result.state == RunState.STOPPED_FOR_CHECKPOINT and job:
            requeue_slurm_job(job)
            ctx.emit(f"[grpo-launch] requeued Slurm job {job}")
        return result


class SlurmSubmitter:
    """``grpo-launch sbatch``: plan for the requested allocation, write RUN_DIR/job.sbatch, submit it."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--nodes", type=int, required=True, help="number of nodes")
        parser.add_argument(
            "--gpus-per-node", type=int, help="GPUs per node (default: this machine's count; 0 for CPU-only nodes)"
        )
        parser.add_argument(
            "--gpu-type", metavar="MODEL", help="GPU model to plan for, e.g. H100-80GB (default: this machine's GPU)"
        )
        parser.add_argument("--partition", help="Slurm partition")
        parser.add_argument("--time", help="time limit (sbatch --time format, e.g. 04:00:00 or 1-00:00)")
        parser.add_argument("--account", help="Slurm account")
        parser.add_argument("--job-name", help="job name (default: grpo-RECIPE)")

    @classmethod
    def requested_topology(cls, args: argparse.Namespace, local: Topology) -> Topology:
        """--nodes × --gpus-per-node GPUs of one model (by default this machine's count and model)."""
        if args.nodes < 1:
            raise ConfigError(f"--nodes must be at least 1, got {args.nodes}")
        per_node = args.gpus_per_node
        if per_node is None:
            if local.is_cpu:
                raise ConfigError(
                    "how many GPUs per node? This machine has none to copy the count from",
                    hint="Pass --gpus-per-node G (and --gpu-type, e.g. H100-80GB, to check memory); 0 for CPU nodes.",
                )
            per_node = len(local.hosts[0].gpus)
        if per_node < 0:
            raise ConfigError(f"--gpus-per-node must be 0 or more, got {per_node}")
        name, memory = "unknown", None
        if args.gpu_type:
            spec = find_gpu_spec(args.gpu_type)
            if spec is None:
                raise ConfigError(
                    f"unknown --gpu-type {args.gpu_type!r}",
                    hint="Known: H100-80GB, H200, A100-80GB, L20, L40S, A10G, …",
                )
            name, memory = spec.name, int(spec.memory_gib * GIB)
        elif local.hosts[0].gpus:
            name, memory = local.hosts[0].gpus[0].name, local.hosts[0].gpus[0].memory_bytes
        gpus = tuple(Gpu(visible_id=str(i), name=name, memory_bytes=memory) for i in range(per_node))
        hosts = tuple(Host(name=f"node{i + 1}", gpus=gpus) for i in range(args.nodes))
        warnings = () if memory or not per_node else ("GPU model unknown (pass --gpu-type): memory not checked",)
        return Topology(hosts, "sbatch", warnings)

    def request(self, recipe: Recipe, plan: Plan, args: argparse.Namespace, ctx: RunContext) -> Submission:
        from grpo_launch.backends.slurm.sbatch import SbatchRequest, render_sbatch_script

        request = SbatchRequest(
            recipe=os.path.abspath(args.recipe),
            run_dir=plan.run_dir,
            workdir=ctx.workdir,
            python=ctx.python,
            nodes=args.nodes,
            gpus_per_node=len(plan.topology.hosts[0].gpus),
            overrides=tuple(args.overrides),
            job_name=args.job_name,
            partition=args.partition,
            time=args.time,
            account=args.account,
            extra_args=tuple(args.extra),
        )
        return Submission(
            render_sbatch_script(request),
            os.path.join(plan.run_dir, SBATCH_SCRIPT),
            summary=f"{args.nodes} node(s), plan {plan.topology.describe()}",
        )

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        from grpo_launch.backends.slurm.sbatch import submit_batch_script

        return submit_batch_script(submission.path, cwd=ctx.workdir)
