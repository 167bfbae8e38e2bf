"""The Ray backend's restart after a planned node left the cluster (grpo_launch.backends.ray.recover), without a
cluster: the cluster's views (alive addresses, a probe) and the clock are given as callables, the plans are real
(planned for two 8-GPU hosts, a dedicated vLLM host and a training host). The real cluster's course (a node killed
and rejoining, a node that never comes back) is tests/test_ray_cluster.py's."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_launch.backends.ray.recover import Cluster, moved_plan, replacements, wait_for_nodes
from grpo_launch.enums import FailureKind, RunState
from grpo_launch.machines.topology import Gpu, Host, Topology
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.planning.cost.workload import Calibration
from grpo_launch.recipe import build_recipe
from grpo_launch.spec import Failure, RunResult

MODEL = "Qwen/Qwen2.5-7B-Instruct"
H100 = tuple(Gpu(str(i), "H100-80GB", 80 * 2**30) for i in range(8))
A100 = tuple(Gpu(str(i), "A100-80GB", 80 * 2**30) for i in range(8))


def host(name: str, address: str, gpus: tuple[Gpu, ...] = H100) -> Host:
    return Host(name, gpus, address)


@pytest.fixture(scope="module")
def plan():
    topo = Topology((host("h1", "10.0.0.1"), host("h2", "10.0.0.2")), "ray")
    recipe = {"model_name_or_path": MODEL, "launch": {"vllm": "server", "vllm_gpus": 8, "node_wait_s": 60}}
    made = make_plan(topo, build_recipe(recipe), find_model_shape(MODEL))
    assert made.vllm.host == "h2" and [h.name for h in made.train.hosts] == ["h1"]
    return made


FAILED = RunResult(RunState.FAILED, 1, "train@h2 failed", failure=Failure(FailureKind.INFRA, "ActorDiedError: …"))


class FakeCluster:
    """The cluster as the wait sees it: ``joins`` maps a time to the nodes alive from then on."""

    def __init__(self, joins: dict[float, list[Host]]) -> None:
        self.now, self.joins, self.probes = 0.0, joins, 0

    def nodes(self) -> list[Host]:
        return next(nodes for at, nodes in sorted(self.joins.items(), reverse=True) if at <= self.now)

    def probe(self) -> Topology:
        self.probes += 1
        return Topology(tuple(self.nodes()), "ray")

    def view(self) -> Cluster:
        def sleep(s: float) -> None:
            self.now += s

        return Cluster(alive=lambda: {h.addr for h in self.nodes()}, probe=self.probe, sleep=sleep,
                       clock=lambda: self.now)  # fmt: skip


def test_the_same_nodes_restart_the_same_plan_without_a_probe(plan):
    fake, said = FakeCluster({0: [host("h1", "10.0.0.1"), host("h2", "10.0.0.2")]}), []
    assert wait_for_nodes(plan, FAILED, fake.view(), said.append, wait_s=60) is plan
    assert said == [] and fake.probes == 0


def test_a_node_that_rejoins_at_its_address_restarts_the_same_plan(plan):
    fake = FakeCluster({0: [host("h1", "10.0.0.1")], 12: [host("h1", "10.0.0.1"), host("h2", "10.0.0.2")]})
    said: list[str] = []
    assert wait_for_nodes(plan, FAILED, fake.view(), said.append, wait_s=60) is plan
    assert "node(s) h2 of the plan left the Ray cluster; waiting up to 60 s (launch.node_wait_s)" in said[0]
    assert "8 x H100-80GB" in said[0] and "all in the cluster again" in said[-1]


def test_a_replacement_with_the_same_gpus_takes_the_lost_nodes_place(plan):
    """h2 (the vLLM host) is lost; h3 has the same 8 H100 under another address: the plan is made again with h3 in
    h2's place, the same shape, the server's address and the trainers' URL h3's."""
    fake = FakeCluster({0: [host("h1", "10.0.0.1")], 10: [host("h1", "10.0.0.1"), host("h3", "10.0.0.3")]})
    said: list[str] = []
    moved = wait_for_nodes(plan, FAILED, fake.view(), said.append, wait_s=60)
    assert isinstance(moved, type(plan)) and moved is not plan
    assert [h.name for h in moved.topology.hosts] == ["h1", "h3"]
    assert moved.vllm.host == "h3" and moved.vllm.address == "10.0.0.3"
    assert moved.trainer_values["vllm_server_base_url"] == f"http://10.0.0.3:{plan.vllm.port}"
    assert [(h.name, h.machine_rank) for h in moved.train.hosts] == [("h1", 0)]
    assert (moved.split, moved.vllm.parallelism, moved.train.num_processes) == (
        plan.split, plan.vllm.parallelism, plan.train.num_processes)  # fmt: skip
    assert "replaced by nodes with the same GPUs: h2 by h3 (10.0.0.3); restarting there" in said[-1]


def test_a_lost_training_head_is_replaced_in_its_rank(plan):
    chosen = replacements(plan, Topology((host("h2", "10.0.0.2"), host("n9", "10.0.0.9")), "ray"))
    assert chosen is not None and chosen["h1"].addr == "10.0.0.9"
    moved = moved_plan(plan, chosen)
    assert moved is not None
    assert [(h.name, h.address, h.machine_rank) for h in moved.train.hosts] == [("n9", "10.0.0.9", 0)]
    # one training machine: its ranks meet on loopback (planning.plan_types.TrainPlan.main_process_ip), wherever it is
    assert moved.train.main_process_ip == "127.0.0.1" and moved.vllm.host == "h2"


def test_other_gpus_are_no_replacement_and_the_run_stops_after_the_wait(plan):
    """A node with other GPUs (A100) joins: it is probed once and not taken; after launch.node_wait_s the run stops
    with the reason and the resume command."""
    fake = FakeCluster({0: [host("h1", "10.0.0.1")], 5: [host("h1", "10.0.0.1"), host("h4", "10.0.0.4", A100)]})
    said: list[str] = []
    ended = wait_for_nodes(plan, FAILED, fake.view(), said.append, wait_s=60)
    assert isinstance(ended, RunResult) and ended.failure == FAILED.failure and ended.exit_code == 1
    assert fake.now >= 60 and fake.probes == 1
    why = "node(s) h2 of the plan left the Ray cluster and neither they nor a node with the same GPUs joined within 60"
    assert why in said[-1] and why in (ended.detail or "")
    assert f"grpo-launch resume {plan.run_dir}" in (ended.detail or "")


def test_no_wait_stops_at_once(plan):
    fake = FakeCluster({0: [host("h1", "10.0.0.1")]})
    ended = wait_for_nodes(plan, FAILED, fake.view(), lambda _: None, wait_s=0)
    assert isinstance(ended, RunResult) and fake.now == 0


def test_a_replacement_named_like_a_kept_host_is_named_by_its_address(plan):
    chosen = {"h2": host("h1", "10.0.0.7")}  # containers sharing a host name
    moved = moved_plan(plan, chosen)
    assert moved is not None and [h.name for h in moved.topology.hosts] == ["h1", "10.0.0.7"]


def test_the_default_wait_is_five_minutes():
    from grpo_launch.recipe.launch import LaunchSettings

    assert LaunchSettings().node_wait_s == 300 and dataclasses.is_dataclass(LaunchSettings)


def test_a_drain_of_a_planned_node_asks_once_for_a_checkpoint():
    from grpo_launch.backends.ray.drain import DrainWatch

    draining: dict[str, float | None] = {"other-node": None}
    asked: list[str] = []
    watch = DrainWatch({"id-1": "h1", "id-2": "h2"}, lambda: draining, asked.append)
    assert not watch.check() and asked == []  # a node the plan does not use
    draining["id-2"] = None
    assert watch.check() and watch.check()
    assert asked == ["node h2 is being drained (no deadline given)"]


def test_a_drain_with_a_deadline_says_when_the_node_goes():
    import time

    from grpo_launch.backends.ray.drain import notice

    assert notice("h2", time.time() + 120.4, time.time()) == "node h2 is being drained (it goes in 120 s)"


def test_a_stop_for_a_drain_is_a_restart_within_max_restarts(plan):
    from grpo_launch.execute.policy import Action, Spent, next_action

    stopped = RunResult(RunState.STOPPED_FOR_CHECKPOINT, 0, stopped_at_step=7)
    why = "node h2 is being drained (it goes in 60 s)"
    step = next_action(plan, stopped, Spent(), max_restarts=2, leaving=why)
    assert step.action == Action.RESTART and step.wait_s == 0
    assert step.note == f"restart 1/2 after {why}: resuming from checkpoint-7"
    assert next_action(plan, stopped, Spent(restarts=2), max_restarts=2, leaving=why).action == Action.STOP
    assert next_action(plan, stopped, Spent(), max_restarts=2).action == Action.STOP  # no drain: the run ends


def test_a_replaced_node_re_plans_with_the_plan_s_calibration(plan):
    """The plan made again on the replacement keeps the calibration the run was planned with (its step time stays
    the calibrated one)."""
    topo = Topology((host("h1", "10.0.0.1"), host("h2", "10.0.0.2")), "ray")
    slow = Calibration(generation=2.0, training=3.0, source="a run measured slower")
    calibrated = make_plan(topo, plan.recipe, plan.model, calibration=slow)
    moved = moved_plan(calibrated, {"h2": host("h3", "10.0.0.3")})
    assert moved is not None and moved.calibration == slow
    assert moved.estimate.step.total_s == pytest.approx(calibrated.estimate.step.total_s)
    assert moved.estimate.step.total_s > plan.estimate.step.total_s * 1.5
