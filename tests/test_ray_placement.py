"""The Ray backend's probe and placement on a real Ray cluster with uneven GPU nodes: h1 with 4 and h2 with 2 fake
GPUs (scripts/ray_hosts.sh: `ray start --num-gpus N` and a pynvml stand-in, because NVML needs a GPU). The
processes placed here print what they were given instead of training (a GPU plan cannot train on CPU); Ray's
placement groups, actors and GPU assignment are real.

Skipped without root, Ray, iproute2 or sshd, unless GRPO_LAUNCH_REQUIRE_RAY=1 (CI), which fails instead.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading

import pytest

from .helpers import ROOT, ray_cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]
PLACED = re.compile(r"ray: (\S+) runs on node (\S+) \(([\d.]+)\), pid \d+; planned GPUs \[([\d,]*)\] are Ray's GPUs "
                    r"\[([\d,]*)\] there")  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ray_cluster(tmp_path_factory.mktemp("ray-gpus"), 4, 2) as address:
        yield address


def cli(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_launch", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)  # fmt: skip


@pytest.mark.extended
def test_uneven_nodes_are_probed_on_each_node_and_planned(cluster, tmp_path):
    """Each node reports itself from a task pinned to it (its host name, address, its own GPU count by NVML); the
    plan uses both nodes' GPUs, never more than a node has."""
    shown = cli("inspect", "--ray", cluster)
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines() if line.strip().startswith("h")}
    assert rows["h1"][1:3] == ["10.77.0.11", "0-3"] and rows["h2"][1:3] == ["10.77.0.12", "0-1"], shown.stdout
    done = cli("plan", str(ROOT / "recipes" / "qwen1.5b.yaml"), "--ray", cluster, "--json", "--run-dir",
               str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    hosts = {h["name"]: (h["address"], len(h["gpus"])) for h in plan["topology"]["hosts"]}
    assert plan["topology"]["source"] == "ray" and hosts == {"h1": ("10.77.0.11", 4), "h2": ("10.77.0.12", 2)}
    used: dict[str, set[str]] = {}
    for host in plan["train"]["hosts"]:
        used.setdefault(host["name"], set()).update(host["gpus"])
    if plan["vllm"]["mode"] == "server":
        used.setdefault(plan["vllm"]["host"], set()).update(plan["vllm"]["gpus"])
    assert {h: len(g) for h, g in used.items()} == {"h1": 4, "h2": 2}  # every GPU of both nodes has a process


def test_each_process_gets_exactly_the_gpus_ray_assigns_in_its_hosts_placement_group(cluster, tmp_path):
    """The plan's processes, placed by the Ray backend and started by its runners inside the attempt's placement
    groups: each runs on its planned node with as many GPUs as planned, CUDA_VISIBLE_DEVICES is exactly the GPU ids
    Ray assigned (as the runner reports them), and processes on one node never share a GPU."""
    import os

    from grpo_launch.backends.ray import RayBackend
    from grpo_launch.models.builtin import find_model_shape
    from grpo_launch.planning import make_plan
    from grpo_launch.planning.plan_types import Runtime
    from grpo_launch.probe.local import probe_local
    from grpo_launch.recipe import load_recipe

    backend = RayBackend(cluster)
    topology = backend.probe(os.environ, probe_local(os.environ))
    recipe = load_recipe(ROOT / "recipes" / "qwen1.5b.yaml", [])
    shape = find_model_shape(str(recipe.get("model_name_or_path")))
    plan = make_plan(topology, recipe, shape, runtime=Runtime(run_dir=str(tmp_path / "run"), python=sys.executable))
    specs, outputs = run_placed(backend, plan, "gputest")
    given: dict[str, list[str]] = {}
    for spec in specs:
        out = outputs[spec.name]
        (name, node, _, planned, ray_ids) = PLACED.search(out).groups()
        assert (name, node) == (spec.name, spec.host)
        assert planned.split(",") == list(spec.gpus) and len(ray_ids.split(",")) == len(spec.gpus)
        assert f"CVD={ray_ids} on {spec.host}" in out  # the process sees exactly Ray's assignment
        given.setdefault(node, []).extend(ray_ids.split(","))
    assert {n: sorted(g) for n, g in given.items()} == {"h1": ["0", "1", "2", "3"], "h2": ["0", "1"]}


def test_a_recipe_asking_for_more_gpus_than_the_cluster_has_starts_nothing(cluster, tmp_path):
    """launch.vllm_gpus=8 on a 4 + 2 GPU cluster: refused with the count and the key, before anything starts."""
    run = tmp_path / "run"
    done = cli(str(ROOT / "recipes" / "qwen1.5b.yaml"), "--ray", cluster, "--run-dir", str(run), "launch.vllm_gpus=8")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "launch.vllm_gpus=8: the 2 hosts have 6 GPUs in all (4 + 2)" in done.stderr, done.stderr
    assert not (run / "logs").exists()
    left = subprocess.run(["pgrep", "-af", "grpo_launch.backends.ray.runner"], capture_output=True, text=True).stdout
    assert str(run) not in left


def run_placed(backend, plan, run_id: str) -> tuple[list, dict[str, str]]:
    """Every process of ``plan`` placed by the Ray ``backend`` and run as a shell that prints its
    CUDA_VISIBLE_DEVICES and host: the specs, and each one's output by name."""
    import os

    from grpo_launch.render.processes import all_processes
    from grpo_launch.rundir.layout import RUN_ID_ENV
    from grpo_launch.spec import RunContext

    lines: list[str] = []
    ctx = RunContext(sys.executable, str(ROOT), dict(os.environ), lines.append)
    show = "echo CVD=$CUDA_VISIBLE_DEVICES on $(hostname); sleep 2"
    specs = [dataclasses.replace(s, argv=("sh", "-c", show), env={RUN_ID_ENV: run_id}) for s in all_processes(plan)]
    placed = [backend.place(s, plan, ctx) for s in specs]
    outputs: dict[str, str] = {}

    def run(spec) -> None:
        outputs[spec.name] = subprocess.run(list(spec.argv), capture_output=True, text=True, timeout=120,
                                            env={**os.environ, RUN_ID_ENV: run_id}, cwd=ROOT).stdout  # fmt: skip

    try:
        with backend.attempt(placed, plan, ctx, lambda _reason: None):
            threads = [threading.Thread(target=run, args=(s,)) for s in placed]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        import ray

        ray.shutdown()
    return specs, outputs
