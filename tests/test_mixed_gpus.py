"""Mixed GPU types (issue 38): a ``--gpus`` spec of several groups, and the planner's roles by GPU type."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_launch.errors import PlanError, ProbeError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.planning.plan_types import Candidate
from grpo_launch.planning.planner import plan_split
from grpo_launch.planning.splits.split import SplitKind, enumerate_splits
from grpo_launch.recipe import load_recipe

from .helpers import plan_recipe


@pytest.mark.parametrize(
    ("spec", "types"),
    [
        ("8xH100-80GB+8xH20-96GB", ["H100-80GB"] * 1 + ["H20"]),
        ("2x8xH100-80GB+1x8xL40S-48GB", ["H100-80GB", "H100-80GB", "L40S"]),
        ("4xH100+2xH100", ["H100-80GB", "H100-80GB"]),
        ("8xH100-80GB+8xH20-96GB+8xL40S-48GB", ["H100-80GB", "H20", "L40S"]),
    ],
)
def test_a_spec_of_several_groups_gives_the_hosts_of_each_group_in_order(spec, types):
    t = parse_gpu_spec(spec)
    assert [h.gpus[0].name for h in t.hosts] == types
    assert [h.name for h in t.hosts] == [f"node{i}" for i in range(len(types))]
    assert all(len({g.visible_id for g in h.gpus}) == len(h.gpus) for h in t.hosts)
    assert "+" in t.describe() or len(set(types)) == 1


def test_uneven_groups_of_one_type_keep_their_sizes():
    t = parse_gpu_spec("4xH100+2xH100")
    assert t.gpus_per_host == (4, 2)
    assert t.gpu_types == ("H100-80GB",)


def test_an_unknown_model_in_a_group_still_needs_its_peak_and_bandwidth():
    t = parse_gpu_spec("8xH100-80GB+4xFOO-48GB@150TF@0.9TBs")
    assert t.spec_of("FOO").bf16_tflops == 150.0
    assert t.planning_gpu_name == "FOO"  # the slowest, as every GPU steps together in one colocated group
    assert parse_gpu_spec("8xH100-80GB+4xFOO-48GB").time_missing is not None


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("8xH100-80GB+8xFOO", "group 2 ('8xFOO')"),
        ("8xH100-80GB+", "group 2 (empty)"),
        ("8xH100-80GB+cpu", "group 2 ('cpu')"),
        ("8xNOPE+8xH100", "group 1 ('8xNOPE')"),
        ("8xH100+2x2x2xH20", "group 2 ('2x2x2xH20')"),
    ],
)
def test_a_bad_group_is_named(spec, names):
    with pytest.raises(ProbeError) as err:
        parse_gpu_spec(spec)
    assert names in err.value.message


# --- roles by GPU type, scored -------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
QWEN7, QWEN15 = ROOT / "recipes" / "qwen7b-math.yaml", ROOT / "recipes" / "qwen1.5b.yaml"


def _chosen(plan) -> Candidate:
    return next(c for c in plan.candidates if c.chosen)


def _roles(plan) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in plan.roles:
        out.setdefault(r.host, set()).add(str(r.role))
    return out


def _colocate_on_all(spec: str, recipe: Path, *overrides: str) -> float:
    """Today's plan of a mixed cluster (every GPU colocates, priced at the slowest type): its best time per prompt."""
    topology = parse_gpu_spec(spec)
    loaded = load_recipe(recipe, list(overrides))
    model = find_model_shape(loaded.values["model_name_or_path"])
    n, per = len(topology.hosts), topology.gpus_per_host[0]
    times = []
    for split in enumerate_splits(n, per, model):
        if split.kind != SplitKind.COLOCATE:
            continue
        plan = plan_split(topology, loaded, model, split)
        assert plan.estimate is not None and plan.estimate.step is not None
        times.append(plan.estimate.step.total_s / (plan.layout.completions_per_optimizer_step / 8))
    return min(times)


