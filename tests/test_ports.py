"""Which ports a run opens, and on which addresses (README.md, "Ports").

On one machine the run's own stores listen on 127.0.0.1 only:
- torchrun's rendezvous store on launch.main_process_port, hosted by the elastic agent inside ``accelerate launch``.
  torch's TCPStore has no listen address and listens on every interface (``*:29500`` on main), so
  :mod:`grpo_launch.node.loopback_store` hands it a socket bound to 127.0.0.1.
- the ranks' gloo pairs (GLOO_SOCKET_IFNAME=lo).
- TRL's weight-sync store on vllm_group_port: vLLM's StatelessProcessGroup.create binds vLLM's get_ip(), which is
  VLLM_HOST_IP=127.0.0.1 for a one-host plan.

Not bound by the launcher, so these tests do not check them: NCCL's own bootstrap sockets (NCCL picks the interface;
NCCL_SOCKET_IFNAME, launch.network_interface). Over several hosts torch's store must be reached by the other hosts
and listens on every interface of the main host: a plan whose addresses are public gets a notice naming the ports to
firewall.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.recipe import build_recipe
from grpo_launch.render.configs import render_accelerate_config
from grpo_launch.render.processes import trainers

from .helpers import (
    ROOT,
    TINY_RECIPE,
    VLLM_PY,
    free_port,
    leftovers,
    plan_recipe,
    require_vllm,
    tiny_overrides,
    wait_for_line,
)

MODEL = "Qwen/Qwen2.5-7B-Instruct"
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


# ------------------------------------------------------------------------------------------------ sockets


def _address(text: str) -> tuple[str, int]:
    """A /proc/net/tcp{,6} address (host-order 32-bit words in hex, then the port): ``0100007F:7148``."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words)), int(port, 16)


def listening(pids: set[int]) -> dict[tuple[str, int], int]:
    """Every TCP socket a process of ``pids`` listens on: (address, port) → pid."""
    owner: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:  # gone meanwhile
            continue
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == LISTEN and cols[9] in owner:
                found[_address(cols[1])] = owner[cols[9]]
    return found


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (by parent pid)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


# ------------------------------------------------------------------------------------------------ a real run


