"""Hostfile runs over ssh, pure parts: the ssh command, a process wrapped to run on its host, and the check that
every host is reachable and has the same environment. The I/O lives in :mod:`grpo_launch.execute`.

Each remote process runs as ``ssh HOST -- 'cd WORKDIR && exec PYTHON -m grpo_launch.task --announce-pgid
--env-stdin --gpus P -- env K=V … COMMAND'``:

- the shim starts a new session and prints its process-group id, so teardown can signal the whole remote tree
  (``ssh HOST kill -TERM -- -PGID``): a killed ssh client does not stop a remote process that has no tty;
- variables from :data:`PASSED_ENV` travel on ssh's stdin, never on a command line or in a file (HF_TOKEN, …);
- the planned GPU positions select from the host's own CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grpo_launch.render import ProcessSpec

# Variables passed from the launcher's environment to every remote process (through stdin). Exact names, or
# prefixes ending in ``*``. Anything else stays local; add more with launch.train_env / launch.vllm_env.
PASSED_ENV: tuple[str, ...] = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "WANDB_*",
    "NCCL_*",
    "GLOO_*",
    "TORCH_*",
    "PYTHONPATH",
    "TMPDIR",
    "VLLM_*",
)


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None
    identity: str | None = None
    config: str | None = None  # ssh -F FILE
    options: tuple[str, ...] = ()  # -o KEY=VALUE
    connect_timeout_s: int = 10

    def argv(self, host: str) -> list[str]:
        """``ssh … HOST`` in batch mode (never a password prompt) with a connect timeout."""
        argv = ["ssh"]
        if self.config:
            argv += ["-F", self.config]
        argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}", "-o", "LogLevel=ERROR"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.identity:
            argv += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        for o in self.options:
            argv += ["-o", o]
        return [*argv, host]


def passed_env_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The names of :data:`PASSED_ENV` set in ``environ``, sorted."""
    return tuple(sorted(k for k in environ if any(fnmatch.fnmatchcase(k, p) for p in PASSED_ENV)))


def remote_command(
    spec: ProcessSpec, *, python: str, workdir: str, gpu_positions: Sequence[str] | None, stdin_env: bool
) -> str:
    """The shell line run on the remote host for ``spec``."""
    task = [python, "-m", "grpo_launch.task", "--announce-pgid"]
    if stdin_env:
        task.append("--env-stdin")
    if gpu_positions is not None:
        task += ["--gpus", ",".join(gpu_positions)]
    env = [f"{k}={v}" for k, v in spec.env.items() if k != "CUDA_VISIBLE_DEVICES"]
    command = [*task, "--", *(["env", *env] if env else []), *spec.argv]
    return f"cd {shlex.quote(workdir)} && exec {shlex.join(command)}"


def ssh_spec(
    spec: ProcessSpec,
    ssh: SshOptions,
    *,
    python: str,
    workdir: str,
    stdin_env: Sequence[str],
    gpu_positions: Sequence[str] | None,
) -> ProcessSpec:
    """``spec`` run on ``spec.host`` through ssh; ``stdin_env`` names the variables sent on stdin."""
    assert spec.host, "ssh_spec needs a host"
    line = remote_command(spec, python=python, workdir=workdir, gpu_positions=gpu_positions, stdin_env=bool(stdin_env))
    return ProcessSpec(
        name=spec.name,
        argv=(*ssh.argv(spec.host), "--", line),
        env={},
        host=spec.host,
        log_file=spec.log_file,
        stdin_env=tuple(stdin_env),
        signal_argv=(*ssh.argv(spec.host), "--", "kill -{sig} -- -{pgid}"),
    )


def check_command(python: str, workdir: str, paths: Sequence[str]) -> str:
    """A remote shell line that prints grpo-launch's version and which of ``paths`` are missing (JSON)."""
    code = (
        "import json, os, sys\n"
        "try:\n"
        "    import grpo_launch\n"
        "    version = grpo_launch.__version__\n"
        "except Exception as exc:\n"
        "    version = None\n"
        f"missing = [p for p in {list(paths)!r} if not os.path.exists(p)]\n"
        "print(json.dumps({'version': version, 'missing': missing, 'host': os.uname().nodename}))\n"
    )
    q = shlex.quote
    return (
        f"cd {q(workdir)} 2>/dev/null || {{ echo {q('no directory ' + workdir)}; exit 3; }}; "
        f"test -x {q(python)} || {{ echo {q('no python at ' + python)}; exit 4; }}; "
        f"exec {q(python)} -c {q(code)}"
    )
