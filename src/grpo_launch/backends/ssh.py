"""The ssh backend: hostfile runs. Each process runs on its host as ``ssh HOST -- 'cd WORKDIR && exec PYTHON -m
grpo_launch.node.shim --announce-pgid --env-stdin --gpus P -- env K=V … COMMAND'``:

- the shim starts a new session and prints its process-group id, so teardown can signal the whole remote tree
  (``ssh HOST kill -TERM -- -PGID``): a killed ssh client does not stop a remote process that has no tty;
- variables from :data:`PASSED_ENV` travel on ssh's stdin, never on a command line or in a file (HF_TOKEN, …);
- the planned GPU positions select from the host's own CUDA_VISIBLE_DEVICES.

Before anything starts, every host is checked in parallel: ssh in batch mode, the same grpo-launch and Python,
the working directory and the recipe's local paths.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BaseBackend, check_addresses, option
from grpo_launch.errors import LaunchError
from grpo_launch.machines.gpus import GIB
from grpo_launch.machines.topology import Topology
from grpo_launch.probe.dataset import looks_local
from grpo_launch.probe.pythons import version_tuple
from grpo_launch.render.processes import weight_sync_port
from grpo_launch.rundir.layout import RUN_ID_ENV
from grpo_launch.spec import ProcessSpec, RunContext, frozen

if TYPE_CHECKING:
    from grpo_launch.planning.types import Plan

SSH_GROUP = "hostfile hosts (ssh: probed, then run)"

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


@frozen
class SshOptions:
    """The ssh backend's options: the hostfile, and how to reach its hosts."""

    hostfile: str | None = option(
        "--hostfile", "DeepSpeed-style hostfile (HOST slots=N [gpu=MODEL] per line)", metavar="FILE"
    )
    port: int | None = option("--ssh-port", "ssh port of the hosts", metavar="PORT", type=int, group=SSH_GROUP)
    identity: str | None = option("--ssh-identity", "private key for ssh (ssh -i)", metavar="FILE", group=SSH_GROUP)
    config: str | None = option("--ssh-config", "ssh client config file (ssh -F)", metavar="FILE", group=SSH_GROUP)
    options: tuple[str, ...] = option(
        "--ssh-option", "extra ssh -o option (repeatable)", default=(), metavar="KEY=VALUE", action="append",
        group=SSH_GROUP,
    )  # fmt: skip
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
    import fnmatch

    return tuple(sorted(k for k in environ if any(fnmatch.fnmatchcase(k, p) for p in PASSED_ENV)))


def remote_command(
    spec: ProcessSpec, *, python: str, workdir: str, gpu_positions: Sequence[str] | None, stdin_env: bool
) -> str:
    """The shell line run on the remote host for ``spec``."""
    task = [python, "-m", "grpo_launch.node.shim", "--announce-pgid"]
    if stdin_env:
        task.append("--env-stdin")
    if spec.env.get(RUN_ID_ENV):  # the host's guard stops the run's processes there when the ssh session ends
        task += ["--guard", spec.env[RUN_ID_ENV]]
    if gpu_positions is not None:
        task += ["--gpus", ",".join(gpu_positions)]
    env = [f"{k}={v}" for k, v in spec.env.items()]
    command = [*task, "--", *(["env", *env] if env else []), *spec.argv]
    return f"cd {shlex.quote(workdir)} && exec {shlex.join(command)}"


def ssh_spec(spec: ProcessSpec, ssh: SshOptions, *, python: str, workdir: str, stdin_env: Sequence[str]) -> ProcessSpec:
    """``spec`` run on ``spec.host`` through ssh; ``stdin_env`` names the variables sent on stdin. Its planned GPUs
    become positions in the host's own CUDA_VISIBLE_DEVICES (:mod:`grpo_launch.node.shim`)."""
    host = spec.host
    assert host, "ssh_spec needs a host"
    marker = {}
    if spec.env.get(RUN_ID_ENV):  # each host's processes carry their own mark: a host's guard stops only its own
        marker = {RUN_ID_ENV: f"{spec.env[RUN_ID_ENV]}@{host}"}
        spec = replace(spec, env={**spec.env, **marker})
    line = remote_command(spec, python=python, workdir=workdir, gpu_positions=spec.gpus, stdin_env=bool(stdin_env))
    return ProcessSpec(
        name=spec.name,
        argv=(*ssh.argv(host), "--", line),
        host=host,
        role=spec.role,
        stdin_env=tuple(stdin_env),
        remote_group=True,
        env=marker,  # for kill_command (the local ssh client itself is marked with the plain run id)
    )


def kill_command(
    ssh: SshOptions, host: str, pgid: int, sig: int, *, run_id: str | None = None, python: str = "python3"
) -> list[str]:
    """``ssh HOST -- kill -SIG -- -PGID``: signal a whole remote process group, and with ``run_id`` every process
    of the run on that host (torchrun's ranks leave the group: each starts its own session)."""
    return [*ssh.argv(host), "--", kill_line(pgid, sig, run_id=run_id, python=python)]


