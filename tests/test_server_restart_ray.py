"""A lost vLLM server replaced on a real Ray cluster (execute/server_keeper.py, train/server_restart.py): the head
here, two worker nodes in network namespaces (scripts/ray_hosts.sh) sharing this machine's file system, so the
trainer's node reads the control files the launcher writes into the run directory. The real vLLM CPU server serves
from one node, one real TRL 1.16 GRPOTrainer rank trains on the other (tests/cpu_server_trainer.py: TRL's NCCL
weight transfer made a no-op, since NCCL needs CUDA), each process in an actor in its host's placement group.

After step 1 the server's API process is killed with SIGKILL on its node. Its engine core lives on and holds the
actor's output open, so the Ray runner the launcher watches does not end: the server's refused port is what tells
the launcher. The replacement must run in the server's bundle on the same node with the same port and token (the
trainer's client, unchanged, reaches it and is let in), after the lost server's process group is gone, and the run
must reach max_steps with every step once, in one attempt.

Skipped without root, Ray, iproute2 or sshd, unless GRPO_LAUNCH_REQUIRE_RAY=1 (CI), which fails instead."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from .helpers import leftovers, ray_cluster, require_vllm
from .test_adapt_run import server_recipe
from .test_ray_mixed import combined_python
from .test_server_restart import check_replaced, drive_and_kill

# The default tier replaces a server on this machine (test_server_restart.py)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.vllm, pytest.mark.extended]


def test_a_server_killed_on_its_ray_node_is_replaced_there_under_the_trainer_on_the_other(tmp_path):
    require_vllm()
    with ray_cluster(tmp_path / "cluster", 1, 1) as address:
        recipe = server_recipe(tmp_path / "r.yaml", learning_rate=1e-9, max_steps=3, adapt=False)
        values = yaml.safe_load(recipe.read_text())
        values["launch"]["vllm_gpus"] = 1
        recipe.write_text(yaml.safe_dump(values))
        run = tmp_path / "run"
        argv = [
            combined_python(tmp_path),
            "-m",
            "grpo_launch",
            "run",
            str(recipe),
            "--ray",
            address,
            "--run-dir",
            str(run),
            "--network-interface",
            "eth0",
        ]
        driven = drive_and_kill(argv, dict(os.environ), [(1, "api")], max_steps=3)
        plan = json.loads((run / "plan.json").read_text())
        server = plan["vllm"]["host"]
        assert [h["name"] for h in plan["train"]["hosts"]] == [{"h1": "h2", "h2": "h1"}[server]], driven.out[-3000:]
        check_replaced(driven, run, restarts=1, max_steps=3)
        assert driven.hosts == [server, server]  # the replacement on the server's node ...
        nodes = re.findall(r"ray: vllm runs on node (\S+) ", driven.out)
        assert len(nodes) == 2 and len(set(nodes)) == 1, nodes  # ... in its placement group there
        assert "refuses connections" in driven.out  # seen at the port: the runner did not end with the API server
        port = plan["vllm"]["port"]
        for log in sorted((run / "logs").glob("vllm-*.log")):  # each start on the planned port
            assert re.search(rf"Starting vLLM server on http://\S+:{port}\b", log.read_text(errors="replace")), log
        assert leftovers(run, within=15.0) == []
