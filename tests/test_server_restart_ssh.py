"""A lost vLLM server replaced on an ssh host (execute/server_keeper.py, train/server_restart.py): sshd hosts in
network namespaces (scripts/ssh_hosts.sh) that share this machine's file system as a cluster shares its home, so the
trainer's host reads the control files the launcher writes into the run directory. The real vLLM CPU server serves
from its own host, h2; one real TRL 1.16 GRPOTrainer rank trains on h1 (tests/cpu_server_trainer.py: TRL's NCCL
weight transfer made a no-op, since NCCL needs CUDA) and reaches the server at h2's address.

After step 1 the server's API process is killed with SIGKILL on h2. Its engine core lives on and holds the ssh
session's output open, so the ssh client the launcher watches does not end: the server's refused port is what tells
the launcher. The replacement must start on h2 with the same port and token (the trainer's client, unchanged,
reaches it and is let in), after the lost server's process group is gone, and the run must reach max_steps with
every step once, in one attempt.

Skipped when sshd/iproute2 are missing or not root, unless GRPO_LAUNCH_REQUIRE_SSHD=1 (CI), which fails instead."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest
import yaml

from .helpers import ROOT, VLLM_PY, leftovers, require_vllm, ssh_hosts
from .test_adapt_run import server_recipe
from .test_server_restart import check_replaced, drive_and_kill

pytestmark = [pytest.mark.ssh, pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with ssh_hosts(tmp_path_factory.mktemp("hosts"), 2) as d:
        yield d


@pytest.mark.extended  # the default tier replaces a server on this machine (test_server_restart.py)
def test_a_server_killed_on_its_own_host_is_replaced_there_under_the_remote_trainer(hosts, tmp_path):
    require_vllm()
    recipe = server_recipe(tmp_path / "r.yaml", learning_rate=1e-9, max_steps=3, adapt=False)
    values = yaml.safe_load(recipe.read_text())
    values["launch"]["vllm_gpus"] = 1
    recipe.write_text(yaml.safe_dump(values))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("h1 slots=1 gpu=L4-24GB\nh2 slots=1 gpu=L4-24GB\n")
    run = tmp_path / "run"
    ssh = [
        "--ssh-port",
        "2222",
        "--ssh-identity",
        str(hosts / "id_ed25519"),
        "--ssh-option",
        "StrictHostKeyChecking=no",
        "--ssh-option",
        f"UserKnownHostsFile={hosts / 'known_hosts'}",
    ]
    argv = [
        str(VLLM_PY),
        "-m",
        "grpo_launch",
        "run",
        str(recipe),
        "--hostfile",
        str(hostfile),
        "--run-dir",
        str(run),
        "--network-interface",
        "eth0",
        *ssh,
    ]
    driven = drive_and_kill(argv, {**os.environ, "SSH_AUTH_SOCK": ""}, [(1, "api")], max_steps=3)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["vllm"]["host"] == "h2" and [h["name"] for h in plan["train"]["hosts"]] == ["h1"], driven.out[-3000:]
    check_replaced(driven, run, restarts=1, max_steps=3)
    assert driven.hosts == ["h2", "h2"]  # the replacement on the server's own host
    assert "refuses connections" in driven.out  # seen at the port: the ssh client did not end with the API server
    port = plan["vllm"]["port"]
    for log in sorted((run / "logs").glob("vllm-*.log")):  # each start on the planned port
        assert re.search(rf"Starting vLLM server on http://\S+:{port}\b", log.read_text(errors="replace")), log
    assert leftovers(run) == []


def _processes(marker: str) -> list[int]:
    """The live processes whose environment carries ``marker`` as the run's mark (the hosts share this machine's
    process table)."""
    from grpo_launch.node.reaper import marked

    return marked(marker)


def test_stopping_a_lost_server_leaves_the_trainer_on_its_host_and_its_replacement_running(hosts, tmp_path):
    """The server and a trainer rank on one ssh host, as plans put them (a server on one GPU of a trainers' host):
    stopping the lost server (Supervisor.stop_children, the backend's kill line) ends its process group, and
    neither the kill line nor its host's guard, which sweeps the run's processes there once the server's ssh
    session ends, may stop the trainer or the replacement started at once after it. Stand-in commands (sleep):
    only the processes' placement, marks and signals are under test."""
    from grpo_launch.backends.options import SshOptions
    from grpo_launch.backends.ssh import SshBackend, ssh_spec
    from grpo_launch.enums import Role
    from grpo_launch.execute.supervisor import Supervisor
    from grpo_launch.rundir.layout import GRACE_ENV, RUN_ID_ENV
    from grpo_launch.spec import ProcessSpec, RunContext

    known = f"UserKnownHostsFile={hosts / 'known_hosts'}"
    options = SshOptions(port=2222, identity=str(hosts / "id_ed25519"), options=("StrictHostKeyChecking=no", known))
    ctx = RunContext(sys.executable, str(ROOT), {**os.environ, "SSH_AUTH_SOCK": ""}, lambda _line: None)
    run_id = "sharedhost" + os.urandom(4).hex()
    env = {RUN_ID_ENV: run_id, GRACE_ENV: "2"}

    def placed(name: str, role: Role) -> ProcessSpec:
        spec = ProcessSpec(name=name, argv=("sleep", "300"), env=env, host="h1", role=role)
        return ssh_spec(spec, options, python=sys.executable, workdir=str(ROOT), stdin_env=())

    backend = SshBackend(str(tmp_path / "hostfile"), options)
    sup = Supervisor(
        tmp_path / "logs",
        emit=lambda _line: None,
        grace_s=5,
        environ=ctx.environ,
        cwd=str(ROOT),
        signal_remote=lambda spec, pgid, sig: backend.signal_remote(spec, pgid, sig, ctx),
        run_id=run_id,
    )
    try:
        trainer = sup.start(placed("train@h1", Role.TRAIN))
        server = sup.start(placed("vllm", Role.VLLM))
        deadline = time.monotonic() + 30
        while (trainer.remote_pgid is None or server.remote_pgid is None) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert trainer.remote_pgid and server.remote_pgid
        old, guards = server.remote_pgid, _guards(run_id)  # the trainer's session's guard and the server's
        assert len(guards) == 2, guards
        sup.stop_children([server])
        assert server.proc.poll() is not None and _gone(old)  # the lost server's group, ended on its host
        again = sup.start(placed("vllm", Role.VLLM))
        deadline = time.monotonic() + 30  # its ssh session and shim start: seconds on a loaded machine
        while again.remote_pgid is None and again.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        # the old session's guard looks once a second, sweeps within its grace (2 s), and exits
        deadline = time.monotonic() + 60
        while _guards(run_id) >= guards and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _guards(run_id) >= guards, "the lost server's session's guard never ended"
        assert again.proc.poll() is None and trainer.proc.poll() is None, (again.tail(), trainer.tail())
        assert again.remote_pgid and not _gone(again.remote_pgid) and not _gone(trainer.remote_pgid)
    finally:
        sup.stop_all()
    assert _processes(f"{run_id}@h1") == []


def _guards(run_id: str) -> set[int]:
    """The hosts' guards of this run (``python -m grpo_launch.node.reaper watch SESSION RUN_ID@HOST GRACE``)."""
    from grpo_launch.node.reaper import argv_of

    found = set()
    for name in os.listdir("/proc"):
        argv = argv_of(int(name)) if name.isdigit() else []
        if "grpo_launch.node.reaper" in argv and "watch" in argv and any(run_id in a for a in argv):
            found.add(int(name))
    return found


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