def kill_line(pgid: int, sig: int, *, run_id: str | None = None, python: str = "python3") -> str:
    """The shell line run on a host to signal a process group there and, with ``run_id``, every process marked
    with it (:func:`kill_command`; the Ray backend runs it in a task on the node)."""
    import signal

    name = signal.Signals(sig).name.removeprefix("SIG")
    line = f"kill -{name} -- -{int(pgid)}"
    if run_id:
        line += f"; exec {shlex.quote(python)} -m grpo_launch.node.reaper signal {shlex.quote(run_id)} {int(sig)}"
    return line


def check_command(python: str, workdir: str, paths: Sequence[str], ports: Sequence[int] = ()) -> str:
    """A remote shell line that runs :mod:`grpo_launch.node.host_check` in ``workdir`` with ``python``: the host's
    grpo-launch version, which of ``paths`` are missing, which of ``ports`` are taken, its vLLM version and RAM."""
    import json

    q = shlex.quote
    asked = json.dumps({"paths": list(paths), "ports": [int(p) for p in ports]})
    return (
        f"cd {q(workdir)} 2>/dev/null || {{ echo {q('no directory ' + workdir)}; exit 3; }}; "
        f"test -x {q(python)} || {{ echo {q('no python at ' + python)}; exit 4; }}; "
        f"exec {q(python)} -m grpo_launch.node.host_check {q(asked)}"
    )


def probe_over_ssh(hosts: list[str], ssh: SshOptions, environ: Mapping[str, str]) -> tuple[dict[str, dict], list[str]]:
    """Each host's own report (:mod:`grpo_launch.node.host_report`, in parallel), and what went wrong on the hosts
    that did not answer."""
    import sys

    from grpo_launch.probe.hosts import collect_reports, report_command

    command = shlex.join(report_command(sys.executable))
    return collect_reports(hosts, lambda h: [*ssh.argv(h), "--", command], timeout_s=ssh.connect_timeout_s + 30,
                           env=environ)  # fmt: skip


# ------------------------------------------------------------------------------------------------ checks


def _absolute_command(spec: ProcessSpec) -> ProcessSpec:
    """A bare command name (``vllm``) as the absolute path found here: a remote non-interactive shell has a minimal
    PATH, and the hosts share this environment's paths."""

    import shutil

    first = spec.argv[0]
    found = shutil.which(first) if "/" not in first else None
    return replace(spec, argv=(found, *spec.argv[1:])) if found else spec


def host_ports(plan: Plan) -> dict[str, dict[int, str]]:
    """The ports each host must have free: the rendezvous and vLLM weight-sync ports on the trainer head (TRL's
    rank 0 hosts the weight-sync group there, not on the launcher), the server's port on its host."""
    head = plan.train.hosts[0].name
    out: dict[str, dict[int, str]] = {head: {plan.train.main_process_port: "set launch.main_process_port"}}
    if plan.vllm.base_url and plan.vllm.host:
        group = weight_sync_port(plan)
        out[head][group] = "weight sync: set vllm_group_port"
        out.setdefault(plan.vllm.host, {})[plan.vllm.port] = "vLLM server: set launch.vllm_port"
        if plan.vllm.nodes and (plan.vllm.data_parallel_size > 1):
            out[plan.vllm.host][plan.vllm.rpc_port] = "vLLM data-parallel coordination (launch.vllm_port + 1)"
        if plan.vllm.spans_hosts:
            out[plan.vllm.host][plan.vllm.master_port] = "vLLM's group over hosts (launch.vllm_port + 2)"
    return out


def host_ram_problem(plan: Plan, ram: object) -> str | None:
    """What is wrong when a host's RAM (as its check reported it) cannot hold the plan's offload."""
    from grpo_launch.planning.cost.constants import HOST_HEADROOM

    need = plan.estimate.host_memory_per_node_gib * GIB if plan.estimate else 0.0
    if not need or not isinstance(ram, int) or need <= HOST_HEADROOM * ram:
        return None
    return (
        f"offload needs {need / GIB:.0f} GiB of host RAM (DeepSpeed's estimate), the host has {ram / GIB:.0f} GiB "
        f"(at most {HOST_HEADROOM:.0%} is planned): add nodes, or use LoRA (use_peft=true)"
    )


def local_paths(plan: Plan) -> list[str]:
    """The recipe's model and dataset paths that are local (they must exist on every host)."""
    values = plan.trainer_values
    return [
        str(Path(str(values[k])).expanduser().absolute())
        for k in ("model_name_or_path", "dataset_name")
        if values.get(k) and looks_local(str(values[k]))
    ]