def test_h20_serves_and_h100_trains_at_over_twice_the_colocate_on_all_throughput():
    """The issue's target: qwen7b-math on 8×H100 + 8×H20, the H20 host serving, ≥ 2× today's colocate-on-all
    throughput (launch.mode=auto: a server on its own type overlaps its decoding with the training)."""
    plan = plan_recipe(QWEN7, "8xH100-80GB+8xH20-96GB", "launch.mode=auto")
    assert _roles(plan) == {"node0": {"train"}, "node1": {"vllm"}}
    assert plan.vllm.host == "node1" and [h.name for h in plan.train.hosts] == ["node0"]
    best = _chosen(plan)
    assert best.label.startswith("H20 serves, H100-80GB trains")
    assert _colocate_on_all("8xH100-80GB+8xH20-96GB", QWEN7) / best.per_prompt_s >= 2.0
    said = {d.what: d.why for d in plan.decisions}
    assert "H20 serves vLLM" in said["gpu_types"] and "H100-80GB trains" in said["gpu_types"]


def test_a_server_on_the_bandwidth_type_is_priced_on_its_bandwidth_and_the_training_on_the_flops_type():
    """The same server split, its types swapped: the H20 serving must decode faster than the H100 serving (4.0 vs
    3.35 TB/s), and the H100 training must train faster than the H20 training (989 vs 148 TF)."""
    h20_serves = plan_recipe(QWEN7, "8xH100-80GB+8xH20-96GB", "launch.vllm=server")
    h100_serves = plan_recipe(QWEN7, "8xH20-96GB+8xH100-80GB", "launch.vllm=server")
    a, b = h20_serves.estimate.step, h100_serves.estimate.step
    assert h20_serves.vllm.host == "node1" and h100_serves.vllm.host == "node0"  # the H20 host both times
    # per spec: the same split chosen on both orders (the H20 serves), priced the same
    assert a.training_s == pytest.approx(b.training_s) and a.generation_s == pytest.approx(b.generation_s)
    forced = {c.label: c for c in h20_serves.candidates if c.step is not None}
    assert any(lbl.startswith("H20 serves") for lbl in forced)
    # the training on H100s: as on an 8×H100 host alone, not at the H20's speed
    alone = plan_recipe(QWEN7, "2x8xH100-80GB", "launch.vllm=server", "launch.vllm_gpus=8")
    assert a.training_s == pytest.approx(alone.estimate.step.training_s, rel=0.01)


@pytest.mark.parametrize(
    ("spec", "fast", "recipe"),
    [
        ("8xH100-80GB+8xH20-96GB", "8xH100-80GB", QWEN7),
        ("8xH100-80GB+8xL40S-48GB", "8xH100-80GB", QWEN7),
        ("8xH100-80GB+8xL40S-48GB", "8xH100-80GB", QWEN15),
        ("4xA100-80GB+4xA10G-24GB", "4xA100-80GB", QWEN15),
        ("8xH100-80GB+8xH20-96GB+8xL40S-48GB", "8xH100-80GB", QWEN7),
    ],
)
def test_a_mixed_cluster_is_never_predicted_slower_than_its_faster_part_alone(spec, fast, recipe):
    mixed, alone = plan_recipe(recipe, spec), plan_recipe(recipe, fast)
    assert _chosen(mixed).per_prompt_s <= _chosen(alone).per_prompt_s * 1.001
    assert "gpu_types" in {d.what for d in mixed.decisions}


def test_hosts_left_idle_are_named_with_the_reason():
    plan = plan_recipe(QWEN7, "8xH100-80GB+8xH20-96GB")  # sync: the H100s alone beat every use of the H20s
    assert _roles(plan)["node1"] == {"idle"}
    said = {d.what: d.why for d in plan.decisions}
    assert "idle: node1" in said["gpu_types"] and "idle_gpus" in said
    assert any("node1" in n and "mixed GPU types" in n for n in plan.notices)


