"""Hosts with different GPU counts (a Ray cluster or hostfile of 4- and 2-GPU nodes): accelerate runs the same
number of processes on every machine, so the planner considers only the server splits that leave equal training
hosts, and uses every GPU in them. The real planner and renderer; no machine touched."""

from __future__ import annotations

import pytest
import yaml

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.recipe import load_recipe
from grpo_launch.render import render_files
from grpo_launch.render.processes import all_processes

from .helpers import ROOT

L4 = ("NVIDIA L4", 23034 * 1024 * 1024)
H100 = ("NVIDIA H100 80GB HBM3", 81559 * 1024 * 1024)


def topology(counts: list[int], gpu: tuple[str, int] = L4) -> Topology:
    hosts = tuple(
        Host(f"h{i + 1}", tuple(Gpu(str(j), gpu[0], gpu[1]) for j in range(c)), address=f"10.0.0.{i + 1}")
        for i, c in enumerate(counts)
    )
    return Topology(hosts, "ray")


def plan_for(counts: list[int], recipe: str, *overrides: str, gpu: tuple[str, int] = L4):
    loaded = load_recipe(ROOT / "recipes" / recipe, list(overrides))
    return make_plan(topology(counts, gpu), loaded, find_model_shape(str(loaded.get("model_name_or_path"))))


def gpus_in_use(plan) -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    for spec in all_processes(plan):
        used.setdefault(spec.host, []).extend(spec.gpus or ())
    return used


@pytest.mark.parametrize(
    ("counts", "recipe", "gpu"),
    [([4, 2], "qwen1.5b.yaml", L4), ([2, 4], "qwen1.5b.yaml", L4), ([8, 8, 4], "qwen7b-math.yaml", H100),
     ([4, 4, 2], "qwen1.5b.yaml", L4)],
)  # fmt: skip
def test_every_gpu_of_uneven_hosts_has_one_process_and_trainers_are_equal_per_machine(counts, recipe, gpu):
    plan = plan_for(counts, recipe, gpu=gpu)
    used = gpus_in_use(plan)
    for i, c in enumerate(counts):
        host = f"h{i + 1}"
        assert sorted(used.get(host, []), key=int) == [str(j) for j in range(c)], (plan.split, used)
    per_machine = {h.processes for h in plan.train.hosts}
    assert len(per_machine) == 1 and plan.vllm.mode == "server", plan.split
    accelerate = yaml.safe_load(render_files(plan)["accelerate_config.yaml"])
    assert accelerate["num_machines"] == len(plan.train.hosts)
    assert accelerate["num_processes"] == sum(h.processes for h in plan.train.hosts)


def test_four_and_two_l4s_serve_from_the_smaller_host_and_train_on_the_larger():
    """Qwen2.5-1.5B on 4 + 2 L4s: of the three splits (h2 serves, h1 serves, h1's 2 extra GPUs serve) the search
    picks the 2-GPU host as the server and trains on the 4-GPU host."""
    plan = plan_for([4, 2], "qwen1.5b.yaml")
    assert plan.vllm.host == "h2" and [h.name for h in plan.train.hosts] == ["h1"], plan.split


@pytest.mark.parametrize("mode", ["colocate", "off"])
def test_modes_that_train_on_every_gpu_are_refused_on_uneven_hosts_with_the_fix(mode):
    with pytest.raises(PlanError, match=rf"different GPU counts \(h1=4, h2=2\) and launch.vllm={mode}") as e:
        plan_for([4, 2], "qwen1.5b.yaml", f"launch.vllm={mode}")
    assert "launch.vllm unset or server" in str(e.value.hint)


def test_counts_that_leave_no_equal_training_hosts_are_refused():
    with pytest.raises(PlanError, match=r"no split of hosts with GPU counts h1=4, h2=2, h3=1 leaves training hosts"):
        plan_for([4, 2, 1], "qwen1.5b.yaml")
