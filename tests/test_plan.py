"""Plans for the seed cases and the shipped recipes."""

from __future__ import annotations

import re

import pytest

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.recipe import load_recipe

from .helpers import RECIPES, ROOT, plan_recipe
from .trl_oracle import grpo_config

QWEN15 = find_model_shape("Qwen/Qwen2.5-1.5B-Instruct")


def plan_for(values: dict, spec: str, model=QWEN15):
    return plan_recipe(values, spec, model=model)


def test_seed_case_4xL20_keeps_num_generations():
    """open-r1 on 4 × L20: vLLM on one GPU (the user's choice), 3 train; TRL failed with "(3 x 1) … divisible by …
    (8)". The group stays 8, one generation per step: accumulate 8."""
    plan = plan_for(
        {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "num_generations": 8, "per_device_train_batch_size": 1,
         "launch": {"vllm_gpus": 1}},
        "4xL20-48GB",
    )  # fmt: skip
    assert plan.vllm.mode == "server" and plan.vllm.gpus == ("3",)
    assert plan.train.hosts[0].gpus == ("0", "1", "2")
    assert plan.layout.num_generations == 8
    assert plan.layout.gradient_accumulation_steps == 8
    cfg = grpo_config(plan.trainer_values, 3)
    assert cfg.generation_batch_size == 24


