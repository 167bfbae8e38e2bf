"""Property-based: random topologies (1–64 GPUs, 1–8 nodes) × random recipes.

Every plan passes TRL 1.16's own GRPOConfig (world_size patched to the plan's trainer count), GPU sets are disjoint,
TP fits the model, and every refusal is a PlanError — never another exception. When a layout is refused, its first
suggested alternative, applied, must plan.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import MODEL_SHAPES
from grpo_launch.planning import make_plan
from grpo_launch.planning.cost.constants import HEADROOM
from grpo_launch.recipe import build_recipe

from .trl_oracle import grpo_config


@st.composite
def topologies(draw):
    nodes = draw(st.integers(1, 8))
    per_node = draw(st.integers(1, max(1, min(8, 64 // nodes))))
    gpu = draw(st.sampled_from(["H100-80GB", "L20-48GB", "A100-40GB", "RTX4090-24GB", "H200"]))
    return parse_gpu_spec(f"{nodes}x{per_node}x{gpu}")


@st.composite
def recipes(draw):
    values: dict = {}
    maybe = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    for key, strat in (
        ("per_device_train_batch_size", st.integers(1, 16)),
        ("gradient_accumulation_steps", st.integers(1, 16)),
        ("num_generations", st.integers(2, 16)),
    ):
        v = maybe(strat)
        if v is not None:
            values[key] = v
    which = draw(st.sampled_from(["none", "spg", "gbs"]))
    if which == "spg":
        values["steps_per_generation"] = draw(st.integers(1, 16))
    elif which == "gbs":
        values["generation_batch_size"] = draw(st.integers(2, 512))
    if draw(st.booleans()):
        values.update(do_eval=True, eval_strategy="steps")
        pe = maybe(st.integers(1, 16))
        if pe is not None:
            values["per_device_eval_batch_size"] = pe
    shape = draw(st.sampled_from(MODEL_SHAPES))
    values["model_name_or_path"] = f"org/{shape.name}"
    launch = {"vllm": draw(st.sampled_from(["auto", "server", "colocate", "off"]))}
    return values, launch, shape


def _apply_first_fix(values: dict, launch: dict, fixes) -> bool:
    """Apply the nearest typed fix (its first choice) to the recipe."""
    if not fixes or not fixes[0].assignments():
        return False
    for key, value in fixes[0].assignments():
        if key.startswith("launch."):
            launch[key.removeprefix("launch.")] = value
        else:
            values[key] = value
    return True


def _check(plan):
    n = plan.train.num_processes
    cfg = grpo_config(plan.trainer_values, n)
    assert cfg.generation_batch_size == plan.layout.generation_batch_size
    assert cfg.generation_batch_size % cfg.num_generations == 0
    train = {(h.name, g) for h in plan.train.hosts for g in h.gpus}
    v = plan.vllm
    serve = {(v.host, g) for g in v.gpus} | {(node.name, g) for node in v.nodes for g in node.gpus}
    assert not train & serve, "a GPU both trains and serves"
    assert len(train) == n
    assert len({h.processes for h in plan.train.hosts}) == 1, "accelerate needs equal processes per machine"
    if plan.vllm.mode == "server":
        tp, dp, pp = plan.vllm.tensor_parallel_size, plan.vllm.data_parallel_size, plan.vllm.pipeline_parallel_size
        assert len(serve) == tp * pp * dp  # the server's processes see TP × PP × DP GPUs between them, …
        assert all(len(node.gpus) == len(v.gpus) for node in v.nodes)  # … alike on every host: whole replicas, …
        assert len(v.gpus) % (tp * pp) == 0 if not v.spans_hosts else (tp * pp) % len(v.gpus) == 0  # … or stages
        if pp > 1:  # only where no server of TP alone holds the model, unless the recipe pins the stages
            assert plan.recipe.launch.vllm_pipeline_parallel_size or (plan.model and not plan.model.is_moe)
        assert len({v.host, *(node.name for node in v.nodes)}) == len(v.nodes) + 1  # one process per host
        # Data parallel for any model (vllm serve); expert parallelism only for a mixture of experts with DP.
        assert not plan.vllm.expert_parallel or (plan.model is not None and plan.model.is_moe and dp > 1)
        assert plan.model is None or tp in plan.model.valid_tp_sizes(tp)
        assert tp <= len(plan.topology.hosts[0].gpus)  # TP stays within a host; DP may span hosts
    if plan.vllm.mode == "colocate":
        assert n % plan.vllm.tensor_parallel_size == 0
    # One generation per optimizer step unless the recipe set its own generation rhythm.
    if not {"steps_per_generation", "generation_batch_size"} & set(plan.recipe.values):
        assert plan.layout.steps_per_generation == plan.layout.gradient_accumulation_steps
    # No GPU idles without a reason in the plan.
    idle = sum(r.role == "idle" for r in plan.roles)
    assert not idle or any(d.what == "idle_gpus" and d.value == idle for d in plan.decisions)
    est, model = plan.estimate, plan.model
    if est is not None and model is not None:
        # Nothing planned holds more than its GPU: training within the planned 90 %, vLLM's weights within its share.
        assert est.train_memory_gib is None or est.train_memory_gib <= HEADROOM * est.gpu_memory_gib * 1.0001
        v = plan.vllm
        if v.mode != "off" and v.gpu_memory_utilization:
            weights = model.weight_bytes_per_gpu(
                v.tensor_parallel_size, v.data_parallel_size, ep=v.expert_parallel, pp=v.pipeline_parallel_size
            )
            assert weights / 2**30 < v.gpu_memory_utilization * est.gpu_memory_gib


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(), recipes())
def test_every_plan_is_accepted_by_trl(topology, recipe_parts):
    values, launch, shape = recipe_parts
    values, launch = dict(values), dict(launch)
    for _attempt in range(4):  # one alternative per listed problem, at most
        try:
            plan = make_plan(topology, build_recipe({**values, "launch": launch}), shape)
        except PlanError as exc:
            if "batch layout" not in exc.message or not exc.fixes:
                return  # refused for memory/TP reasons: a PlanError is all that is asked
            assert _apply_first_fix(values, launch, exc.fixes), f"no applicable alternative: {exc}"
            continue
        _check(plan)
        return
    raise AssertionError("the suggested alternatives never led to a valid plan")
