"""Mixed GPU types on a real Ray cluster (issue 38): h1 reports an H20 and h2 an H100 through the pynvml stand-in
keyed by each node's host name (scripts/ray_hosts.sh; NVML needs a GPU). The Ray backend's probe reads each node's
model, the plan serves on the H20 node and trains on the H100 node, and the Ray backend places each process there:
the processes print where they run instead of training (a GPU plan cannot train on CPU); Ray's placement groups,
actors and GPU assignment are real.

Skipped without root, Ray, iproute2 or sshd, unless GRPO_LAUNCH_REQUIRE_RAY=1 (CI), which fails instead.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from .helpers import ROOT, ray_cluster
from .test_ray_placement import PLACED, run_placed

pytestmark = [pytest.mark.ray, pytest.mark.slow]
MODELS = {"h1": ("NVIDIA H20", 102641664000), "h2": ("NVIDIA H100 80GB HBM3", 85520809984)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ray_cluster(tmp_path_factory.mktemp("ray-mixed"), 2, 2, models=MODELS) as address:
        yield address


def test_the_h20_node_serves_the_h100_node_trains_and_each_process_runs_on_its_roles_node(cluster, tmp_path):
    from grpo_launch.backends.ray import RayBackend
    from grpo_launch.models.builtin import find_model_shape
    from grpo_launch.planning import make_plan
    from grpo_launch.planning.types import Runtime
    from grpo_launch.probe.local import probe_local
    from grpo_launch.recipe import load_recipe

    t0 = time.monotonic()
    backend = RayBackend(cluster)
    topology = backend.probe(os.environ, probe_local(os.environ))
    assert [(h.name, {g.name for g in h.gpus}) for h in topology.hosts] == [
        ("h1", {"NVIDIA H20"}),
        ("h2", {"NVIDIA H100 80GB HBM3"}),
    ]
    recipe = load_recipe(ROOT / "recipes" / "qwen1.5b.yaml", ["launch.vllm=server"])
    shape = find_model_shape(str(recipe.get("model_name_or_path")))
    plan = make_plan(topology, recipe, shape, runtime=Runtime(run_dir=str(tmp_path / "run"), python=sys.executable))
    said = (plan.split, topology, [(c.label, c.per_prompt_s, c.rejected) for c in plan.candidates])
    assert plan.vllm.host == "h1" and [(h.name, h.machine_rank) for h in plan.train.hosts] == [("h2", 0)], said
    assert "H20 serves vLLM" in {d.what: d.why for d in plan.decisions}["gpu_types"]
    assert plan.vllm.address == "10.77.0.11"  # the trainers reach the server at the H20 node's address
    specs, outputs = run_placed(backend, plan, "mixedtest")
    where = {}
    for spec in specs:
        out = outputs[spec.name]
        (name, node, _, _, ray_ids) = PLACED.search(out).groups()
        assert (name, node) == (spec.name, spec.host)
        assert f"CVD={ray_ids} on {spec.host}" in out  # the process sees exactly Ray's GPUs on its own node
        where[spec.role] = {*where.get(spec.role, set()), node}
    assert {str(r): n for r, n in where.items()} == {"vllm": {"h1"}, "train": {"h2"}}, where
    print(f"mixed Ray placement: {time.monotonic() - t0:.0f} s")
