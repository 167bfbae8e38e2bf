"""The ssh wrapper (pure): ssh options, the remote command line, the environment check a host runs, and which
variables travel on stdin. The remote lines are executed here by a real shell."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.backends.remote import check_command, passed_env_names
from grpo_launch.backends.ssh import SshOptions, kill_command, remote_command, ssh_spec
from grpo_launch.probe.local import parse_meminfo
from grpo_launch.spec import ProcessSpec


def test_ssh_options():
    argv = SshOptions(port=2222, identity="/k/id", config="/k/cfg", options=("A=b",), connect_timeout_s=7).argv("h1")
    assert argv == [
        "ssh", "-F", "/k/cfg", "-o", "BatchMode=yes", "-o", "ConnectTimeout=7", "-o", "LogLevel=ERROR",
        "-p", "2222", "-i", "/k/id", "-o", "IdentitiesOnly=yes", "-o", "A=b", "h1",
    ]  # fmt: skip


def test_passed_env_is_an_explicit_list():
    environ = {"HF_TOKEN": "x", "WANDB_API_KEY": "y", "NCCL_DEBUG": "INFO", "AWS_SECRET_ACCESS_KEY": "z", "PATH": "/b"}
    assert passed_env_names(environ) == ("HF_TOKEN", "NCCL_DEBUG", "WANDB_API_KEY")


def test_remote_command_runs_the_argv_unchanged_with_env_and_no_secret(tmp_path):
    spec = ProcessSpec(
        name="train@h1",
        argv=(sys.executable, "-c", "import os, sys, json; print(json.dumps([sys.argv[1:], os.environ['A']]))", "x y"),
        env={"A": "it's $(id)", "CUDA_VISIBLE_DEVICES": "0"},
        host="h1",
    )
    line = remote_command(spec, python=sys.executable, workdir=str(tmp_path), gpu_positions=None, stdin_env=True)
    # What sshd would run: the user's shell with the line; stdin carries the secret.
    done = subprocess.run(["sh", "-c", line], input='HF_TOKEN="s3cret"\n\n', capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("[grpo-launch-task] pgid=")
    assert json.loads(second) == [["x y"], "it's $(id)"]
    assert "s3cret" not in line


def test_ssh_spec_signals_the_announced_group_on_its_host():
    spec = ProcessSpec(name="train@h2", argv=("python", "-m", "x"), host="h2", gpus=("1",))
    wrapped = ssh_spec(spec, SshOptions(port=22), python="/v/python", workdir="/w", stdin_env=("HF_TOKEN",))
    assert wrapped.argv[:-1] == (*SshOptions(port=22).argv("h2"), "--")
    assert shlex.split(wrapped.argv[-1])[:3] == ["cd", "/w", "&&"]
    assert "--gpus 1" in wrapped.argv[-1] and "--env-stdin" in wrapped.argv[-1]
    assert wrapped.remote_group and wrapped.gpus is None  # the remote shim selects the GPUs there
    assert kill_command(SshOptions(port=22), "h2", 4242, signal.SIGTERM) == [
        *SshOptions(port=22).argv("h2"),
        "--",
        "kill -TERM -- -4242",
    ]
    assert wrapped.stdin_env == ("HF_TOKEN",) and wrapped.shell().endswith("# on stdin: HF_TOKEN")


def test_host_check_reports_missing_python_directory_and_paths(tmp_path):
    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60)

    ok = run(check_command(sys.executable, str(tmp_path), [str(tmp_path), str(tmp_path / "no-model")]))
    info = json.loads(ok.stdout)
    assert info["version"] and info["missing"] == [str(tmp_path / "no-model")]
    assert info["vllm"] == "missing"  # this venv has none; the check compares it with the local one
    assert info["memory_bytes"] == pytest.approx(parse_meminfo(Path("/proc/meminfo").read_text()), rel=0.01)
    no_python = run(check_command("/nonexistent/python", str(tmp_path), []))
    assert no_python.returncode == 4 and "no python at /nonexistent/python" in no_python.stdout
    no_dir = run(check_command(sys.executable, "/nonexistent dir/it's", []))
    assert no_dir.returncode == 3 and "no directory /nonexistent dir/it's" in no_dir.stdout


def test_host_check_reports_a_busy_port_on_that_host(tmp_path):
    """The weight-sync and rendezvous ports are checked on the trainer head itself (not on the launcher)."""
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        taken = s.getsockname()[1]
        line = check_command(sys.executable, str(tmp_path), [], [taken])
        info = json.loads(subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60).stdout)
    assert info["busy"] == [taken]


def test_ports_checked_per_host_and_the_weight_sync_address():
    """On several hosts the trainer head hosts TRL's weight-sync group: its port is checked there, and
    VLLM_HOST_IP (what TRL advertises to the server) is the head's address, not its default route."""
    from grpo_launch.backends.remote import host_ports
    from grpo_launch.machines.topology import Gpu, Host, Topology
    from grpo_launch.models.builtin import find_model_shape
    from grpo_launch.planning import make_plan
    from grpo_launch.recipe import build_recipe
    from grpo_launch.render.processes import trainers

    gpus = tuple(Gpu(str(i), "H100-80GB", 80 * 2**30) for i in range(8))
    topo = Topology((Host("a", gpus, "10.0.0.1"), Host("b", gpus, "10.0.0.2")), "hostfile")
    model = "Qwen/Qwen2.5-7B-Instruct"
    recipe = {"model_name_or_path": model, "vllm_group_port": 51999, "launch": {"vllm": "server", "vllm_gpus": 8}}
    plan = make_plan(topo, build_recipe(recipe), find_model_shape(model))
    assert plan.vllm.mode == "server" and plan.vllm.host == "b"  # a dedicated vLLM host; "a" trains
    assert [h.name for h in plan.train.hosts] == ["a"]
    ports = host_ports(plan)
    assert set(ports["a"]) == {29500, 51999} and plan.vllm.port in ports[plan.vllm.host]
    head, *rest = trainers(plan)
    assert head.env["VLLM_HOST_IP"] == "10.0.0.1" and all("VLLM_HOST_IP" not in t.env for t in rest)


