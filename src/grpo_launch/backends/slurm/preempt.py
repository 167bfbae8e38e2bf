"""How a Slurm job is stopped, and what grpo-launch can save before it (pure parsers plus one ``scontrol`` read).

What Slurm sends (22.05, seen on the test cluster, scripts/slurm_cluster.sh):

- **Preemption** (``PreemptMode=REQUEUE``) with the partition's ``GraceTime``: SIGTERM to every task of every step
  (the trainers, the vLLM server), not to the batch shell; after GraceTime the job is ended as below and requeued.
  The steps hold SIGTERM (:mod:`grpo_launch.node.shim` ``--hold-term``) and the trainers turn it into a checkpoint
  request; grpo-launch then requeues the job itself, so the requeued job resumes at the next step.
- **The job's end** (``scontrol requeue``, ``scancel``, the end of GraceTime, the time limit): SIGCONT and SIGTERM
  to every process of the job, batch shell included, SIGKILL ``KillWait`` seconds later. Each ``srun`` client
  turns its own SIGTERM into a SIGKILL of its step's tasks at once ("srun: forcing job termination"), so no
  checkpoint can be made then: grpo-launch stops at once and says how to save first (a GraceTime for preemption,
  ``scancel --signal=USR2 --batch`` before a cancel).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping

from grpo_launch.backends.slurm.env import run_scontrol, slurm_values

STOP_MARGIN_S = 5.0  # of the platform's grace, kept for grpo-launch's own exit after the trainers stop

AT_ONCE = (
    "Slurm ends the job (scancel, scontrol requeue, the end of a preemption's GraceTime or the time limit) and each "
    "srun step is killed at once with it: no checkpoint can be saved now. To save one first: give the partition a "
    "GraceTime (preemption then signals the trainers, which checkpoint), or stop with scancel --signal=USR2 --batch "
    "JOBID (checkpoint and requeue)"
)


def kill_wait_of(config_text: str) -> float | None:
    """``KillWait = 30 sec`` of ``scontrol show config``, in seconds."""
    m = re.search(r"^KillWait\s*=\s*(\d+)", config_text, re.M | re.ASCII)
    return float(m.group(1)) if m else None


def grace_time_of(partition_text: str) -> float | None:
    """``GraceTime=N`` (seconds) of ``scontrol show partition NAME -o``; None when absent."""
    m = re.search(r"(?:^|\s)GraceTime=(\d+)(?:\s|$)", partition_text, re.ASCII)
    return float(m.group(1)) if m else None


def stop_grace(grace_time: float | None, kill_wait: float | None) -> tuple[float, str] | None:
    """The seconds grpo-launch waits for the trainers' checkpoint, and why: the partition's GraceTime (what a
    preemption leaves), else KillWait (what the job's end leaves), less :data:`STOP_MARGIN_S`; None if neither was
    read."""
    for value, what in ((grace_time, "the partition's GraceTime"), (kill_wait, "the cluster's KillWait")):
        if value:
            return max(1.0, value - STOP_MARGIN_S), f"{what} {value:.0f} s, less {STOP_MARGIN_S:.0f} s to stop"
    return None


def read_stop_grace(environ: Mapping[str, str]) -> tuple[float, str] | None:
    """:func:`stop_grace` for the job's partition (``SLURM_JOB_PARTITION``), read with ``scontrol``."""
    partition = slurm_values(environ).get("partition", "").split(",")[0]
    part_text = run_scontrol(["show", "partition", partition, "-o"]) if partition else None
    config_text = run_scontrol(["show", "config"])
    return stop_grace(grace_time_of(part_text or ""), kill_wait_of(config_text or ""))


def stops_at_once(signum: int) -> str | None:
    """SIGTERM to grpo-launch is the job's end (see the module's docstring); other signals wait for a checkpoint."""
    return AT_ONCE if signum == signal.SIGTERM else None
