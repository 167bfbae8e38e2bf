"""``grpo-launch sbatch``: the batch script (a pure renderer) and its submission.

Why the script looks the way it does:

- ``--signal=B:USR2@90``: 90 s before the time limit Slurm signals the batch shell only. The script ``exec``s
  grpo-launch, so grpo-launch receives it and asks the trainers to save a checkpoint and stop. Without ``B:``
  Slurm signals every process of every step, and torchrun's agent dies of an unhandled SIGUSR2.
- ``--requeue`` + ``--open-mode=append``: after that checkpoint grpo-launch requeues the job (same job id, log
  appended); the requeued run resumes from the newest checkpoint in output_dir. A preemption (PreemptMode=REQUEUE)
  sends SIGTERM to the trainers' steps first, for the partition's GraceTime: they save a checkpoint at the end of
  the step in flight, grpo-launch requeues the job, and it resumes at the next step (:mod:`.preempt`). The
  partition's GraceTime must cover a step and a save; without one Slurm kills the steps at once.
- ``--exclusive`` and one task per node: grpo-launch starts its own steps (``srun -w NODE``), one per process
  group, and they share the node's CPUs and GPUs (``--overlap``); each narrows CUDA_VISIBLE_DEVICES to its planned
  GPUs with :mod:`grpo_launch.node.shim`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import field

from grpo_launch import __version__
from grpo_launch.errors import ConfigError, LaunchError, ProbeError
from grpo_launch.rundir.shown_text import command_line
from grpo_launch.spec import frozen

PREEMPT_SIGNAL = "USR2"
PREEMPT_WARNING_S = 90
# sbatch --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED.
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|unlimited|INFINITE|infinite)$", re.ASCII)


@frozen
class SbatchRequest:
    """What ``grpo-launch sbatch`` submits. Paths are absolute; ``python`` runs grpo-launch on the nodes."""

    recipe: str
    run_dir: str
    workdir: str
    python: str
    nodes: int
    gpus_per_node: int = 0
    overrides: tuple[str, ...] = ()
    job_name: str | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def check_request(req: SbatchRequest) -> None:
    """Refuse values the script cannot carry safely, all at once."""
    problems: list[str] = []
    named: list[tuple[str, str | None]] = [
        ("recipe path", req.recipe),
        ("--run-dir", req.run_dir),
        ("working directory", req.workdir),
        ("python", req.python),
        ("--job-name", req.job_name),
        ("--partition", req.partition),
        ("--time", req.time),
        ("--account", req.account),
        *((f"override {o.split('=', 1)[0]!r}", o) for o in req.overrides),
        *(("extra sbatch argument", a) for a in req.extra_args),
        *((f"environment variable {k}", v) for k, v in req.env.items()),
    ]
    for what, value in named:
        if value is not None and ("\n" in value or "\r" in value or "\0" in value):
            problems.append(f"{what} contains a line break or NUL byte: {value!r}")
    # sbatch reads #SBATCH values with shell-like quoting but drops backslashes.
    for what, value in (("--job-name", req.job_name), ("--run-dir", req.run_dir), ("working directory", req.workdir)):
        if value and "\\" in value:
            problems.append(f"{what} contains a backslash, which sbatch drops from #SBATCH lines: {value!r}")
    if req.job_name is not None and not req.job_name.strip():
        problems.append("--job-name is empty: give a name, or leave it out for grpo-RECIPE")
    if req.nodes < 1:
        problems.append(f"--nodes must be at least 1, got {req.nodes}")
    if req.gpus_per_node < 0:
        problems.append(f"--gpus-per-node must be 0 or more, got {req.gpus_per_node}")
    if req.time is not None and not _TIME.match(req.time):
        problems.append(f"--time {req.time!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM, …)")
    for what, value in (("--partition", req.partition), ("--account", req.account)):
        if value is not None and not re.match(r"^[A-Za-z0-9_.,-]+$", value):
            problems.append(f"{what} {value!r} has characters Slurm names do not use")
    for k in req.env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            problems.append(f"environment variable name {k!r} is not valid")
    if problems:
        raise ConfigError("cannot write the sbatch script:", problems=problems)


def default_job_name(recipe_path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", recipe_path.rsplit("/", 1)[-1].rsplit(".", 1)[0]).strip("-")
    return f"grpo-{stem or 'run'}"


def _slurm_filename(path: str) -> str:
    """A path for --output: Slurm expands ``%x`` patterns, so a literal ``%`` is doubled."""
    return path.replace("%", "%%")


def render_sbatch_script(req: SbatchRequest) -> str:
    """The batch script: readable, resubmittable with plain ``sbatch``, every value shell-quoted."""
    check_request(req)
    q = shlex.quote
    name = req.job_name or default_job_name(req.recipe)
    directives = [
        f"--job-name={q(name)}",
        f"--nodes={req.nodes}",
        "--ntasks-per-node=1",
        "--exclusive",
    ]
    if req.gpus_per_node:
        directives.append(f"--gpus-per-node={req.gpus_per_node}")
    for opt, value in (("partition", req.partition), ("time", req.time), ("account", req.account)):
        if value:
            directives.append(f"--{opt}={q(value)}")
    directives += [
        f"--output={q(_slurm_filename(req.run_dir) + '/slurm-%j.out')}",
        "--open-mode=append",
        f"--chdir={q(req.workdir)}",
        f"--signal=B:{PREEMPT_SIGNAL}@{PREEMPT_WARNING_S}",
        "--requeue",
    ]
    command = [
        req.python,
        "-m",
        "grpo_launch",
        "run",
        "--slurm",
        req.recipe,
        *req.overrides,
        "--run-dir",
        req.run_dir,
    ]
    lines = [
        "#!/bin/bash",
        f"# GRPO job written by grpo-launch {__version__} for {req.recipe}.",
        "# Inside the allocation grpo-launch plans across the nodes, starts the vLLM server and the trainers with",
        "# srun (one step per node, each with its machine rank), and tears them down on failure, scancel or the time",
        f"# limit. SIG{PREEMPT_SIGNAL} {PREEMPT_WARNING_S} s before the limit: checkpoint, then requeue and resume.",
        "# Preemption (PreemptMode=REQUEUE): SIGTERM to the trainers during the partition's GraceTime (it must cover",
        "# a step and a checkpoint save): checkpoint at the end of the step, requeue, resume at the next step.",
        *(f"#SBATCH {d}" for d in directives),
        *(f"#SBATCH {q(a)}" for a in req.extra_args),
        "",
        "set -euo pipefail",
        *(f"export {k}={q(v)}" for k, v in req.env.items()),
        'echo "[grpo-launch] job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST} (restart ${SLURM_RESTART_COUNT:-0})"',
        "exec " + " ".join(q(c) for c in command),
        "",
    ]
    return "\n".join(lines)


def parse_job_id(sbatch_stdout: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    text = sbatch_stdout.strip().splitlines()[-1] if sbatch_stdout.strip() else ""
    job = text.split(";", 1)[0]
    if not (job.isascii() and job.isdigit()):
        raise ProbeError(f"cannot read a job id from sbatch's output {sbatch_stdout!r}")
    return job


# What sbatch says when Slurm is installed but not set up (no slurm.conf, no configless source) or its controller is
# down (Slurm's src/common/read_config.c and src/sbatch/sbatch.c messages): no job option can fix that.
NOT_CONFIGURED = re.compile(
    r"slurm\.conf|configuration file|could not establish a configuration source|unable to contact slurm controller|"
    r"unable to establish a connection|slurm_load_partitions|Zero Bytes were transmitted",
    re.IGNORECASE,
)


def sbatch_hint(said: str, path: str) -> str:
    """What to do about sbatch's refusal: Slurm's own set-up, or the job's options."""
    if NOT_CONFIGURED.search(said):
        return (
            "Slurm is installed here but not set up or not reachable (no slurm.conf, SLURM_CONF, or a controller that "
            f"answers): check `sinfo` and `scontrol ping`, or submit from a login node: sbatch {path}"
        )
    return f"The script is {path}; fix the option sbatch names (partition, account, time, GPUs per node)."


def submit_batch_script(path: str, *, cwd: str) -> str:
    """``sbatch --parsable PATH`` → the job id."""
    try:
        done = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True, cwd=cwd, timeout=120)
    except FileNotFoundError:
        raise LaunchError(
            "sbatch not found: this machine is not a Slurm submit host",
            hint=f"Run on a login node, or submit the written script there: {command_line(['sbatch', path])}",
        ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError("sbatch did not answer within 120 s", hint="Is slurmctld reachable? Try `sinfo`.") from None
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        raise LaunchError(f"sbatch refused the job: {said}", hint=sbatch_hint(said, path))
    return parse_job_id(done.stdout)


def requeue_slurm_job(job_id: str) -> None:
    try:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot requeue Slurm job {job_id}: {exc}") from None
    if done.returncode != 0:
        raise LaunchError(
            f"cannot requeue Slurm job {job_id}: {done.stderr.strip() or done.stdout.strip()}",
            hint="The checkpoint is saved: resubmit the same script (sbatch RUN_DIR/job.sbatch) to resume. "
            "Jobs must be submitted with --requeue (grpo-launch sbatch does) and JobRequeue allowed.",
        )