def test_one_gpu_colocates():
    plan = plan_for({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct"}, "1xH100-80GB")
    assert plan.vllm.mode == "colocate"
    assert plan.trainer_values["vllm_mode"] == "colocate"
    assert plan.trainer_values["use_vllm"] is True


def test_server_values_for_trl():
    plan = plan_for(
        {
            "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct",
            "vllm_gpu_memory_utilization": 0.7,
            "launch": {"vllm": "server"},
        },
        "8xH100-80GB",
    )
    tv = plan.trainer_values
    assert tv["vllm_mode"] == "server" and tv["vllm_server_base_url"] == "http://127.0.0.1:8000"
    assert "vllm_gpu_memory_utilization" not in tv  # moved to the server
    assert plan.vllm.gpu_memory_utilization == 0.7
    assert any("moved to the vLLM server" in n for n in plan.notices)


def test_72b_on_five_nodes_places_a_dedicated_tp8_node():
    """TRL docs: a 72B model trained on 4 nodes with 1 vLLM node at TP 8. Asked for (a server of 8 GPUs), it is
    placed as the docs do: the last node serves, the other four train with machine ranks 0-3 and node0 as main."""
    plan = plan_for(
        {"model_name_or_path": "Qwen/Qwen2.5-72B-Instruct", "launch": {"vllm_gpus": 8, "vllm_tensor_parallel_size": 8}},
        "5x8xH100-80GB",
        model=find_model_shape("Qwen/Qwen2.5-72B-Instruct"),
    )
    assert plan.vllm.host == "node4" and plan.vllm.tensor_parallel_size == 8 and len(plan.vllm.gpus) == 8
    assert plan.train.num_machines == 4 and plan.train.num_processes == 32
    assert [h.name for h in plan.train.hosts] == ["node0", "node1", "node2", "node3"]
    assert [h.machine_rank for h in plan.train.hosts] == [0, 1, 2, 3] and plan.train.main_process_ip == "node0"
    assert plan.train.backend == "zero3"


def test_no_gpu_idles_without_a_stated_reason():
    """The old planner idled one GPU of two nodes for a small model and said nothing. The search now leaves none
    idle on these; where the recipe's own pins leave one, the plan says so and names the pins."""
    for spec in ("2x8xH100-80GB", "4x8xH100-80GB", "2x4xL20-48GB"):
        for model in ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-32B-Instruct"):
            plan = plan_for({"model_name_or_path": model}, spec, model=find_model_shape(model))
            assert not [r for r in plan.roles if r.role == "idle"], (spec, model, plan.vllm)
            assert not [d for d in plan.decisions if d.what == "idle_gpus"]
    pinned = plan_for({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "launch": {"vllm": "server",
                       "vllm_gpus": 1}}, "2x8xH100-80GB")  # fmt: skip
    idle = [r for r in pinned.roles if r.role == "idle"]
    (why,) = [d for d in pinned.decisions if d.what == "idle_gpus"]
    assert len(idle) == why.value == 1
    assert "the recipe pins launch.vllm=server, launch.vllm_gpus=1" in why.why and "unpin" in why.why, why.why


def test_open_r1_codeforces_on_four_nodes_uses_every_gpu():
    """open-r1's codeforces recipe (4 per device × 32 accumulation steps) on 4 nodes: with a server on one host only,
    an old search kept 8 trainers and idled 18 GPUs. A data-parallel server over several hosts (vLLM's multi-node
    data parallel) runs with every GPU busy, and the recipe's values are kept (the batch rule: its batch is TRL's
    4 × the trainers × 32)."""
    model = "Qwen/Qwen2.5-7B-Instruct"
    values = {"model_name_or_path": model, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 32,
              "num_generations": 16, "max_prompt_length": 2000, "max_completion_length": 8192,
              "gradient_checkpointing": True, "vllm_gpu_memory_utilization": 0.7}  # fmt: skip
    plan = plan_for(values, "4x8xH100-80GB", model=find_model_shape(model))
    assert not [r for r in plan.roles if r.role == "idle"]
    v = plan.vllm
    assert v.mode == "server" and v.nodes, "a server on several hosts"
    lay = plan.layout  # the recipe's batch values, kept on the split that wins (TRL's 4 × trainers × 32)
    assert (lay.per_device_train_batch_size, lay.gradient_accumulation_steps) == (4, 32)
    assert lay.completions_per_optimizer_step == 4 * lay.num_processes * 32
    assert plan.layout.steps_per_generation == plan.layout.gradient_accumulation_steps
    hosts = {r.host for r in plan.roles if r.role == "vllm"}
    assert hosts == {v.host, *(n.name for n in v.nodes)} and len(hosts) == len(v.nodes) + 1
    assert len(v.gpus) + sum(len(n.gpus) for n in v.nodes) == v.tensor_parallel_size * v.data_parallel_size


def test_a_multi_node_server_renders_an_api_server_and_headless_engines():
    from grpo_launch.render.processes import all_processes, vllm_servers

    model = "Qwen/Qwen2.5-7B-Instruct"
    plan = plan_for({"model_name_or_path": model, "launch": {"vllm": "server", "vllm_gpus": 16}}, "3x8xH100-80GB",
                    model=find_model_shape(model))  # fmt: skip
    v = plan.vllm
    head, worker = vllm_servers(plan)
    assert (head.host, worker.host) == ("node1", "node2") and [t.host for t in all_processes(plan)[2:]] == ["node0"]
    local = v.local_data_parallel_size
    assert local * v.tensor_parallel_size == 8 and v.data_parallel_size == 2 * local
    for spec in (head, worker):
        a = list(spec.argv)
        assert a[a.index("--data-parallel-size") + 1] == str(v.data_parallel_size)
        assert a[a.index("--data-parallel-size-local") + 1] == str(local)
        assert a[a.index("--data-parallel-address") + 1] == v.address == "node1"
        assert spec.gpus == tuple(str(i) for i in range(8))
    assert "--headless" not in head.argv and list(worker.argv)[-3:] == ["--data-parallel-start-rank", str(local),
                                                                           "--headless"]  # fmt: skip
    assert plan.trainer_values["vllm_server_base_url"] == "http://node1:8000"  # TRL talks to the API server only


def test_tp_must_fit_heads():
    with pytest.raises(PlanError, match=r"vLLM cannot shard Qwen2.5-1.5B over 3 GPUs: 3 does not divide its 2 KV"):
        plan_for({"model_name_or_path": "q", "launch": {"vllm_tensor_parallel_size": 3}}, "8xH100-80GB")


def test_server_on_cpu_is_refused():
    with pytest.raises(PlanError, match="needs CUDA GPUs"):
        plan_for({"launch": {"vllm": "server"}}, "cpu")


def test_cpu_never_picks_a_gpu_path():
    plan = plan_for({"launch": {"num_processes": 2}}, "cpu", model=None)
    assert plan.vllm.mode == "off" and plan.train.device == "cpu"
    assert plan.trainer_values["use_cpu"] is True and plan.trainer_values["bf16"] is False
    assert plan.train.num_processes == 2


def test_server_taking_every_gpu_is_refused():
    with pytest.raises(PlanError, match="leaving none"):
        plan_for({"model_name_or_path": "q", "launch": {"vllm": "server", "vllm_gpus": 2}}, "2xH100-80GB")


def test_model_too_big_names_fixes():
    with pytest.raises(PlanError, match=r"does not fit(.|\n)*more memory"):
        plan_for({"model_name_or_path": "x"}, "2xRTX4090", model=find_model_shape("meta-llama/Llama-3.3-70B-Instruct"))


@pytest.mark.parametrize("recipe", [r for r in RECIPES if "tiny" not in r.name], ids=lambda p: p.name)
@pytest.mark.parametrize("spec", ["1xH100-80GB", "4xH100-80GB", "8xH100-80GB", "2x8xH100-80GB"])
def test_every_shipped_recipe_plans(recipe, spec):
    r = load_recipe(recipe)
    model = find_model_shape(r.values["model_name_or_path"])
    assert model is not None, "shipped recipes use models from the built-in table"
    topology = parse_gpu_spec(spec)
    try:
        plan = make_plan(topology, r, model)
    except PlanError as exc:
        # Only a model too large for the GPUs may be refused, with a fix.
        assert "does not fit" in exc.message and any(f in str(exc) for f in ("LoRA", "more memory", "more GPUs")), str(
            exc
        )
        assert model.params > 30e9
        return
    grpo_config(plan.trainer_values, plan.train.num_processes)


def test_tiny_recipe_plans_on_cpu():
    r = load_recipe(next(p for p in RECIPES if p.name == "tiny-cpu.yaml"))
    plan = make_plan(parse_gpu_spec("cpu"), r, None)
    assert plan.train.num_processes == 2 and plan.vllm.mode == "off"
    grpo_config(plan.trainer_values, 2)


def test_a_latency_bound_batch_is_named_not_changed():
    """The shipped 1.5B recipe on 8 × H100 at a small batch (accumulation 3: 3 prompts per step) generates many times
    longer than it trains: decode latency. The plan keeps the recipe's batch and names the larger one that would use
    the GPUs, with what it gains per prompt, which a plan pinned at that batch confirms. (The recipe now states its
    own accumulation, 8: the override sets the small batch the planner used to choose.)"""
    from .helpers import ROOT, plan_recipe

    plan = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", "gradient_accumulation_steps=3")
    assert plan.layout.gradient_accumulation_steps == 3  # the recipe's batch, kept
    prompts = plan.layout.completions_per_optimizer_step // plan.layout.num_generations
    larger = next(d for d in plan.decisions if d.what == "prompts_per_step_larger")
    assert larger.value == 4 * prompts and "your choice" in larger.why and larger.why in plan.notices
    pinned = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", "gradient_accumulation_steps=3",
                         f"launch.prompts_per_step={larger.value}")  # fmt: skip
    assert any("gradient_accumulation_steps 3 (the recipe's) →" in n for n in pinned.notices)
    assert pinned.layout.completions_per_optimizer_step == larger.value * plan.layout.num_generations
    per_prompt = plan.estimate.step.total_s / prompts
    assert pinned.estimate.step.total_s / larger.value < 0.95 * per_prompt


def test_every_split_kind_has_a_default_rank():
    """Without an estimate (an unknown GPU) the default split is chosen by kind: every kind has a rank."""
    from grpo_launch.planning.search import DEFAULT_ORDER
    from grpo_launch.planning.splits.split import SplitKind

    assert sorted(k for kinds in DEFAULT_ORDER for k in kinds) == sorted(SplitKind)
    plan = plan_for({"model_name_or_path": "q", "launch": {"vllm": "server", "vllm_gpus": 3}}, "3x4xGPU-24GB")
    assert plan.estimate is not None and plan.estimate.step is None  # an unknown GPU: memory only, no time
    # 1 GPU of every host (a spread server) ranks before 3 GPUs of one host with 6 idle elsewhere.
    assert plan.vllm.mode == "server" and len(plan.vllm.nodes) == 2 and not [r for r in plan.roles if r.role == "idle"]


def test_a_vllm_length_beyond_the_models_positions_is_refused_with_lengths_that_fit():
    """Found on the real CPU server: --max-model-len 528 for a model of 512 positions and vLLM's ModelConfig
    refuses to start. The plan refuses first (config.json's max_position_embeddings), with lengths that fit."""
    from grpo_launch.probe.model import resolve_model_shape

    from .helpers import ensure_tiny_assets

    path = str(ensure_tiny_assets() / "model")
    shape, _ = resolve_model_shape(path)
    assert shape.max_positions == 512
    values = {"model_name_or_path": path, "max_prompt_length": 500, "max_completion_length": 100}
    with pytest.raises(PlanError, match=r"600 tokens .* exceeds .*512 positions") as e:
        plan_for(values, "2xL4-24GB", model=shape)
    assert [(f.setting, f.value) for f in e.value.fixes] == [("max_prompt_length", 412), ("max_completion_length", 12)]
    assert plan_for({**values, "max_prompt_length": 412}, "2xL4-24GB", model=shape).vllm.max_model_len == 512
    assert plan_for(values, "cpu", model=shape).vllm.mode == "off"  # no vLLM, no limit to meet


LLAMA405 = "meta-llama/Llama-3.1-405B-Instruct"


def _llama405(gpus: str, **launch):
    values = {"model_name_or_path": LLAMA405, "use_peft": True, "num_generations": 8, "max_completion_length": 1024,
              "per_device_train_batch_size": 1, "max_prompt_length": 512, "launch": launch}  # fmt: skip
    return plan_for(values, gpus, model=find_model_shape(LLAMA405))


def test_a_dense_model_no_host_can_serve_gets_pipeline_stages_over_whole_hosts():
    """Llama-3.1-405B (756 GiB of bf16 weights) does not fit half of 8 × 80 GiB at TP 8: the server's replica is
    a pipeline over whole hosts, each GPU holding its stage's layers within the weight share."""
    from grpo_launch.planning.cost.constants import VLLM_WEIGHTS_SHARE
    from grpo_launch.render.processes import vllm_servers

    plan = _llama405("8x8xH100-80GB")
    v, model = plan.vllm, plan.model
    assert v.mode == "server" and v.pipeline_parallel_size > 1 and v.tensor_parallel_size == 8 and v.spans_hosts
    assert model.weight_bytes_bf16 / 8 > VLLM_WEIGHTS_SHARE * 80 * 2**30  # TP alone would not fit
    per_gpu = model.weight_bytes_per_gpu(8, pp=v.pipeline_parallel_size)
    assert per_gpu <= VLLM_WEIGHTS_SHARE * 80 * 2**30 and per_gpu >= model.weight_bytes_bf16 / (8 * v.replica_gpus // 8)
    assert len(v.nodes) + 1 == v.pipeline_parallel_size * v.data_parallel_size  # one stage per host
    assert not [r for r in plan.roles if r.role == "idle"]
    assert any(d.what == "vllm_pipeline_parallel_size" and "no server of tensor parallelism alone" in d.why
               for d in plan.decisions)  # fmt: skip
    specs = vllm_servers(plan)
    ranks = []
    for spec in specs:
        a = list(spec.argv)
        assert a[a.index("--nnodes") + 1] == str(len(specs)) and a[a.index("--master-addr") + 1] == v.address
        assert a[a.index("--pipeline-parallel-size") + 1] == str(v.pipeline_parallel_size)
        assert "--data-parallel-size-local" not in a and "--data-parallel-start-rank" not in a
        ranks.append(int(a[a.index("--node-rank") + 1]))
        assert ("--headless" in a) is (ranks[-1] > 0)
        # vLLM's get_ip() on each host: its own address, where the others reach its message queue
        assert spec.env["VLLM_HOST_IP"] == next(h.addr for h in plan.topology.hosts if h.name == spec.host)
    assert ranks == list(range(len(specs)))


def test_pipelines_are_only_planned_where_tensor_parallelism_alone_does_not_fit():
    plan = plan_for({"model_name_or_path": "Qwen/Qwen2.5-72B-Instruct", "launch": {"vllm": "server"}},
                    "4x8xH100-80GB", model=find_model_shape("Qwen/Qwen2.5-72B-Instruct"))  # fmt: skip
    assert plan.vllm.pipeline_parallel_size == 1
    assert all(c.pipeline_parallel_size == 1 for c in plan.candidates)


def test_a_pinned_pipeline_size_is_planned_and_colocate_refuses_it():
    plan = plan_for({"model_name_or_path": "q", "launch": {"vllm_gpus": 4, "vllm_pipeline_parallel_size": 2}},
                    "8xH100-80GB")  # fmt: skip
    v = plan.vllm
    assert v.mode == "server" and v.pipeline_parallel_size == 2 and len(v.gpus) == 4 and not v.nodes
    assert v.tensor_parallel_size * 2 * v.data_parallel_size == 4
    with pytest.raises(PlanError, match="colocate mode runs tensor parallelism only"):
        plan_for({"model_name_or_path": "q", "launch": {"vllm": "colocate", "vllm_pipeline_parallel_size": 2}},
                 "8xH100-80GB")  # fmt: skip


def test_a_refused_dense_model_says_how_far_pipelines_reach():
    with pytest.raises(PlanError, match=r"does not fit .*pipeline stages over nodes"):
        _llama405("2x8xH100-80GB")


@pytest.mark.parametrize("gpus", ["4xV100-32GB", "2xT4-16GB"])
def test_a_gpu_without_bf16_is_refused_with_fp16_and_the_fix_passes_transformers(gpus):
    """V100 and T4 have no bf16: TRL defaults bf16 on, and transformers' TrainingArguments refuses it at the first
    trainer's start. No such GPU runs here, so transformers' own check runs with its bf16 probe answering as a V100
    would (a stand-in for the GPU); the values checked are the plan's."""
    from unittest import mock

    import transformers.training_args as ta
    from trl import GRPOConfig

    values = {"model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "max_completion_length": 256}
    with pytest.raises(PlanError, match="no bf16") as exc:
        plan_for(values, gpus)
    (fix,) = exc.value.fixes
    fixed = plan_for({**values, **dict(fix.assignments())}, gpus)
    assert fixed.train.mixed_precision == "fp16"
    tv = fixed.trainer_values
    kwargs = {"output_dir": "/tmp/grpo-bf16", "report_to": "none", "bf16": tv.get("bf16"), "fp16": tv.get("fp16")}
    with mock.patch.object(ta, "is_torch_bf16_gpu_available", return_value=False):
        GRPOConfig(**kwargs)  # the planned values start
        with pytest.raises(ValueError, match="support bf16"):
            GRPOConfig(output_dir="/tmp/grpo-bf16", report_to="none")  # what the recipe would have run
    assert plan_for(values, "4xA10-24GB").train.mixed_precision == "bf16"


def test_plan_json_shows_every_candidate_at_the_compared_batch():
    """Every candidate in plan.json says how it ended, at the one prompts-per-step all are compared at; one the
    search did not plan in full carries the lower bound that already lost to the chosen step."""
    from grpo_launch.render.plan_json import plan_to_dict

    # one global batch (the recipe's own is per device, so candidates with fewer trainers would run fewer prompts)
    plan = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "4x8xH100-80GB", "launch.prompts_per_step=48")
    cands = plan_to_dict(plan)["candidates"]
    (chosen,) = [c for c in cands if c["status"] == "chosen"]
    chosen_step = sum(chosen["step"].values())
    assert {c["status"] for c in cands} <= {"chosen", "planned", "bounded", "outscored", "rejected"}
    for c in cands:
        assert c["server_gpus"] + c["trainers"] + c["idle_gpus"] >= 32 or c["mode"] == "colocate"
        if c["status"] == "outscored":  # a TP × DP variant of its size that lost on generation alone
            assert c["step"] is None and c["outscored"].startswith("generation + sync")
        if c["status"] in ("chosen", "planned", "bounded", "outscored"):
            assert c["prompts_per_step"] == chosen["prompts_per_step"]
        if c["status"] == "bounded":
            assert c["step"] is None and c["step_lower_bound_s"] >= chosen_step
        if c["status"] == "rejected":
            assert c["rejected"]


def test_an_unknown_gpu_gets_a_memory_estimate_and_says_why_time_is_missing():
    """A GPU the table lacks: memory is still estimated from its memory (plan.json has it), the step time is not,
    and one line says how to give the speed; given it (@TF@TB/s), time is estimated and follows the peak."""
    from grpo_launch.render.plan_json import plan_to_dict

    values = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "launch": {"vllm": "colocate"}}
    plan = plan_for(values, "4xFOO-48GB")
    est = plan_to_dict(plan)["estimate"]
    assert est["time_s"] is None and "FOO is not in the GPU table" in est["time_missing"]
    assert "--gpus 4xFOO-48GB@" in est["time_missing"]
    known = plan_for(values, "4xL40S-48GB")  # the same memory, a table GPU: the same memory estimate
    assert est["memory_per_training_gpu_gib"]["total"] == pytest.approx(known.estimate.train_memory_gib, rel=0.05)
    slow = plan_for(values, "4xFOO-48GB@100TF@0.9TBs").estimate.step
    fast = plan_for(values, "4xFOO-48GB@400TF@0.9TBs").estimate.step
    assert slow is not None and fast is not None and fast.training_s < slow.training_s / 3


def test_an_offload_whose_host_ram_cannot_be_checked_is_warned_about():
    """Llama-3.1-405B in full on 4 × 8 H100: 8 trainers fit the GPUs only with ZeRO-3 offloading everything, which
    needs terabytes of host RAM per node. Simulated hosts have no known RAM: the plan says so instead of passing
    it in silence (on real hosts, a node with less RAM is refused)."""
    plan = plan_recipe(ROOT / "recipes" / "llama70b.yaml", "4x8xH100-80GB",
                       "model_name_or_path=meta-llama/Llama-3.1-405B-Instruct")  # fmt: skip
    assert plan.train.offload == "optimizer+params"
    (warning,) = [w for w in plan.warnings if "host RAM per node" in w]
    assert "not known here" in warning and f"{plan.estimate.host_memory_per_node_gib:,.0f} GiB" in warning
    small = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB")
    assert not any("host RAM" in w for w in small.warnings)


def test_lora_is_explained_and_its_sync_charged_as_full_weights():
    """Issue 41: LoRA planned (memory 52.5 → 28.0 GiB per training GPU on 8 × H100) without a Why row, and nothing
    said how the adapter reaches vLLM. TRL 1.16 merges it and sends every base tensor at each sync
    (trl/generation/vllm_generation.py, _iter_named_params), so the sync is charged as full fine-tuning's."""
    gpus = parse_gpu_spec("8xH100-80GB")
    full_r = load_recipe(ROOT / "recipes" / "qwen7b-math.yaml", ["launch.vllm=server"])
    lora_r = load_recipe(ROOT / "recipes" / "qwen7b-math.yaml", ["launch.vllm=server", "use_peft=true", "lora_r=32"])
    model = find_model_shape(full_r.values["model_name_or_path"])
    full, lora = make_plan(gpus, full_r, model), make_plan(gpus, lora_r, model)
    row = next(d for d in lora.decisions if d.what == "use_peft")
    assert "LoRA rank 32" in row.why and "merges the adapter" in row.why and "sends all of them" in row.why
    assert not any(d.what == "use_peft" for d in full.decisions)
    assert lora.estimate and full.estimate and lora.estimate.step.sync_s == pytest.approx(full.estimate.step.sync_s)
    assert lora.estimate.train_memory_gib < full.estimate.train_memory_gib


def test_explain_shows_every_variant_and_alike_layouts_prefer_fewer_gpus_per_engine():
    """Issue 41: --explain kept only the best TP per server size (colocate TP 1 and TP 2 were absent) and TP 4 won
    for a 1.5B model on a 2 % predicted difference from an uncalibrated model. Every variant is listed now, with the
    figures it lost by; within the model's uncertainty (cost.constants STEP_UNCERTAINTY, 10 %) the layout with
    fewer GPUs per engine is chosen, and a Why row says so. A calibrated plan keeps the fastest."""
    from grpo_launch.cli.explain import explain_sections
    from grpo_launch.cli.tables import plain_text
    from grpo_launch.planning.cost.constants import STEP_UNCERTAINTY
    from grpo_launch.planning.cost.workload import Calibration

    plan = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB")
    assert plan.vllm.mode == "colocate" and plan.vllm.tensor_parallel_size == 1
    colocated = {c.label: c for c in plan.candidates if c.mode == "colocate"}
    assert set(colocated) >= {"colocate (8 engine(s) × TP 1)", "colocate (4 engine(s) × TP 2)",
                              "colocate (2 engine(s) × TP 4)"}  # fmt: skip
    tp4 = colocated["colocate (2 engine(s) × TP 4)"]
    assert tp4.status == "outscored" and "within the model's 10%" in tp4.outscored
    figures = [float(x) for x in re.findall(r"([\d.]+) s", tp4.outscored)]
    assert figures[0] < figures[1] <= figures[0] * (1 + STEP_UNCERTAINTY)  # faster, but alike
    row = next(d for d in plan.decisions if d.what == "vLLM engines")
    assert row.value == "TP 1 × DP 8" and "fewest GPUs per engine" in row.why
    assert "outscored: generation + sync" in plain_text(explain_sections(plan))
    fitted = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", calibration=Calibration(source="run"))
    assert not any(d.what == "vLLM engines" for d in fitted.decisions)
