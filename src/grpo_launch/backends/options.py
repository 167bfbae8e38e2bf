"""Every backend's options, the command-line flags that fill them (:func:`~grpo_launch.backends.base.option`), apart
from the backends themselves: the CLI declares every backend's flags on each command, and reading a backend's module
for its options would load its whole machinery (ssh, Ray, Slurm) on ``grpo-launch plan``'s start-up."""

from __future__ import annotations

import os
import re

from grpo_launch.backends.base import BackendOptions, NoOptions, option
from grpo_launch.spec import frozen

SSH_GROUP = "hostfile hosts (ssh: probed, then run)"
# ssh -o KEYWORD=VALUE, or KEYWORD VALUE (ssh_config(5): keywords are letters and digits).
_SSH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]*(=|[ \t]+)[^\x00-\x1f]+")


@frozen
class SshOptions(BackendOptions):
    """The ssh backend's options: the hostfile, and how to reach its hosts."""

    hostfile: str | None = option(
        "--hostfile", "DeepSpeed-style hostfile (HOST slots=N [gpu=MODEL] per line)", metavar="FILE"
    )
    port: int | None = option("--ssh-port", "ssh port of the hosts", metavar="PORT", type=int, group=SSH_GROUP)
    identity: str | None = option("--ssh-identity", "private key for ssh (ssh -i)", metavar="FILE", group=SSH_GROUP)
    config: str | None = option("--ssh-config", "ssh client config file (ssh -F)", metavar="FILE", group=SSH_GROUP)
    options: tuple[str, ...] = option(
        "--ssh-option",
        "extra ssh -o option (repeatable)",
        default=(),
        metavar="KEY=VALUE",
        action="append",
        group=SSH_GROUP,
    )
    connect_timeout_s: int = 10

    def chooses_backend(self) -> bool:
        return bool(self.hostfile)

    def problems(self) -> list[str]:
        out = []
        if self.port is not None and not 1 <= self.port <= 65535:
            out.append(f"--ssh-port {self.port}: a TCP port is 1-65535 (ssh's default is 22)")
        for flag, path in (("--ssh-identity", self.identity), ("--ssh-config", self.config)):
            if path is not None and not os.path.isfile(os.path.expanduser(path)):
                out.append(f"{flag} {path!r}: no such file")
        for o in self.options:
            if not _SSH_OPTION.fullmatch(o):
                out.append(f"--ssh-option {o!r}: ssh -o takes KEY=VALUE (for example StrictHostKeyChecking=accept-new)")
        return out

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


RAY_GROUP = "Ray cluster"


@frozen
class RayOptions(BackendOptions):
    """The Ray backend's options: the cluster to attach to."""

    address: str | None = option(
        "--ray",
        "attach to the Ray cluster at ADDRESS (the head's HOST:PORT, or 'auto' on a node of it); without "
        "it, used when RAY_ADDRESS is set (as in a Ray job)",
        metavar="ADDRESS",
        group=RAY_GROUP,
    )

    def chooses_backend(self) -> bool:
        return bool(self.address)


@frozen
class SlurmOptions(BackendOptions):
    """The Slurm backend's option: run in the current allocation."""

    slurm: bool = option(
        "--slurm",
        "use the current Slurm allocation (an error outside one); without it, used when SLURM_JOB_ID is set",
        default=False,
        action="store_true",
    )

    def chooses_backend(self) -> bool:
        return self.slurm


# Each registered backend's options (grpo_launch.backends.REGISTRY's names); its class says the same (``Options``).
OPTIONS: dict[str, type[BackendOptions]] = {
    "ssh": SshOptions,
    "ray": RayOptions,
    "slurm": SlurmOptions,
    "local": NoOptions,
}
