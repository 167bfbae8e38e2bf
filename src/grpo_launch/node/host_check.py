"""``python -m grpo_launch.node.host_check '{"paths": [...], "ports": [...]}'``: before a hostfile run starts
anything, each host says whether it can take its part, as one JSON line (a
:class:`grpo_launch.rundir.records.HostCheck`): its grpo-launch version, which of the
recipe's local ``paths`` it lacks, which of its ``ports`` are taken, the vLLM version its Python would import, its
name and its RAM. :func:`grpo_launch.backends.ssh.check_hosts` runs it on every host over ssh; a host whose Python
cannot import grpo_launch fails here with "No module named grpo_launch", which the launcher reads as such.
"""

from __future__ import annotations

import json
import os
import sys

from grpo_launch import __version__
from grpo_launch.probe.local import host_memory_bytes, port_free
from grpo_launch.probe.pythons import vllm_version
from grpo_launch.rundir.records import HostCheck


def host_check(paths: list[str], ports: list[int]) -> HostCheck:
    return HostCheck(
        version=__version__,
        missing=tuple(p for p in paths if not os.path.exists(p)),
        busy=tuple(port for port in ports if not port_free(port)),
        vllm=vllm_version(),
        host=os.uname().nodename,
        memory_bytes=host_memory_bytes(),
    )


def main(argv: list[str]) -> int:
    asked = json.loads(argv[0]) if argv else {}
    check = host_check(list(asked.get("paths", [])), [int(p) for p in asked.get("ports", [])])
    print(json.dumps(check.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
