"""The outside half of the Slurm backend: ``grpo-launch sbatch RECIPE --nodes N`` plans for the requested allocation,
renders the batch script (:mod:`.sbatch`) into the run directory and submits it."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BackendOptions, option
from grpo_launch.backends.slurm.sbatch import SbatchRequest, render_sbatch_script, submit_batch_script
from grpo_launch.backends.submission import BaseSubmitter, Planned, Submission, SubmitJob
from grpo_launch.errors import ConfigError, short
from grpo_launch.machines.gpus import GIB, find_gpu_spec
from grpo_launch.machines.topology import MAX_GPUS_PER_NODE, MAX_NODES, Gpu, Host, Topology
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.spec import frozen

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan
    from grpo_launch.recipe import Recipe
    from grpo_launch.spec import RunContext


@frozen
class SbatchOptions(BackendOptions):
    """What ``grpo-launch sbatch`` asks Slurm for."""

    nodes: int = option("--nodes", "number of nodes", default=0, type=int, required=True)
    gpus_per_node: int | None = option(
        "--gpus-per-node", "GPUs per node (default: this machine's count; 0 for CPU-only nodes)", type=int
    )
    gpu_type: str | None = option(
        "--gpu-type", "GPU model to plan for, e.g. H100-80GB (default: this machine's GPU)", metavar="MODEL"
    )
    partition: str | None = option("--partition", "Slurm partition")
    time: str | None = option("--time", "time limit (sbatch --time format, e.g. 04:00:00 or 1-00:00)")
    account: str | None = option("--account", "Slurm account")
    job_name: str | None = option("--job-name", "job name (default: grpo-RECIPE)")


class SlurmSubmitter(BaseSubmitter[SbatchOptions]):
    """``grpo-launch sbatch``: plan for the requested allocation, write RUN_DIR/job.sbatch, submit it."""

    Options: ClassVar[type[BackendOptions]] = SbatchOptions
    description: ClassVar[str] = (
        "Plan for N nodes × G GPUs, write RUN_DIR/job.sbatch and submit it. Inside the job grpo-launch plans for the "
        "real allocation, starts the vLLM server and one trainer step per node with srun, and tears everything down "
        "on failure, scancel or the time limit. 90 s before the limit (SIGUSR2) the trainers save a checkpoint and "
        "the job requeues itself; the requeued run resumes from it. A preemption (PreemptMode=REQUEUE) sends SIGTERM "
        "to the trainers within the partition's GraceTime: they save a checkpoint at the end of the step and the job "
        "requeues itself the same way (give the partition a GraceTime that covers a step and a save). Arguments "
        "after `--` go to sbatch unchanged."
    )
    run_dir_help: ClassVar[str] = "run directory on a file system all nodes share"

    @classmethod
    def adjusted(cls, options: SbatchOptions, recipe: Recipe, ctx: RunContext, *, dry_run: bool) -> SbatchOptions:
        if recipe.values.get("use_cpu") is True and options.gpus_per_node is None:
            return dataclasses.replace(options, gpus_per_node=0)  # the recipe asks for CPU nodes
        return options

    @classmethod
    def requested_topology(cls, options: SbatchOptions, local: Topology) -> Topology:
        """--nodes × --gpus-per-node GPUs of one model (by default this machine's count and model)."""
        if not 1 <= options.nodes <= MAX_NODES:
            raise ConfigError(f"--nodes must be between 1 and {MAX_NODES}, got {options.nodes}")
        per_node = options.gpus_per_node
        if per_node is None:
            if local.is_cpu:
                raise ConfigError(
                    "how many GPUs per node? This machine has none to copy the count from",
                    hint="Pass --gpus-per-node G (and --gpu-type, e.g. H100-80GB, to check memory); 0 for CPU nodes.",
                )
            per_node = len(local.hosts[0].gpus)
        if not 0 <= per_node <= MAX_GPUS_PER_NODE:
            raise ConfigError(f"--gpus-per-node must be between 0 and {MAX_GPUS_PER_NODE}, got {per_node}")
        name, memory = "unknown", None
        if options.gpu_type is not None:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 _.-]*", options.gpu_type):
                raise ConfigError(
                    f"--gpu-type {short(options.gpu_type)} is not a GPU model name",
                    hint="Known: H100-80GB, H200, A100-80GB, L20, L40S, A10G, …",
                )
            spec = find_gpu_spec(options.gpu_type)
            if spec is None:
                raise ConfigError(
                    f"unknown --gpu-type {options.gpu_type!r}",
                    hint="Known: H100-80GB, H200, A100-80GB, L20, L40S, A10G, …",
                )
            name, memory = spec.name, int(spec.memory_gib * GIB)
        elif local.hosts[0].gpus:
            name, memory = local.hosts[0].gpus[0].name, local.hosts[0].gpus[0].memory_bytes
        gpus = tuple(Gpu(visible_id=str(i), name=name, memory_bytes=memory) for i in range(per_node))
        hosts = tuple(Host(name=f"node{i + 1}", gpus=gpus) for i in range(options.nodes))
        warnings = () if memory or not per_node else ("GPU model unknown (pass --gpu-type): memory not checked",)
        naming = "name the nodes' GPUs: --gpus-per-node 8 --gpu-type H100-80GB"
        return Topology(hosts, "sbatch", warnings, naming_gpus=naming, planned_again_at_start=True)

    def request(self, job: SubmitJob, plan: Plan, options: SbatchOptions, ctx: RunContext) -> Submission:
        request = SbatchRequest(
            recipe=job.recipe,
            run_dir=plan.run_dir,
            workdir=ctx.workdir,
            python=ctx.python,
            nodes=options.nodes,
            gpus_per_node=len(plan.topology.hosts[0].gpus),
            overrides=job.overrides,
            job_name=options.job_name,
            partition=options.partition,
            time=options.time,
            account=options.account,
            extra_args=job.extra_args,
        )
        return Submission(
            render_sbatch_script(request),
            str(RunPaths(plan.run_dir).sbatch_script),
            summary=f"{options.nodes} node(s), plan {plan.topology.describe()}",
        )

    def submit(self, submission: Submission, ctx: RunContext) -> str:
        return submit_batch_script(submission.path, cwd=ctx.workdir)

    def submitted(self, job_id: str, planned: Planned) -> list[str]:
        plan, submission = planned.plan, planned.submission
        log = f"{plan.run_dir}/slurm-{job_id}.out"
        return [
            f"submitted Slurm job {job_id}: {submission.summary}",
            f"  log:     {log} (and {plan.paths.logs}/ per process)",
            f"  script:  {submission.path}",
            f"  follow:  {command_line(['tail', '-f', log])}   cancel: {command_line(['scancel', job_id])}",
        ]