@pytest.mark.slow
def test_one_host_run_listens_on_loopback_only(tmp_path):
    """A real two-process CPU GRPO run (accelerate launch → torchrun → gloo): while it trains, no process of the
    run listens anywhere but 127.0.0.1, and the rendezvous store is on 127.0.0.1:launch.main_process_port. On main
    torchrun's agent (``pt_elastic``) listened on ``*:PORT``. NCCL (GPU only) and the vLLM weight sync (CUDA only)
    do not run here: the weight-sync store's address is checked in vLLM's own code below."""
    run, port = tmp_path / "run", free_port()
    args = [sys.executable, "-m", "grpo_launch", TINY_RECIPE, *tiny_overrides(tmp_path), "max_steps=400",
            f"launch.main_process_port={port}", "--run-dir", str(run)]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(proc, "[train] step 2/", timeout=240)
        sockets = listening(descendants(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert (("127.0.0.1", port)) in sockets, sockets
    store_owner = Path(f"/proc/{sockets[('127.0.0.1', port)]}/comm")
    assert not store_owner.exists() or store_owner.read_text().strip() == "pt_elastic"  # torchrun's agent
    assert all(is_loopback(address) for address, _ in sockets), sockets
    assert leftovers(run) == []


def test_a_taken_port_is_named_before_accelerate_starts():
    """Another program on launch.main_process_port (on any interface): the wrapper says so and stops, rather than
    accelerate quietly switching to torchrun's standalone mode on other ports."""
    with socket.socket() as other:
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "grpo_launch.node.loopback_store", str(port), "-m", "accelerate.commands.launch",
             "--num_processes", "2", "-m", "this.never.runs"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1
    assert f"127.0.0.1:{port} is in use: set launch.main_process_port" in proc.stderr


def test_the_loopback_store_is_a_real_tcpstore_on_127_0_0_1():
    """torch's own TCPStore, as torchrun's rendezvous creates it (positional arguments, multi-tenant): served on
    127.0.0.1 only, a client reaches it, and a second server on the same port reuses the first."""
    import datetime

    import torch.distributed as dist

    from grpo_launch.node.loopback_store import bind_loopback, loopback_store_class

    reserved = bind_loopback(0)
    port = reserved.getsockname()[1]
    store_class = loopback_store_class(dist.TCPStore, reserved)
    timeout = datetime.timedelta(seconds=10)
    # world_size 1: one node, as StaticTCPRendezvous passes it for one machine (the ranks are not counted).
    server = store_class("localhost", port, 1, True, timeout, multi_tenant=True)
    again = store_class("127.0.0.1", port, 1, True, timeout, multi_tenant=True)
    other = store_class(host_name="127.0.0.1", port=0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", port, 1, False, timeout)
    server.set("key", "value")
    assert client.get("key") == b"value" and again.get("key") == b"value"
    sockets = listening({os.getpid()})
    assert ("127.0.0.1", port) in sockets and ("127.0.0.1", other.port) in sockets
    assert not any(p in (port, other.port) for a, p in sockets if not is_loopback(a)), sockets


@pytest.mark.vllm
def test_weight_sync_store_binds_what_the_plan_sets(tmp_path):
    """TRL's rank 0 hosts the weight-sync group's store: TRL sends ``master_address=get_ip()`` and vLLM's
    StatelessProcessGroup.create binds (master_address, vllm_group_port) (vllm/distributed/utils.py). The real
    vLLM code, with the VLLM_HOST_IP a one-host plan gives the trainers, listens on 127.0.0.1. Only the store: the
    NCCL group behind it needs CUDA."""
    require_vllm()
    plan = plan_recipe({"model_name_or_path": MODEL, "launch": {"vllm": "server"}}, "8xH100-80GB")
    head = trainers(plan)[0]
    port = free_port()
    code = (
        "import os, sys\n"
        "from vllm.utils.network_utils import get_ip\n"
        "from vllm.distributed.utils import StatelessProcessGroup\n"
        f"pg = StatelessProcessGroup.create(host=get_ip(), port={port}, rank=0, world_size=1)\n"
        "print(get_ip(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_HOST_IP"}
    env |= {"HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    if "VLLM_HOST_IP" in head.env:  # without it, get_ip() is the default-route address (main: reachable from outside)
        env["VLLM_HOST_IP"] = head.env["VLLM_HOST_IP"]
    proc = subprocess.Popen([str(VLLM_PY), "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        bound = proc.stdout.readline().strip()
        sockets = listening({proc.pid})
    finally:
        proc.communicate("", timeout=60)
    assert (bound, [a for a, p in sockets if p == port]) == ("127.0.0.1", ["127.0.0.1"]), sockets


# ------------------------------------------------------------------------------------------------ rendering


def _server_plan(addresses: tuple[str, ...], metrics: tuple[str, int] | None = None, **values):
    gpus = tuple(Gpu(str(i), "H100-80GB", 80 * 2**30) for i in range(8))
    topo = Topology(tuple(Host(f"h{i}", gpus, a) for i, a in enumerate(addresses)), "hostfile")
    launch = {"vllm": "server", "vllm_gpus": 8}
    if metrics:
        launch |= {"metrics_host": metrics[0], "metrics_port": metrics[1]}
    recipe = {"model_name_or_path": MODEL, **values, "launch": launch}
    return make_plan(topo, build_recipe(recipe), find_model_shape(MODEL))


@pytest.mark.parametrize(
    ("spec", "launch", "wrapped"),
    [
        ("cpu", {"num_processes": 2, "vllm": "off"}, True),
        ("8xH100-80GB", {"backend": "ddp"}, True),
        ("8xH100-80GB", {"backend": "zero3"}, True),
        ("cpu", {"num_processes": 1, "vllm": "off"}, False),  # accelerate's simple launcher: no torchrun, no store
    ],
)
def test_one_machine_binds_its_stores_to_loopback(spec, launch, wrapped):
    plan = plan_recipe({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "launch": {**launch, "main_process_port":
                        29611}}, spec)  # fmt: skip
    (train,) = trainers(plan)
    head = ("-m", "grpo_launch.node.loopback_store", "29611") if wrapped else ()
    assert train.argv[1 : 1 + len(head) + 2] == (*head, "-m", "accelerate.commands.launch")
    assert "--main_process_ip" not in train.argv and plan.train.main_process_ip == "127.0.0.1"
    assert train.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "main_process_ip" not in render_accelerate_config(plan)


def test_several_machines_keep_the_store_reachable():
    """Over several hosts the others must reach the store: no loopback wrapper, the first host's address."""
    plan = plan_recipe({"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "launch": {"backend": "zero3"}},
                       "2x8xH100-80GB")  # fmt: skip
    specs = trainers(plan)
    assert len(specs) == 2 and all(s.argv[1:3] == ("-m", "accelerate.commands.launch") for s in specs)
    assert all("GLOO_SOCKET_IFNAME" not in s.env for s in specs)
    assert (
        plan.train.main_process_ip == plan.train.hosts[0].address == render_accelerate_config(plan)["main_process_ip"]
    )


def test_network_interface_wins_over_loopback_gloo():
    plan = plan_recipe({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct",
                        "launch": {"num_processes": 2, "vllm": "off", "network_interface": "eth7"}}, "cpu")  # fmt: skip
    assert trainers(plan)[0].env["GLOO_SOCKET_IFNAME"] == "eth7"


def test_weight_sync_address_on_one_host_and_across_hosts():
    """VLLM_HOST_IP (what vLLM's get_ip() returns, so the address the weight-sync store binds): 127.0.0.1 when the
    trainers and the server share the one host, the trainer head's address when the server is on another."""
    one = plan_recipe({"model_name_or_path": MODEL, "launch": {"vllm": "server"}}, "8xH100-80GB")
    assert one.vllm.mode == "server" and one.vllm.bind_host == "127.0.0.1"
    assert trainers(one)[0].env["VLLM_HOST_IP"] == "127.0.0.1"
    two = _server_plan(("10.0.0.1", "10.0.0.2"))
    assert two.vllm.host == "h1" and trainers(two)[0].env["VLLM_HOST_IP"] == "10.0.0.1"


# ------------------------------------------------------------------------------------------------ the notice


@pytest.mark.parametrize(
    ("addresses", "public"),
    [
        (("10.0.0.1", "10.0.0.2"), ()),  # RFC 1918
        (("192.168.1.5", "172.16.0.9", "10.1.1.1"), ()),
        (("100.64.0.1", "100.64.0.2"), ()),  # CGNAT (shared address space)
        (("169.254.0.1", "169.254.0.2"), ()),  # link-local
        (("fd00::1", "fd00::2"), ()),  # unique local
        (("node-a", "node-b"), ()),  # names are not judged
        (("1.2.3.4", "10.0.0.2"), ("1.2.3.4",)),
        (("1.2.3.4", "1.2.3.5", "1.2.3.6"), ("1.2.3.4", "1.2.3.5", "1.2.3.6")),
        (("2001:4860::1", "2001:4860::2"), ("2001:4860::1", "2001:4860::2")),
    ],
)
def test_public_addresses_of_a_multi_host_plan_get_a_notice(addresses, public):
    plan = _server_plan(addresses, vllm_group_port=51999)
    notes = [n for n in plan.notices if "public address" in n]
    if not public:
        assert notes == []
        return
    (note,) = notes
    assert all(a in note for a in public) and "firewall" in note and '"Ports"' in note
    assert "8000 (the vLLM server" in note and "51999 (TRL's weight sync" in note
    if plan.train.num_machines > 1:
        assert f"{plan.train.main_process_port} (the trainers' rendezvous store" in note


def test_a_metrics_endpoint_beyond_loopback_is_named_in_the_notice():
    """launch.metrics_host bound beyond loopback: the run's metrics port is among those a firewall must keep (issue
    40); on loopback (the default) it is not."""
    plan = _server_plan(("1.2.3.4", "1.2.3.5"), vllm_group_port=51999)
    assert not any("metrics endpoint" in n for n in plan.notices)
    wide = _server_plan(("1.2.3.4", "1.2.3.5"), vllm_group_port=51999, metrics=("0.0.0.0", 9464))
    (note,) = [n for n in wide.notices if "public address" in n]
    assert "9464 (the run's metrics endpoint on the launcher's host" in note


def test_one_host_plan_has_no_exposure_notice():
    plan = plan_recipe({"model_name_or_path": MODEL, "launch": {"vllm": "server"}}, "8xH100-80GB")
    assert not [n for n in plan.notices if "public address" in n]
