"""The ssh backend: hostfile runs. Each process runs on its host as ``ssh HOST -- 'cd WORKDIR && exec PYTHON -m
grpo_launch.node.shim --announce-pgid --env-stdin --gpus P -- env K=V … COMMAND'``:

- the shim starts a new session and prints its process-group id, so teardown can signal the whole remote tree
  (``ssh HOST kill -TERM -- -PGID``): a killed ssh client does not stop a remote process that has no tty;
- variables from :data:`.remote.PASSED_ENV` and the recipe's launch.pass_env travel on ssh's stdin, never on a
  command line or in a file (HF_TOKEN, …), and so does any variable of the process whose value would be redacted in
  print (:func:`.remote.off_the_command_line`);
- the planned GPU positions select from the host's own CUDA_VISIBLE_DEVICES.

Before anything starts, every host is checked in parallel: ssh in batch mode, the same grpo-launch and Python,
the working directory and the recipe's local paths (the check and the kill line are the Ray backend's too:
:mod:`.remote`).
"""

from __future__ import annotations

import concurrent.futures
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from grpo_launch.backends.base import BackendOptions, BaseBackend, check_addresses
from grpo_launch.backends.hostfile import probe_hostfile, read_hostfile, topology_from_probes
from grpo_launch.backends.options import SshOptions
from grpo_launch.backends.remote import (
    check_command,
    check_problem,
    host_ports,
    kill_line,
    local_paths,
    off_the_command_line,
    passed_env_names,
)
from grpo_launch.enums import Role
from grpo_launch.errors import LaunchError
from grpo_launch.machines.topology import Topology
from grpo_launch.probe.hosts import collect_reports, report_command
from grpo_launch.rundir.layout import GRACE_ENV, RUN_ID_ENV
from grpo_launch.spec import ProcessSpec, RunContext

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan


def remote_command(
    spec: ProcessSpec, *, python: str, workdir: str, gpu_positions: Sequence[str] | None, stdin_env: bool
) -> str:
    """The shell line run on the remote host for ``spec``."""
    task = [python, "-m", "grpo_launch.node.shim", "--announce-pgid"]
    if stdin_env:
        task.append("--env-stdin")
    if spec.env.get(RUN_ID_ENV):  # the host's guard stops the run's processes there when the ssh session ends
        task += ["--guard", spec.env[RUN_ID_ENV]]
        if spec.env.get(GRACE_ENV):  # within the run's grace, as the launcher's own guard
            task += ["--grace", spec.env[GRACE_ENV]]
    if gpu_positions is not None:
        task += ["--gpus", ",".join(gpu_positions)]
    env = [f"{k}={v}" for k, v in spec.env.items()]
    command = [*task, "--", *(["env", *env] if env else []), *spec.argv]
    if spec.role == Role.VLLM and spec.env.get(RUN_ID_ENV):
        inner = f"cd {shlex.quote(workdir)} && {marked_per_start(command, spec.env[RUN_ID_ENV])}"
        return f"exec sh -c {shlex.quote(inner)}"
    return f"cd {shlex.quote(workdir)} && exec {shlex.join(command)}"


def marked_per_start(command: Sequence[str], mark: str) -> str:
    """``exec COMMAND`` as a POSIX shell line in which the host's mark of the run (the guard's argument, and
    GRPO_LAUNCH_RUN_ID=mark) becomes ``mark/vllm-PID``, PID the shell's own: a mark of this start alone.

    For a vLLM server's processes, which the launcher may start again after losing them
    (:mod:`grpo_launch.execute.server_keeper`). The guard of a start stops every process that carries its mark once
    its session ends (:mod:`grpo_launch.node.reaper`); with the host's mark it would stop the trainer ranks on that
    host and the replacement started after it. A server's processes stay in its process group, which teardown
    signals; the mark finds them should the launcher die."""
    words = {
        mark: shlex.quote(f"{mark}/vllm-") + "$$",
        f"{RUN_ID_ENV}={mark}": shlex.quote(f"{RUN_ID_ENV}={mark}/vllm-") + "$$",
    }
    return "exec " + " ".join(words.get(w, shlex.quote(w)) for w in command)


