"""Processes as data, the bottom layer: a ProcessSpec to start (planning output becomes ProcessSpecs in
:mod:`grpo_launch.commands`, backends place them on their hosts, the supervisor runs them), and the RunResult a run
ends with (the CLI turns it into an exit code)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from grpo_launch.enums import Role, StrEnum
from grpo_launch.errors import GrpoLaunchError


@dataclass(frozen=True)
class ProcessSpec:
    """One process: argv, the environment it adds to the parent's, where it runs and which GPUs it may use.

    ``gpus`` are the planned GPU ids on ``host`` (visible ids: indices or UUIDs as the host names them); None
    leaves CUDA_VISIBLE_DEVICES as inherited, () hides every GPU. A local backend turns them into
    CUDA_VISIBLE_DEVICES; a remote one hands them to :mod:`grpo_launch.task` as positions.
    """

    name: str  # vllm | train | train@host
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None  # None: this machine
    role: Role = Role.TRAIN
    gpus: tuple[str, ...] | None = None
    # Names of variables sent on stdin as KEY=JSON lines (secrets: never on a command line or in a file).
    stdin_env: tuple[str, ...] = ()
    # The process announces the id of a process group on a remote host (grpo_launch.task --announce-pgid), and
    # teardown must signal that group there: killing the local client (ssh) does not stop it.
    remote_group: bool = False

    @property
    def launch_env(self) -> dict[str, str]:
        """The variables added to the parent's environment, CUDA_VISIBLE_DEVICES from ``gpus`` included."""
        env = dict(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env

    def shell(self) -> str:
        """The command as one shell line (env assignments first), for --dry-run and docs."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.launch_env.items())
        line = (env + " " if env else "") + shlex.join(self.argv)
        if self.stdin_env:
            line += f"  # on stdin: {', '.join(self.stdin_env)}"
        return line


class RunState(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    STOPPED_FOR_CHECKPOINT = "stopped-for-checkpoint"


@dataclass(frozen=True)
class RunResult:
    """How a run ended. ``exit_code`` is what the CLI returns: 0, 1 for a failure, 128+N after signal N.

    For a failure ``message`` names the failing process and its log, ``detail`` holds the root cause and the log's
    last lines."""

    state: RunState
    exit_code: int
    message: str = ""
    detail: str | None = None
    failed_process: str | None = None
    log: str | None = None
    stopped_at_step: int | None = None
    failure: str | None = None  # a grpo_launch.faults.FailureKind value: user, infra, oom, disk-full, hang
    cause: str | None = None  # the root cause line, with where it happened
    restarts: int = 0

    @property
    def ok(self) -> bool:
        return self.state in (RunState.SUCCEEDED, RunState.STOPPED_FOR_CHECKPOINT)

    @classmethod
    def failed(cls, exc: GrpoLaunchError, process: str | None, log: str | None) -> RunResult:
        return cls(RunState.FAILED, 1, message=exc.message, detail=exc.hint, failed_process=process, log=log)
