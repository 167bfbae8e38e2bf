"""A one-host run's torch.distributed stores, on 127.0.0.1 only:
``python -m grpo_launch.node.loopback_store PORT -m accelerate.commands.launch ARGS...``.

torch's TCPStore has no listen address. Its options are the port, isServer, numWorkers, waitWorkers, timeout,
multiTenant, masterListenFd and useLibUV (torch/csrc/distributed/c10d/TCPStore.hpp, ``TCPStoreOptions``). The
host name it is given is only where its clients connect, so a server listens on every interface (``*:29500``, seen
in a real run). torchrun's agent (``pt_elastic``, inside ``accelerate launch``) hosts that server for the ranks to
rendezvous on (StaticTCPRendezvous; c10d's ``_create_tcp_store`` and the dynamic rendezvous's shared store in
torchrun's standalone mode). Anyone who reaches the host could then read and write the ranks' keys. The one way to
choose the address is ``master_listen_fd``: a socket the caller has bound, which the store takes over. vLLM's
StatelessProcessGroup.create does the same. This program binds those sockets to 127.0.0.1, which is all a run on
one host needs: the agent gives its ranks ``MASTER_ADDR=127.0.0.1`` (torchrun's ``--master-addr`` default, which
accelerate keeps for one machine).

It replaces ``torch.distributed.TCPStore`` with a subclass, in this process only, before the module runs. Every
server store the agent then starts takes a socket bound to 127.0.0.1 (its client side connects to 127.0.0.1 too). The
ranks are new interpreters that connect to the agent's store as clients (``TORCHELASTIC_USE_AGENT_STORE``), so they
need no change. ``PORT`` (launch.main_process_port) is bound first, before the module starts, without listening:
``accelerate launch``'s own check (``is_port_in_use``, a connect to localhost) then finds it refused, not taken.
When it finds a port taken, accelerate quietly switches to torchrun's standalone mode, whose stores would use other
ports. And another program that holds the port is named here, not met later as a rendezvous timeout.

A run over several hosts cannot use this program: the other hosts must reach the store (README.md, "Ports").
"""

from __future__ import annotations

import errno
import runpy
import socket
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
# TCPStore's parameters in order (torch/_C/_distributed_c10d.pyi): positional arguments are named with these.
_PARAMS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
           "master_listen_fd", "use_libuv")  # fmt: skip


def bind_loopback(port: int) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:``port`` (0: a free port), not yet listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As TCPStore's own server: a restarted attempt may find the last one's connections in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
    except OSError:
        sock.close()
        raise
    return sock


def loopback_store_class(base: type, reserved: socket.socket | None = None) -> type:
    """A subclass of TCPStore (``base``) whose servers listen on 127.0.0.1 only. ``reserved`` is the socket of the
    run's port, bound in advance; it serves the first server asked for on its port."""
    served: set[int] = set()
    held = {reserved.getsockname()[1]: reserved} if reserved is not None else {}

    class LoopbackTCPStore(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given = {**dict(zip(_PARAMS, args, strict=False)), **kwargs}
            port = int(given.get("port", 29500))
            # A second server on a port this process serves is TCPStore's multi-tenant reuse: no new socket.
            if given.get("is_master") and given.get("master_listen_fd") is None and port not in served:
                sock = held.pop(port, None) if port else None
                sock = sock or bind_loopback(port)
                sock.listen(4096)
                port = sock.getsockname()[1]
                served.add(port)
                given.update(host_name=LOOPBACK, port=port, master_listen_fd=sock.detach())
            super().__init__(**given)

    LoopbackTCPStore.__name__ = LoopbackTCPStore.__qualname__ = "TCPStore"
    return LoopbackTCPStore


def install(reserved: socket.socket | None) -> None:
    """Put the loopback TCPStore in place of torch's, in every torch.distributed module loaded so far (those loaded
    later import it from ``torch.distributed``)."""
    import torch.distributed as dist

    base = dist.TCPStore
    store = loopback_store_class(base, reserved)
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is base:
            module.TCPStore = store  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "-m" or not argv[0].isdigit():
        print("usage: python -m grpo_launch.node.loopback_store PORT -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    port, module, rest = int(argv[0]), argv[2], argv[3:]
    try:
        reserved = bind_loopback(port)
    except OSError as e:
        why = "in use" if e.errno == errno.EADDRINUSE else e.strerror
        print(
            f"grpo-launch: the trainers' rendezvous port {LOOPBACK}:{port} is {why}: set launch.main_process_port "
            "to a free port",
            file=sys.stderr,
        )
        return 1
    install(reserved)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
