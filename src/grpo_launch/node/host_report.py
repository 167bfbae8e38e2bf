"""``python -m grpo_launch.node.host_report``: what this host has, as one JSON line, for a launcher planning from
another machine (over ssh for a hostfile's hosts, in an srun step on each node of a Slurm allocation).

It reads the host as :func:`grpo_launch.probe.local.probe_local` reads this one (NVML, CUDA_VISIBLE_DEVICES,
/proc/meminfo): ``{"node", "cpus", "memory_bytes", "gpus": [[name, memory bytes], …]}``. The node is Slurm's name
for it when there is one. :func:`grpo_launch.probe.hosts.collect_reports` gathers the reports.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from grpo_launch.probe.local import probe_local


def host_report(environ: Mapping[str, str]) -> dict[str, Any]:
    host = probe_local(environ).hosts[0]
    return {
        "node": environ.get("SLURMD_NODENAME") or host.name,
        "cpus": os.cpu_count(),
        "memory_bytes": host.memory_bytes,
        "gpus": [[g.name, g.memory_bytes] for g in host.gpus],
    }


def main() -> int:
    print(json.dumps(host_report(dict(os.environ))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
