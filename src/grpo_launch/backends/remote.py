"""What the remote backends (ssh, Ray) share about a process on another host: the variables that travel to it, the
check each host passes before anything starts (:func:`check_command` runs :mod:`grpo_launch.node.host_check` there,
:func:`check_problem` reads its answer: this grpo-launch and vLLM, the working directory, the recipe's local paths,
free ports, RAM for the offload) and the line that signals a process group there (:func:`kill_line`).

How the line reaches the host is each backend's own: ``ssh HOST -- LINE`` (:mod:`.ssh`), a task pinned to the node
(:mod:`.ray`). Pure: every function here makes text or reads it; nothing runs.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_launch import __version__
from grpo_launch.machines.gpus import GIB
from grpo_launch.planning.cost.constants import HOST_HEADROOM
from grpo_launch.probe.dataset import looks_local
from grpo_launch.recipe.versions import version_tuple
from grpo_launch.render.processes import weight_sync_port
from grpo_launch.rundir.json_fields import RunFileError
from grpo_launch.rundir.layout import VLLM_TOKEN_ENV
from grpo_launch.rundir.records import HostCheck
from grpo_launch.spec import holds_secret

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan

# Variables passed from the launcher's environment to every remote process (through stdin). Exact names, or
# prefixes ending in ``*``. Anything else stays local; a recipe names more in launch.pass_env (secrets: by name
# only), and sets values that are no secret in launch.train_env / launch.vllm_env.
PASSED_ENV: tuple[str, ...] = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    VLLM_TOKEN_ENV,  # the attempt's vLLM server token (execute/run.py): stdin, like HF_TOKEN
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


def passed_env_names(environ: Mapping[str, str], named: Sequence[str] = ()) -> tuple[str, ...]:
    """The names of :data:`PASSED_ENV` and of ``named`` (the recipe's launch.pass_env) set in ``environ``, sorted."""
    wanted = (*PASSED_ENV, *named)
    return tuple(sorted(k for k in environ if k in named or any(fnmatch.fnmatchcase(k, p) for p in wanted)))


def off_the_command_line(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A process's variables split for a remote host: those that may go on its command line (``env K=V``), and
    those whose value would be redacted in print (:func:`grpo_launch.spec.holds_secret`: a token-shaped value or a
    password in a URL, under whatever name), which travel on stdin like HF_TOKEN. A command line is seen by every
    user of both hosts (``ps``), and ssh's and Ray's logs keep it."""
    clear = {k: v for k, v in env.items() if not holds_secret(k, v)}
    return clear, {k: v for k, v in env.items() if k not in clear}


def kill_line(pgid: int, sig: int, *, run_id: str | None = None, python: str = "python3") -> str:
    """The shell line run on a host to signal a process group there and, with ``run_id``, every process marked
    with it (the ssh backend runs it through ssh, :func:`grpo_launch.backends.ssh.kill_command`; the Ray backend in
    a task on the node)."""
    name = signal.Signals(sig).name.removeprefix("SIG")
    line = f"kill -{name} -- -{int(pgid)}"
    if run_id:
        line += f"; exec {shlex.quote(python)} -m grpo_launch.node.reaper signal {shlex.quote(run_id)} {int(sig)}"
    return line


def check_command(python: str, workdir: str, paths: Sequence[str], ports: Sequence[int] = ()) -> str:
    """A remote shell line that runs :mod:`grpo_launch.node.host_check` in ``workdir`` with ``python``: the host's
    grpo-launch version, which of ``paths`` are missing, which of ``ports`` are taken, its vLLM version and RAM."""
    q = shlex.quote
    asked = json.dumps({"paths": list(paths), "ports": [int(p) for p in ports]})
    return (
        f"cd {q(workdir)} 2>/dev/null || {{ echo {q('no directory ' + workdir)}; exit 3; }}; "
        f"test -x {q(python)} || {{ echo {q('no python at ' + python)}; exit 4; }}; "
        f"exec {q(python)} -m grpo_launch.node.host_check {q(asked)}"
    )


# ------------------------------------------------------------------------------------------------ checks


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


def check_problem(
    host: str, returncode: int, stdout: str, stderr: str, plan: Plan, python: str, ports: Mapping[int, str]
) -> str | None:
    """What is wrong on ``host``, from the output of :func:`check_command` run there (None: ready): the same
    rule for a host reached over ssh and a Ray node."""
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
