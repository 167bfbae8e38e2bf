"""The contract between the launcher and the processes it starts, in one place (standard library only): every
environment variable grpo-launch sets for them, the line a remote shim announces its process group with, and
every file of a run directory (:class:`RunPaths`). The launcher, the trainers, ``status``, ``report`` and the node
programs name these files and variables only through this module."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from grpo_launch.spec import frozen

# The environment every process of a run gets.
RUN_DIR_ENV = "GRPO_LAUNCH_RUN_DIR"  # the run directory: the trainers find their control files and logs there
RUN_ID_ENV = "GRPO_LAUNCH_RUN_ID"  # marks every descendant, so teardown finds them all (grpo_launch.node.reaper)
GRACE_ENV = "GRPO_LAUNCH_GRACE_S"  # launch.grace_period_s: how long a host's guard waits after SIGTERM before SIGKILL
STOP_NOTICE_ENV = "GRPO_LAUNCH_STOP_NOTICE"  # "SECONDS WHY": a platform's notice before it kills the run (spot)
SPAWNED_AT_ENV = "GRPO_LAUNCH_SPAWNED_AT"  # wall clock when the launcher started a process (its start phase)
RESUME_ENV = "GRPO_LAUNCH_RESUME"  # the checkpoint every rank resumes from, or "none"
NO_RESUME = "none"
ATTEMPT_ENV = "GRPO_LAUNCH_ATTEMPT"  # the attempt's number in the run (1, 2, … over restarts and resumes)
RUN_NAME_ENV = "GRPO_LAUNCH_RUN_NAME"  # the tracking run's name (TrackingRecord.name), kept over every attempt
CALIBRATIONS_ENV = "GRPO_LAUNCH_CALIBRATIONS"  # where grpo-launch calibrate stores and plan finds (tests)
VLLM_TOKEN_ENV = "GRPO_LAUNCH_VLLM_TOKEN"  # the attempt's vLLM server token (grpo_launch.node.vllm_guard)
VLLM_RESTARTED_ENV = "GRPO_LAUNCH_VLLM_RESTARTED"  # "1": a replacement server, locked until the weights arrive
HOLD_SIGTERM_ENV = "GRPO_LAUNCH_HOLD_SIGTERM"  # node.shim --hold-term: a trainer rank turns SIGTERM into a stop request
# The SkyPilot task's own (backends/skypilot/task.py): its setup and run sections read them on every node, and
# `sky launch --env NAME=VALUE` overrides them.
NODE_PYTHON_ENV = "GRPO_LAUNCH_PYTHON"  # the Python that installs and runs grpo-launch on each node
RAY_PORT_ENV = "GRPO_LAUNCH_RAY_PORT"  # the user Ray head's port (SkyPilot's own Ray has 6380)
RAY_JOIN_TIMEOUT_ENV = "GRPO_LAUNCH_RAY_JOIN_TIMEOUT"  # seconds the head waits for every node to join
RAY_CLIENT_PORT_ENV = "GRPO_LAUNCH_RAY_CLIENT_PORT"  # the head's Ray client server port

# The umask of every process of a run (the launcher's own while it runs, grpo_launch.node.shim's on other hosts):
# what they create (checkpoints, logs, vLLM's IPC sockets) is its user's alone, whatever the login's umask.
PRIVATE_UMASK = 0o077

# grpo_launch.node.shim prints this, then its process-group id, so the launcher can stop the remote tree.
PGID_ANNOUNCE = "[grpo-launch-task] pgid="


def announced_pgid(line: str) -> int | None:
    """The process group a shim's announcement names, or None. Only a group of its own is accepted: the launcher
    later runs ``kill -- -PGID`` on that host, and ``kill -- -1`` signals every process of the user there (0, or a
    negative or non-decimal value, is no group of the shim's either). The launcher reads it only from the first line
    of the shim's output."""
    if not line.startswith(PGID_ANNOUNCE):
        return None
    value = line[len(PGID_ANNOUNCE) :].strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 10:
        return None
    pgid = int(value)
    return pgid if pgid > 1 else None


# Written by the training entry into output_dir after the final save (a finished run is not trained again).
COMPLETE_MARKER = "grpo_launch_complete.json"


@frozen
class RunPaths:
    """Every file of a run directory, by what it is."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RunPaths | None:
        """The run directory a process was started for (None when grpo-launch did not start it)."""
        value = environ.get(RUN_DIR_ENV)
        return cls(value) if value else None

    # What the launcher writes before anything starts (render/ makes the text).
    @property
    def plan_json(self) -> Path:
        return self.root / "plan.json"

    @property
    def invocation(self) -> Path:
        """The command that started the run (:class:`.invocation.Invocation`): ``grpo-launch resume`` runs it again."""
        return self.root / "invocation.json"

    @property
    def accelerate_config(self) -> Path:
        return self.root / "accelerate_config.yaml"

    @property
    def deepspeed_config(self) -> Path:
        return self.root / "deepspeed.json"

    @property
    def trainer_recipe(self) -> Path:
        return self.root / "trainer_recipe.yaml"

    @property
    def tracking(self) -> Path:
        """The run's W&B run id and name, made once by its first attempt (:class:`.tracking.TrackingRecord`)."""
        return self.root / "tracking.json"

    @property
    def sbatch_script(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def plans(self) -> Path:
        """Where ``plan`` and ``--dry-run`` write their files once the run directory holds a run's record."""
        return self.root / "plans"

    @property
    def lock(self) -> Path:
        return self.root / ".grpo-launch.lock"

    @property
    def output(self) -> Path:
        """The trainers' output_dir when the recipe sets none."""
        return self.root / "output"

    @property
    def sky_task(self) -> Path:
        """The SkyPilot task ``grpo-launch sky`` writes (backends/skypilot/task.py)."""
        return self.root / "sky-task.yaml"

    @property
    def ray_job_script(self) -> Path:
        """The Ray job's entrypoint script ``grpo-launch ray-submit`` writes; the job server runs it by path
        (backends/ray/submit.py)."""
        return self.root / "ray-job.sh"

    # What the run writes while it runs.
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def launcher_log(self) -> Path:
        """The launcher's own messages, time-stamped: the plan summary, notices, restarts, the end and its cause."""
        return self.logs / "launcher.log"

    @property
    def metrics(self) -> Path:
        """Rank 0's records: one per optimizer step, per save, per logging step (:mod:`.records`)."""
        return self.root / "metrics.jsonl"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def stop_request(self) -> Path:
        """Created by the launcher: the trainers save a checkpoint at the end of the step and stop."""
        return self.control / "stop-requested"

    @property
    def stop_grace(self) -> Path:
        """Written by the launcher at an attempt's start: how long a stop waits for a checkpoint, and why."""
        return self.control / "stop-grace"

    @property
    def stopped_marker(self) -> Path:
        """Written by rank 0 when it stopped on request: the step it stopped after."""
        return self.control / "stopped-at-step"

    @property
    def attempts(self) -> Path:
        """One record per supervised attempt, written by the launcher (:class:`.records.Attempt`)."""
        return self.control / "attempts.jsonl"

    @property
    def stacks(self) -> Path:
        """Each trainer rank's Python stack, dumped there on SIGUSR1 (the hang watchdog)."""
        return self.control / "stacks"

    def rank_stack(self, rank: int | str) -> Path:
        return self.stacks / f"rank-{rank}.txt"

    def rank_stacks(self) -> dict[str, Path]:
        """The stack files the trainer ranks have dumped, by rank."""
        return {f.stem.removeprefix("rank-"): f for f in sorted(self.stacks.glob("rank-*.txt"))}

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    def relative(self, path: Path) -> str:
        """A file of the run directory as its path under it (the keys of render_files)."""
        return str(path.relative_to(self.root))