def test_a_host_without_the_ram_for_offload_is_named():
    """The plan's offload (ZeRO-3 + optimizer offload of a 70B model on one node) against a host's reported RAM."""
    from grpo_launch.backends.remote import host_ram_problem
    from grpo_launch.machines.gpus import GIB
    from grpo_launch.machines.topology import parse_gpu_spec
    from grpo_launch.models.builtin import find_model_shape
    from grpo_launch.planning import make_plan
    from grpo_launch.recipe import build_recipe

    values = {"model_name_or_path": "meta-llama/Llama-3.1-70B-Instruct", "launch": {"vllm": "off"}}
    plan = make_plan(parse_gpu_spec("8xH100-80GB"), build_recipe(values), find_model_shape("Llama-3.1-70B"))
    need = plan.estimate.host_memory_per_node_gib * GIB
    assert plan.train.offload != "none" and need > 0
    assert host_ram_problem(plan, int(need * 2)) is None
    problem = host_ram_problem(plan, int(need))  # all of it: more than the 80 % planned
    assert problem and f"{need / GIB:.0f} GiB of host RAM" in problem and "use_peft" in problem
    assert host_ram_problem(plan, None) is None  # an old grpo-launch on the host reports no RAM: not refused


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--ssh-port", "0"], "--ssh-port 0"),
        (["--ssh-port", "70000"], "--ssh-port 70000"),
        (["--ssh-option", "StrictHostKeyChecking"], "KEY=VALUE"),
        (["--ssh-option", "A=b\nProxyCommand=x"], "KEY=VALUE"),
        (["--ssh-identity", "/nonexistent/id_ed25519"], "no such file"),
        (["--ssh-config", "/nonexistent/ssh_config"], "no such file"),
    ],
)
def test_ssh_options_that_cannot_work_are_refused_before_the_dry_run(tmp_path, flags, said):
    """Issue 41: a dry run with a hostfile that names its GPUs (no probe) refused none of these; the real run failed.
    Now the command line is refused (exit 2) naming the flag, before any plan or host is touched."""
    import os
    import subprocess
    import sys

    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2 gpu=H100-80GB\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-m", "grpo_launch", "recipes/tiny-cpu.yaml", "--hostfile", str(hostfile), *flags,
            "--run-dir", str(tmp_path / "run"), "--dry-run"]  # fmt: skip
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.returncode == 2 and said in done.stderr and flags[0] in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_ssh_options_that_work_pass_the_same_check():
    """The control of the refusals above: well-formed options are accepted (checked in-process: no dry run)."""
    from grpo_launch.backends.options import SshOptions

    fine = SshOptions(hostfile="h", port=2222, options=("StrictHostKeyChecking=accept-new", "User root"))
    assert fine.problems() == []