def ssh_spec(spec: ProcessSpec, ssh: SshOptions, *, python: str, workdir: str, stdin_env: Sequence[str]) -> ProcessSpec:
    """``spec`` run on ``spec.host`` through ssh; ``stdin_env`` names the variables sent on stdin. Its planned GPUs
    become positions in the host's own CUDA_VISIBLE_DEVICES (:mod:`grpo_launch.node.shim`)."""
    host = spec.host
    assert host, "ssh_spec needs a host"
    marker = {}
    if spec.env.get(RUN_ID_ENV):  # each host's processes carry their own mark: a host's guard stops only its own
        marker = {RUN_ID_ENV: f"{spec.env[RUN_ID_ENV]}@{host}"}
        spec = replace(spec, env={**spec.env, **marker})
    clear, hidden = off_the_command_line(spec.env)
    names = tuple(sorted({*stdin_env, *hidden}))
    line = remote_command(
        replace(spec, env=clear), python=python, workdir=workdir, gpu_positions=spec.gpus, stdin_env=bool(names)
    )
    return ProcessSpec(
        name=spec.name,
        argv=(*ssh.argv(host), "--", line),
        host=host,
        role=spec.role,
        stdin_env=names,
        remote_group=True,
        # The marker for kill_command (the local ssh client itself is marked with the plain run id), and the values
        # sent on stdin (the run's environment carries them to the supervisor: execute/run.py)
        env={**marker, **hidden},
    )


def kill_command(
    ssh: SshOptions, host: str, pgid: int, sig: int, *, run_id: str | None = None, python: str = "python3"
) -> list[str]:
    """``ssh HOST -- kill -SIG -- -PGID``: signal a whole remote process group, and with ``run_id`` every process
    of the run on that host (torchrun's ranks leave the group: each starts its own session)."""
    return [*ssh.argv(host), "--", kill_line(pgid, sig, run_id=run_id, python=python)]


def probe_over_ssh(hosts: list[str], ssh: SshOptions, environ: Mapping[str, str]) -> tuple[dict[str, dict], list[str]]:
    """Each host's own report (:mod:`grpo_launch.node.host_report`, in parallel), and what went wrong on the hosts
    that did not answer."""

    command = shlex.join(report_command(sys.executable))
    return collect_reports(
        hosts, lambda h: [*ssh.argv(h), "--", command], timeout_s=ssh.connect_timeout_s + 30, env=environ
    )


# ------------------------------------------------------------------------------------------------ checks


def _absolute_command(spec: ProcessSpec) -> ProcessSpec:
    """A bare command name (``vllm``) as the absolute path found here: a remote non-interactive shell has a minimal
    PATH, and the hosts share this environment's paths."""

    first = spec.argv[0]
    found = shutil.which(first) if "/" not in first else None
    return replace(spec, argv=(found, *spec.argv[1:])) if found else spec


def check_hosts(plan: Plan, ssh: SshOptions, ctx: RunContext) -> None:
    """Before anything starts: every host answers ssh in batch mode and has this grpo-launch, Python, working
    directory and the recipe's local paths. One error naming every host and what is wrong."""

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


class SshBackend(BaseBackend[SshOptions]):
    name: ClassVar[str] = "ssh"
    Options: ClassVar[type[BackendOptions]] = SshOptions

    def __init__(self, hostfile: str, options: SshOptions) -> None:
        self.hostfile = hostfile
        self.options = options

    @classmethod
    def detect(cls, options: SshOptions, environ: Mapping[str, str]) -> bool:
        return options.chooses_backend()

    @classmethod
    def create(cls, options: SshOptions, environ: Mapping[str, str]) -> SshBackend:
        assert options.hostfile
        return cls(options.hostfile, options)

    def probe(self, environ: Mapping[str, str], local: Topology) -> Topology:
        """The hosts as each reports itself over ssh (GPUs, CPUs, RAM); a hostfile whose lines all name their GPUs
        (gpu=MODEL) is planned offline, and so is one whose hosts do not all answer (with a warning)."""

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
            spec,
            self.options,
            python=ctx.python,
            workdir=ctx.workdir,
            stdin_env=passed_env_names(ctx.environ, plan.recipe.launch.pass_env),
        )

    def preflight(self, plan: Plan, ctx: RunContext) -> None:
        check_addresses(plan)
        check_hosts(plan, self.options, ctx)

    def signal_remote(self, spec: ProcessSpec, pgid: int, sig: int, ctx: RunContext) -> None:
        assert spec.host
        subprocess.run(
            kill_command(self.options, spec.host, pgid, sig, run_id=spec.env.get(RUN_ID_ENV), python=ctx.python),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            env=dict(ctx.environ),
        )
