"""What a trainer rank reads from the environment it was started in, read once: :class:`JobEnvironment`.

Built by the training entry from ``os.environ`` and passed down (as submitit's ``JobEnvironment`` reads Slurm's
variables through one table instead of ``getenv`` calls scattered around); no other module of the training entry
reads these variables. The launcher's own variables are named in :mod:`grpo_launch.rundir.layout`, which also reads
the run directory (``RunPaths.from_environ``). Standard library only; writing environment defaults for the libraries
(TQDM_DISABLE, WANDB_DIR, …) is not reading and stays where it is done.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from grpo_launch.rundir.layout import ATTEMPT_ENV, RESUME_ENV, RUN_NAME_ENV, VLLM_TOKEN_ENV, RunPaths
from grpo_launch.spec import frozen

# torchrun's variables (torch.distributed.run, "Environment variables"): the global rank, the rank on its node and
# the node's rank (GROUP_RANK, the agent's group, one per node); Slurm's name of the node (SLURMD_NODENAME: the
# name the launcher prints for a node, which a container's hostname may not match); CUDA's visible devices.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
NODE_RANK = "GROUP_RANK"
SLURM_NODE_NAME = "SLURMD_NODENAME"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def _int(environ: Mapping[str, str], name: str) -> int:
    """A rank variable, 0 when unset or empty (a process started without torchrun is rank 0 of one)."""
    value = environ.get(name, "").strip()
    try:
        return int(value) if value else 0
    except ValueError:
        raise ValueError(f"{name}={value!r} in the environment is not a rank (an integer)") from None


class Secret(str):
    """A string whose repr hides it (the value itself is unchanged: str(), f-strings and comparisons see it)."""

    def __repr__(self) -> str:
        return "Secret('***')"


@frozen
class JobEnvironment:
    """One trainer rank's view of its job: who it is, where, on which devices, and what grpo-launch decided for it.

    ``resume`` is the launcher's decision (the same for every rank): a checkpoint path, ``NO_RESUME`` ("none") for a
    fresh start, or None when grpo-launch did not decide (the Trainer's own way then: the newest checkpoint in
    output_dir). ``paths`` is None when grpo-launch did not start the process (no run directory). ``attempt``: the
    attempt's number in the run, which every metrics record carries (None: not started by grpo-launch);
    ``run_name``: the run's tracking name (:class:`~grpo_launch.rundir.tracking.TrackingRecord`), the same in every
    attempt; ``vllm_token``: the attempt's token for the vLLM server's guard (:mod:`grpo_launch.train.server_auth`),
    None without a server; a :class:`Secret`, so that a printed or logged JobEnvironment does not show it."""

    rank: int
    local_rank: int
    node_rank: int
    node: str
    visible_devices: tuple[str, ...]
    resume: str | None
    paths: RunPaths | None
    attempt: int | None = None
    run_name: str | None = None
    vllm_token: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], hostname: str | None = None) -> JobEnvironment:
        """Read once from ``environ``. ``hostname`` names the node when Slurm does not (default: this host's)."""
        visible = environ.get(VISIBLE_DEVICES, "")
        return cls(
            rank=_int(environ, RANK),
            local_rank=_int(environ, LOCAL_RANK),
            node_rank=_int(environ, NODE_RANK),
            node=environ.get(SLURM_NODE_NAME) or hostname or os.uname().nodename,
            visible_devices=tuple(t.strip() for t in visible.split(",") if t.strip()),
            resume=environ.get(RESUME_ENV),
            paths=RunPaths.from_environ(environ),
            attempt=_int(environ, ATTEMPT_ENV) or None,
            run_name=environ.get(RUN_NAME_ENV) or None,
            vllm_token=Secret(environ[VLLM_TOKEN_ENV]) if environ.get(VLLM_TOKEN_ENV) else None,
        )

    @property
    def is_rank_zero(self) -> bool:
        """Rank 0 speaks for the run on the console; the other ranks write their own log files."""
        return self.rank == 0

    def device_token(self, index: int) -> str:
        """How NVML names CUDA device ``index`` of this process: its entry of CUDA_VISIBLE_DEVICES (an index, or a
        ``GPU-``/``MIG-`` UUID), else the index itself (all devices visible)."""
        return self.visible_devices[index] if index < len(self.visible_devices) else str(index)