def test_trainers_stay_on_one_type_unless_every_gpu_colocates():
    plan = plan_recipe(QWEN7, "8xH100-80GB+8xH20-96GB+8xL40S-48GB", "launch.vllm=server")
    types = {parse_gpu_spec("8xH100-80GB+8xH20-96GB+8xL40S-48GB").hosts[int(h.name[4:])].gpus[0].name
             for h in plan.train.hosts}  # fmt: skip
    assert len(types) == 1


def test_uneven_hosts_of_one_type_plan_as_before():
    plan = plan_recipe(QWEN15, "4xH100-80GB+2xH100-80GB")
    assert plan.topology.gpu_types == ("H100-80GB",)
    assert "gpu_types" not in {d.what for d in plan.decisions}
    assert plan.vllm.mode == "server"


def test_a_mixed_cluster_where_nothing_fits_is_refused_with_fixes():
    with pytest.raises(PlanError) as err:
        plan_recipe(ROOT / "recipes" / "llama70b.yaml", "1xA10G-24GB+1xL4-24GB")
    assert err.value.fixes or err.value.hint


# --- costs: the weight sync between types, vLLM's memory per type --------------------------------------------------

# verl docs/advance/delta_weight_sync.md ("Measured results", H100 nodes): its nccl engine's full broadcast.
VERL_FULL_BROADCAST = [("Qwen/Qwen2.5-7B-Instruct", 5.5, 6.0), ("Qwen/Qwen2.5-32B-Instruct", 14.2, 18.1)]


@pytest.mark.parametrize(("model", "low", "high"), VERL_FULL_BROADCAST)
def test_the_cross_node_sync_stays_under_verls_full_broadcast_and_within_its_engine_overhead(model, low, high):
    """verl's nccl engine also all-gathers full tensors and stages them on rank 0 (offload on for the 7B): its
    figures bound TRL's path from above. The prediction must stay under them, and within the ~5× that engine's
    overhead explains (verl: about 5 GB/s; TRL #7131: about 28 GB/s), never a free sync."""
    from grpo_launch.planning.cost.steptime import sync_time

    shape = find_model_shape(model)
    predicted = sync_time(shape, across_nodes=True)
    assert low / 8 <= predicted <= low
    assert sync_time(shape, across_nodes=False) <= predicted


def test_the_trl_anchor_between_nodes_holds_for_the_sync_a_mixed_split_pays():
    """TRL PR #7131: Qwen3-32B synced in about 2.3 s from 16 H200 trainers to 16 H200 samplers (other nodes)."""
    from grpo_launch.planning.cost.steptime import sync_time

    assert sync_time(find_model_shape("Qwen3-32B"), across_nodes=True) == pytest.approx(2.3, rel=0.5)


def test_a_server_on_the_other_type_syncs_between_nodes_and_sizes_its_kv_cache_on_its_own_memory():
    plan = plan_recipe(QWEN7, "8xH100-80GB+8xH20-96GB", "launch.vllm=server")
    from grpo_launch.planning.cost.steptime import sync_time

    assert plan.estimate.step.sync_s == pytest.approx(sync_time(find_model_shape(plan.model.name), across_nodes=True))
    h20 = parse_gpu_spec("8xH20-96GB").hosts[0].gpus[0].memory_bytes / 2**30
    h100 = parse_gpu_spec("8xH100-80GB").hosts[0].gpus[0].memory_bytes / 2**30
    # vLLM's share is of the H20's memory, the training budget of the H100's
    assert plan.estimate.vllm_memory_gib == pytest.approx(plan.vllm.gpu_memory_utilization * h20)
    assert plan.estimate.gpu_memory_gib == pytest.approx(h100)


def test_the_batch_does_not_depend_on_the_splits_by_type():
    """The batch rule: a recipe that leaves its batch to the planner gets the one the topology gives (every GPU a
    trainer), the same as a cluster of one type with as many GPUs, whichever splits by type were compared."""
    values = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "num_generations": 8}
    mixed = plan_recipe(values, "8xH100-80GB+8xH20-96GB")
    uniform = plan_recipe(values, "2x8xH100-80GB")
    asked = {d.what: d.value for d in mixed.decisions}["prompts_per_step"]
    assert asked == {d.what: d.value for d in uniform.decisions}["prompts_per_step"]
    assert mixed.layout.completions_per_optimizer_step == asked * 8


