"""A Slurm job's state as grpo-launch's typed :class:`grpo_launch.rundir.records.JobState`: Slurm's own words and
keys stop here (pure; the Backend runs ``scontrol show job -o``). ``scontrol`` rather than ``sacct``: it needs no
accounting storage (clusters without slurmdbd have none), and a job it no longer knows is ended long ago."""

from __future__ import annotations

from grpo_launch.enums import JobStatus
from grpo_launch.rundir.records import JobState

# Slurm's job states (squeue(1), "JOB STATE CODES") onto grpo-launch's; the Slurm word is kept beside it.
SLURM_STATES: dict[str, JobStatus] = {
    "PENDING": JobStatus.PENDING,
    "CONFIGURING": JobStatus.PENDING,
    "REQUEUED": JobStatus.PENDING,
    "REQUEUE_HOLD": JobStatus.PENDING,
    "REQUEUE_FED": JobStatus.PENDING,
    "RESV_DEL_HOLD": JobStatus.PENDING,
    "SUSPENDED": JobStatus.PENDING,
    "STOPPED": JobStatus.PENDING,
    "RUNNING": JobStatus.RUNNING,
    "COMPLETING": JobStatus.RUNNING,
    "RESIZING": JobStatus.RUNNING,
    "SIGNALING": JobStatus.RUNNING,
    "STAGE_OUT": JobStatus.RUNNING,
    "COMPLETED": JobStatus.COMPLETED,
    "CANCELLED": JobStatus.CANCELLED,
    "FAILED": JobStatus.FAILED,
    "TIMEOUT": JobStatus.FAILED,
    "NODE_FAIL": JobStatus.FAILED,
    "BOOT_FAIL": JobStatus.FAILED,
    "OUT_OF_MEMORY": JobStatus.FAILED,
    "DEADLINE": JobStatus.FAILED,
    "PREEMPTED": JobStatus.FAILED,
    "SPECIAL_EXIT": JobStatus.FAILED,
    "REVOKED": JobStatus.CANCELLED,
}


def job_state_of(scontrol_line: str) -> JobState | None:
    """The JobState of ``scontrol show job -o JOB``'s line (``JobState=RUNNING Restarts=0 RunTime=… ``), or None
    when it names no state."""
    fields = dict(part.split("=", 1) for part in scontrol_line.split() if "=" in part)
    word = fields.get("JobState")
    if not word:
        return None
    restarts = fields.get("Restarts", "")
    return JobState(
        state=SLURM_STATES.get(word, JobStatus.UNKNOWN),
        native=word,
        restarts=int(restarts) if restarts.isdigit() else None,
        run_time=fields.get("RunTime"),
        time_limit=fields.get("TimeLimit"),
        nodes=fields.get("NodeList"),
    )
