"""Slurm's environment, read through one table, and ``scontrol`` (the only Slurm command the job side runs to
read its allocation)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

# Every Slurm variable grpo-launch reads, in one place.
SLURM_VARIABLES = {
    "job_id": "SLURM_JOB_ID",
    "nodelist": "SLURM_JOB_NODELIST",
    "num_nodes": "SLURM_JOB_NUM_NODES",
    "gpus_on_node": "SLURM_GPUS_ON_NODE",
    "gpus_per_node": "SLURM_GPUS_PER_NODE",
    "job_gpus": "SLURM_JOB_GPUS",
    "node_name": "SLURMD_NODENAME",
    "cpus_per_node": "SLURM_JOB_CPUS_PER_NODE",
    "mem_per_node": "SLURM_MEM_PER_NODE",  # MB, from --mem
    "mem_per_cpu": "SLURM_MEM_PER_CPU",  # MB, from --mem-per-cpu
    "partition": "SLURM_JOB_PARTITION",  # its GraceTime: what a preemption leaves for a checkpoint
}


def slurm_values(environ: Mapping[str, str]) -> dict[str, str]:
    """The Slurm variables that are set, by their short names."""
    return {k: environ[v] for k, v in SLURM_VARIABLES.items() if environ.get(v)}


def run_scontrol(args: Sequence[str]) -> str | None:
    """``scontrol ARGS`` output, or None when scontrol is missing or fails (callers fall back to the variables)."""
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