def test_the_serving_type_in_the_middle_of_a_hostfile_serves_and_the_others_train_in_rank_order(tmp_path):
    """ssh hostfile order may put the serving type anywhere: h1 and h3 are H100s, h2 the H20. The rendered processes
    (as every backend runs them): the server on h2 with its GPUs, the trainers on h1 (machine rank 0, the main
    process) and h3 (rank 1), every trainer reaching the server at h2's address. (launch.vllm=server: left to
    choose, one H20 host cannot keep 16 H100 trainers fed and the H100s alone win.)"""
    from grpo_launch.backends.hostfile import probe_hostfile
    from grpo_launch.enums import Role
    from grpo_launch.render.processes import all_processes

    hf = tmp_path / "hosts"
    hf.write_text("h1 slots=8 gpu=H100-80GB\nh2 slots=8 gpu=H20-96GB\nh3 slots=8 gpu=H100-80GB\n")
    topology = probe_hostfile(hf, cpu=True)
    recipe = load_recipe(QWEN7, ["launch.vllm=server"])
    plan = make_plan(topology, recipe, find_model_shape(str(recipe.values["model_name_or_path"])))
    assert plan.vllm.host == "h2" and plan.vllm.gpus == tuple(str(i) for i in range(8))
    assert [(h.name, h.machine_rank) for h in plan.train.hosts] == [("h1", 0), ("h3", 1)]
    procs = all_processes(plan)
    assert {p.host for p in procs if p.role == Role.VLLM} == {"h2"}
    trainers = [p for p in procs if p.role == Role.TRAIN]
    assert [p.host for p in trainers] == ["h1", "h3"]
    for p in trainers:
        argv = " ".join(p.argv)
        assert "--main_process_ip h1" in argv and "--num_machines 2" in argv
        assert f"--machine_rank {['h1', 'h3'].index(p.host)}" in argv
    assert plan.vllm.base_url is not None and "h2" in plan.vllm.base_url


def test_a_server_fits_in_its_own_types_memory_not_the_smallest_of_the_cluster():
    """Qwen2.5-Math-7B's 15 GB of weights do not fit half an A10G (22 GiB), but fit an A100-80GB: the A100 host
    serves (checked against the smallest GPU of the cluster, no server would fit at all)."""
    plan = plan_recipe(QWEN7, "1xA100-80GB+1xA10G-24GB", "launch.vllm=server")
    assert plan.vllm.host == "node0" and [h.name for h in plan.train.hosts] == ["node1"]
    assert "A100-80GB serves vLLM" in {d.what: d.why for d in plan.decisions}["gpu_types"]


def test_a_server_over_two_types_decodes_at_the_lower_bandwidth_and_trainers_train_at_the_lower_flops():
    """An H20 (148 TF, 4.0 TB/s) and an L40S (362 TF, 0.86 TB/s): serving together they decode at the L40S's
    bandwidth; training together they train at the H20's FLOPs (each the slowest for its work)."""
    from grpo_launch.enums import VllmMode
    from grpo_launch.planning.gpu_types import role_specs
    from grpo_launch.planning.plan_types import ServerNode, TrainHost, VllmPlan

    topology = parse_gpu_spec("8xH20-96GB+8xL40S-48GB+8xH100-80GB")
    server = VllmPlan(VllmMode.SERVER, host="node0", nodes=(ServerNode("node1", "node1", ("0",)),))
    serve, train = role_specs(topology, server, (TrainHost("node2", "node2", 0, ("0",), 8),))
    assert (serve.name, train.name) == ("L40S", "H100-80GB")
    both = (TrainHost("node0", "node0", 0, ("0",), 8), TrainHost("node1", "node1", 1, ("0",), 8))
    assert role_specs(topology, VllmPlan(VllmMode.COLOCATE), both)[1].name == "H20"