def check_problem(host: str, returncode: int, stdout: str, stderr: str, plan: Plan, python: str,
                  ports: Mapping[int, str]) -> str | None:  # fmt: skip
    """What is wrong on ``host``, from the output of :func:`check_command` run there (None: ready)."""
    import json

    from grpo_launch import __version__
    from grpo_launch.rundir.fields import RunFileError
    from grpo_launch.rundir.records import HostCheck

    if returncode in (3, 4):
        return f"{host}: {stdout.strip()}"
    if "No module named grpo_launch" in stderr or "No module named 'grpo_launch" in stderr:
        return f"{host}: {python} cannot import grpo_launch (install grpo-launch in that environment)"
    try:
        row = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{host}: the environment check failed: {(stderr or stdout).strip()[-300:]}"
    try:
        info = HostCheck.from_json(row, f"{host}'s check")
    except RunFileError as exc:
        return f"{host}: the environment check answered what this version does not read ({exc.message})"
    if info.version != __version__:
        return f"{host}: grpo-launch {info.version} there, {__version__} here"
    if info.missing:
        return f"{host}: missing {', '.join(info.missing)}"
    if info.busy:
        return f"{host}: " + "; ".join(f"port {p} ({ports.get(p, 'asked')}) is in use" for p in info.busy)
    short = host_ram_problem(plan, info.memory_bytes)
    if short:
        return f"{host}: {short}"
    there, here = version_tuple(info.vllm), version_tuple(plan.vllm_version)
    if plan.vllm.mode != "off" and plan.vllm_version and there != here:
        # TRL imports vLLM in every trainer (client, NCCL weight transfer): the same version everywhere.
        return f"{host}: vLLM {info.vllm} there, {plan.vllm_version} here"
    return None


def check_hosts(plan: Plan, ssh: SshOptions, ctx: RunContext) -> None:
    """Before anything starts: every host answers ssh in batch mode and has this grpo-launch, Python, working
    directory and the recipe's local paths. One error naming every host and what is wrong."""
    import concurrent.futures
    import subprocess

    python, environ = ctx.python, ctx.environ
    paths = local_paths(plan)
    hosts = [h.name for h in plan.topology.hosts]
    ports = host_ports(plan)

    def probe(host: str) -> str | None:
        argv = [*ssh.argv(host), "--", check_command(python, ctx.workdir, paths, sorted(ports.get(host, {})))]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=ssh.connect_timeout_s + 30,
                stdin=subprocess.DEVNULL,
                env=dict(environ),
            )
        except subprocess.TimeoutExpired:
            return f"{host}: no answer within {ssh.connect_timeout_s + 30} s"
        except FileNotFoundError:
            return "ssh is not installed on this machine"
        if done.returncode == 255:
            return f"{host}: unreachable over ssh ({(done.stderr.strip().splitlines() or ['no message'])[-1]})"
        return check_problem(host, done.returncode, done.stdout, done.stderr, plan, python, ports.get(host, {}))

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        problems = [p for p in pool.map(probe, hosts) if p]
    if problems:
        raise LaunchError(
            "the hosts are not ready; nothing was started:",
            problems=problems,
            hint="Every host needs passwordless ssh (batch mode) and the same paths as this one: the Python "
            f"environment ({python}), the working directory and the model/data (a shared file system). ssh options: "
            "--ssh-port, --ssh-identity, --ssh-config, --ssh-option.",
        )


# ------------------------------------------------------------------------------------------------ backend


class SshBackend(BaseBackend):
    name: ClassVar[str] = "ssh"
    Options: ClassVar[type] = SshOptions

    def __init__(self, hostfile: str, options: SshOptions) -> None:
        self.hostfile = hostfile
        self.options = options

    @classmethod
    def detect(cls, options: SshOptions, environ: Mapping[str, str]) -> bool:
        return bool(options.hostfile)

    @classmethod
    def create(cls, options: SshOptions, environ: Mapping[str, str]) -> SshBackend:
        assert options.hostfile
        return cls(options.hostfile, options)

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        """The hosts as each reports itself over ssh (GPUs, CPUs, RAM); a hostfile whose lines all name their GPUs
        (gpu=MODEL) is planned offline, and so is one whose hosts do not all answer (with a warning)."""
        from grpo_launch.backends.hostfile import probe_hostfile, read_hostfile, topology_from_probes

        entries = read_hostfile(self.hostfile)
        offline = probe_hostfile(self.hostfile, local=local, cpu=local.is_cpu, entries=entries)
        if all(gpu for _, _, gpu in entries):
            return offline
        probes, failed = probe_over_ssh([h for h, _, _ in entries], self.options, environ)
        if failed:
            why = "; ".join(failed[:4]) + (f"; and {len(failed) - 4} more" if len(failed) > 4 else "")
            warn = f"could not probe every host over ssh ({why}): planned from the hostfile alone"
            return replace(offline, warnings=(*offline.warnings, warn))
        return topology_from_probes(entries, probes, str(self.hostfile))

    def place(self, spec: ProcessSpec, plan: Plan, ctx: RunContext) -> ProcessSpec:
        spec = _absolute_command(replace(spec, host=spec.host or plan.topology.hosts[0].name))
        return ssh_spec(
            spec, self.options, python=ctx.python, workdir=ctx.workdir, stdin_env=passed_env_names(ctx.environ)
        )

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        check_addresses(plan)
        check_hosts(plan, self.options, ctx)

    def signal_remote(self, spec: ProcessSpec, pgid: int, sig: int, ctx: RunContext) -> None:
        import subprocess

        assert spec.host
        subprocess.run(
            kill_command(self.options, spec.host, pgid, sig, run_id=spec.env.get(RUN_ID_ENV), python=ctx.python),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            env=dict(ctx.environ),
        )
