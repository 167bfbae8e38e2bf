"""Conformance: every plan of the grid (tests/conformance/grid.py), rendered as `grpo-launch plan` renders it, is
pushed through the code that consumes it on a GPU cluster. No GPU is needed: the libraries' own parsers,
validators and config builders are the oracle.

- vLLM server: vLLM 0.31's own `vllm serve` parser and engine-args builder (in .venv-vllm), compared field by field
  with what TRL 1.16's `build_command` produces for the same settings, parsed the same way;
- tensor parallelism: the divisions vLLM's parallel layers make while building the model (vLLM's own `divide` and
  `pad_vocab_size`);
- trainer recipe: TRL's GRPOConfig at the plan's world size, and the vLLM keys it implies against the server;
- accelerate: `accelerate launch`'s own parsing, validation and launcher preparation (tests/conformance/oracles.py);
- DeepSpeed: transformers' "auto" fill at the plan's world size, then DeepSpeed's DeepSpeedConfig;
- accelerate configs against the ones TRL itself ships (trl/accelerate_configs).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from grpo_launch.recipe.trl_schema import GRPO_CONFIG
from grpo_launch.render.processes import trainers, vllm_server, vllm_servers

from ..helpers import require_vllm
from ..trl_oracle import grpo_config
from .grid import GRID, hf_config, plan_case, vllm_oracle

pytestmark = pytest.mark.conformance
PLANS = {case.id: plan_case(case, Path(tempfile.mkdtemp(prefix=f"conf-{case.id}-"))) for case in GRID}
SERVER = [i for i, p in PLANS.items() if p.vllm.mode == "server"]
WITH_VLLM = [i for i, p in PLANS.items() if p.vllm.mode != "off" and p.model is not None]
DEEPSPEED = [i for i, p in PLANS.items() if p.train.backend.is_deepspeed]

# Where grpo-launch's server command differs from TRL's build_command on purpose.
DIFFERENCES_FROM_TRL = {
    "max_num_seqs": "grpo-launch sizes --max-num-seqs to the generation batch and the KV cache; TRL leaves vLLM's",
    "revision": "TRL passes --revision main when the recipe says main; grpo-launch leaves the hub default (main)",
}


def test_grid_is_wide_enough():
    backends = {p.train.backend for p in PLANS.values()}
    modes = {p.vllm.mode for p in PLANS.values()}
    assert len(PLANS) >= 30 and backends == {"ddp", "zero2", "zero3", "fsdp"} and modes == {"server", "colocate", "off"}
    assert {p.train.offload for p in PLANS.values()} >= {"none", "optimizer", "optimizer+params"}
    assert max(p.train.num_machines for p in PLANS.values()) >= 4 and {"bf16", "fp16"} <= {
        p.train.mixed_precision for p in PLANS.values()
    }


def _trl_script_args(plan) -> dict:
    v, values = plan.vllm, plan.trainer_values
    return {
        "model": str(values["model_name_or_path"]),
        "revision": values.get("model_revision"),
        "tensor_parallel_size": v.tensor_parallel_size,
        "data_parallel_size": v.data_parallel_size,
        "host": v.bind_host,
        "port": v.port,
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "max_model_len": v.max_model_len,
        "trust_remote_code": bool(values.get("trust_remote_code")),
        "vllm_model_impl": values.get("vllm_model_impl") or "vllm",
    }


@pytest.fixture(scope="module")
def vllm_verdicts() -> dict[str, dict]:
    """One run of tests/conformance/vllm_oracle.py (vLLM's and TRL's code, in .venv-vllm) for the whole grid."""
    require_vllm()
    cases = []
    for case_id, plan in PLANS.items():
        item: dict = {"id": case_id}
        if case_id in SERVER:
            argv = list(vllm_server(plan).argv)
            item.update(argv=argv[argv.index("serve") + 1 :], trl=_trl_script_args(plan), parse_trl=True,
                        fields=list(MULTI_NODE_FIELDS))  # fmt: skip
            extra = []
            if plan.vllm.expert_parallel:  # TRL's vllm-serve has no flag for it: passed as vLLM's own extra argument
                extra.append("--enable-expert-parallel")
            # nor for pipeline stages and the multi-node forms: the same
            for i, a in enumerate(argv):
                if a in NOT_IN_TRL:
                    extra += argv[i : i + 2]
            if extra:
                item["trl_extra_args"] = extra
            if plan.vllm.pipeline_parallel_size > 1 and plan.model:
                item["pp_layers"] = {"layers": plan.model.layers, "pp": plan.vllm.pipeline_parallel_size}
            engine = {"config": hf_config(plan.model)} if plan.vllm.nodes and plan.model else None
            if engine:  # vLLM checks a multi-node command where it builds the engine config
                item["engine"] = engine
            for i, worker in enumerate(vllm_servers(plan)[1:], start=1):
                w = list(worker.argv)
                cases.append({"id": f"{case_id}#headless{i}", "argv": w[w.index("serve") + 1 :],
                              "fields": list(MULTI_NODE_FIELDS), "engine": engine})  # fmt: skip
        if case_id in WITH_VLLM:
            m = plan.model
            item["shard"] = {
                "tp": plan.vllm.tensor_parallel_size,
                "heads": m.heads,
                "kv_heads": m.kv_heads,
                "intermediate": m.intermediate,
                "vocab": m.vocab,
                "expert_intermediate": m.moe_intermediate,
                "expert_parallel": plan.vllm.expert_parallel,
            }
        cases.append(item)
    return vllm_oracle(cases)


@pytest.mark.parametrize("case_id", SERVER)
def test_vllm_parses_the_server_command_as_planned(vllm_verdicts, case_id):
    plan, verdict = PLANS[case_id], vllm_verdicts[case_id]
    assert verdict["error"] is None, verdict["error"]
    got, v = verdict["parsed"], plan.vllm
    assert got["tensor_parallel_size"] == v.tensor_parallel_size
    assert got["pipeline_parallel_size"] == v.pipeline_parallel_size
    assert got["data_parallel_size"] == v.data_parallel_size and got["enable_expert_parallel"] is v.expert_parallel
    # CUDA_VISIBLE_DEVICES of the server's processes hold TP × PP × DP GPUs, its local ranks' on each host.
    world = v.tensor_parallel_size * v.pipeline_parallel_size * v.data_parallel_size
    assert len(v.gpus) + sum(len(n.gpus) for n in v.nodes) == world
    assert got["headless"] is False
    if v.spans_hosts:
        assert (got["nnodes"], got["node_rank"], got["master_addr"]) == (len(v.nodes) + 1, 0, v.address)
    elif v.nodes:
        assert (got["data_parallel_size_local"], got["data_parallel_address"], got["data_parallel_rpc_port"]) == (
            v.local_data_parallel_size, v.address, v.rpc_port)  # fmt: skip
        assert len(v.gpus) == v.local_data_parallel_size * v.tensor_parallel_size
    assert got["gpu_memory_utilization"] == v.gpu_memory_utilization
    assert got["max_model_len"] == v.max_model_len and got["max_num_seqs"] == v.max_num_seqs
    assert got["host"] == v.bind_host and got["port"] == v.port
    assert got["trust_remote_code"] is bool(plan.trainer_values.get("trust_remote_code"))
    assert got["model_impl"] == (plan.trainer_values.get("vllm_model_impl") or "vllm")
    assert got["weight_transfer_config"]["backend"] == "nccl" and got["enable_scale_out"] is True
    assert got["logprobs_mode"] == "processed_logprobs" and got["max_logprobs"] == -1


MULTI_NODE = [i for i in SERVER if PLANS[i].vllm.nodes]
DP_OVER_HOSTS = [i for i in MULTI_NODE if not PLANS[i].vllm.spans_hosts]
PIPELINES_OVER_HOSTS = [i for i in MULTI_NODE if PLANS[i].vllm.spans_hosts]
MULTI_NODE_FIELDS = ("data_parallel_size_local", "data_parallel_address", "data_parallel_rpc_port",
                     "data_parallel_start_rank", "nnodes", "node_rank", "master_addr", "master_port")  # fmt: skip
# vLLM flags TRL's vllm-serve does not have (passed to build_command as vLLM's own extra arguments)
NOT_IN_TRL = ("--pipeline-parallel-size", "--nnodes", "--node-rank", "--master-addr", "--master-port",
              "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port")  # fmt: skip


def test_the_grid_has_multi_node_servers():
    assert {len(PLANS[i].vllm.nodes) for i in DP_OVER_HOSTS} >= {1, 3}
    assert {(PLANS[i].vllm.pipeline_parallel_size > 1, PLANS[i].vllm.data_parallel_size > 1)
            for i in PIPELINES_OVER_HOSTS} == {(True, False), (True, True)}  # fmt: skip


@pytest.mark.parametrize("case_id", MULTI_NODE)
def test_vllm_builds_the_engine_config_of_every_host(vllm_verdicts, case_id):
    """vLLM's own engine-config builder (where it checks --nnodes, --node-rank and the data-parallel ranks) takes
    the command of every host of a server over several; together the hosts hold each (replica, stage host) once,
    every engine of TP × PP GPUs, the world TRL's client reads from /get_world_size (TP × PP × DP, one NCCL rank
    each, plus the trainer)."""
    v = PLANS[case_id].vllm
    hosts = [vllm_verdicts[case_id]] + [vllm_verdicts[f"{case_id}#headless{i}"] for i in range(1, len(v.nodes) + 1)]
    got = []
    for verdict in hosts:
        assert verdict["engine_error"] is None, verdict["engine_error"]
        p = verdict["engine_parallel"]
        world = v.tensor_parallel_size * v.pipeline_parallel_size * v.data_parallel_size
        assert p["world_size"] * p["data_parallel_size"] == world
        assert (p["tensor_parallel_size"], p["pipeline_parallel_size"]) == (
            v.tensor_parallel_size, v.pipeline_parallel_size)  # fmt: skip
        if v.spans_hosts:
            assert p["master_addr"] == v.address and p["master_port"] == v.master_port
            got.append((p["data_parallel_rank"], p["node_rank_within_dp"]))
        else:
            got += [(p["data_parallel_rank"] + j, 0) for j in range(p["data_parallel_size_local"])]
        if v.data_parallel_size > 1:  # where the other hosts' engines find the API server's
            assert p["data_parallel_master_ip"] == v.address
    stages = v.replica_gpus // len(v.gpus) if v.spans_hosts else 1
    assert sorted(got) == [(d, s) for d in range(v.data_parallel_size) for s in range(stages)]


@pytest.mark.parametrize("case_id", [i for i in SERVER if PLANS[i].vllm.pipeline_parallel_size > 1])
def test_the_largest_pipeline_stage_is_the_one_vllm_builds(vllm_verdicts, case_id):
    """The planner sizes each GPU for the largest stage (ModelShape.stage_fraction): vLLM's get_pp_indices."""
    plan = PLANS[case_id]
    stages = vllm_verdicts[case_id]["stage_layers"]
    assert sum(stages) == plan.model.layers and len(stages) == plan.vllm.pipeline_parallel_size
    assert max(stages) == round(plan.model.stage_fraction(plan.vllm.pipeline_parallel_size) * plan.model.layers)


@pytest.mark.parametrize("case_id", DP_OVER_HOSTS)
def test_vllm_parses_every_headless_host_of_a_multi_node_server(vllm_verdicts, case_id):
    """vLLM's multi-node data parallel: each other host runs the same engine settings headless, with its first
    rank; together the hosts hold every rank once."""
    v, head = PLANS[case_id].vllm, vllm_verdicts[case_id]["parsed"]
    starts = [0]
    for i, node in enumerate(v.nodes, start=1):
        verdict = vllm_verdicts[f"{case_id}#headless{i}"]
        assert verdict["error"] is None, verdict["error"]
        got = verdict["parsed"]
        assert got["headless"] is True and got["data_parallel_start_rank"] == i * v.local_data_parallel_size
        assert len(node.gpus) == v.local_data_parallel_size * v.tensor_parallel_size
        same = ("tensor_parallel_size", "data_parallel_size", "data_parallel_size_local", "data_parallel_address",
                "data_parallel_rpc_port", "model", "max_model_len", "gpu_memory_utilization")  # fmt: skip
        assert {k: got[k] for k in same} == {k: head[k] for k in same}
        starts.append(got["data_parallel_start_rank"])
    assert sorted(r + j for r in starts for j in range(v.local_data_parallel_size)) == list(range(v.data_parallel_size))


# Every field of vLLM's engine arguments is compared; these were once left out and are named so they stay in.
ENGINE_FIELDS_NAMED = {"dtype", "kv_cache_dtype", "enable_prefix_caching", "enforce_eager",
                       "distributed_executor_backend", "max_num_seqs", "gpu_memory_utilization"}  # fmt: skip


@pytest.mark.parametrize("case_id", SERVER)
def test_server_command_equals_trls_build_command(vllm_verdicts, case_id):
    """Both commands parsed by vLLM: every engine setting equal, apart from DIFFERENCES_FROM_TRL."""
    verdict = vllm_verdicts[case_id]
    assert verdict["trl_error"] is None and verdict["trl_parse_error"] is None
    ours, trl = verdict["parsed"], verdict["trl_parsed"]
    assert set(ours) == set(trl) and set(ours) >= ENGINE_FIELDS_NAMED, sorted(ENGINE_FIELDS_NAMED - set(ours))
    differ = {k for k in ours if ours[k] != trl[k]}
    assert differ <= set(DIFFERENCES_FROM_TRL), {k: (ours[k], trl[k]) for k in differ}


@pytest.mark.parametrize("case_id", WITH_VLLM)
def test_tensor_parallel_size_shards_the_whole_model(vllm_verdicts, case_id):
    assert vllm_verdicts[case_id]["shard_error"] is None


@pytest.mark.parametrize("case_id", list(PLANS))
def test_trainer_recipe_is_a_grpo_config_that_matches_the_server(case_id):
    plan = PLANS[case_id]
    values = yaml.safe_load((Path(plan.run_dir) / "trainer_recipe.yaml").read_text())
    cfg = grpo_config(values, plan.train.num_processes)
    assert cfg.generation_batch_size == plan.layout.generation_batch_size
    assert cfg.use_vllm is (plan.vllm.mode != "off")
    if plan.vllm.mode == "server":
        assert cfg.vllm_mode == "server" and cfg.vllm_server_base_url == plan.vllm.base_url
        assert values["max_prompt_length"] + values.get("max_completion_length", 512) <= plan.vllm.max_model_len
        for server in vllm_servers(plan):  # disjoint GPU sets on each of the server's hosts
            for t in trainers(plan):
                if (t.host or "") == (server.host or ""):
                    assert not set(t.gpus or ()) & set(server.gpus or ())
    elif plan.vllm.mode == "colocate":
        assert cfg.vllm_mode == "colocate" and cfg.vllm_tensor_parallel_size == plan.vllm.tensor_parallel_size
        assert cfg.vllm_max_model_length == plan.vllm.max_model_len
        assert cfg.vllm_gpu_memory_utilization == plan.vllm.gpu_memory_utilization
        assert plan.train.num_processes % cfg.vllm_tensor_parallel_size == 0


def _expected_type(plan) -> str:
    if plan.train.backend.is_deepspeed:
        return "DEEPSPEED"
    if plan.train.backend == "fsdp":
        return "FSDP"
    return "MULTI_GPU" if plan.train.num_processes > 1 else "NO"


@pytest.mark.parametrize("case_id", list(PLANS))
def test_accelerate_launch_resolves_the_planned_world(case_id):
    from .oracles import accelerate_launch_env

    plan = PLANS[case_id]
    for host in plan.train.hosts:
        spec = trainers(plan)[host.machine_rank]
        got = accelerate_launch_env(list(spec.argv), spec.launch_env)
        assert got["distributed_type"] == _expected_type(plan)
        assert (got["num_processes"], got["num_machines"]) == (plan.train.num_processes, plan.train.num_machines)
        assert got["machine_rank"] == host.machine_rank
        if got["torchrun"] is not None:
            assert int(got["torchrun"]["nproc_per_node"]) == host.processes
            assert str(got["torchrun"]["nnodes"]) in (
                str(plan.train.num_machines),
                f"{plan.train.num_machines}:{plan.train.num_machines}",
            )
        if plan.train.backend.is_deepspeed:  # the stage and precision come from the JSON (the DeepSpeed test)
            assert got["deepspeed_config_file"] == str(plan.paths.deepspeed_config)
        else:
            assert got["mixed_precision"] == plan.train.mixed_precision


@pytest.mark.parametrize("case_id", DEEPSPEED)
def test_deepspeed_accepts_the_config_transformers_fills(case_id):
    from .oracles import accelerate_launch_env, deepspeed_accepts, deepspeed_filled

    plan = PLANS[case_id]
    world, lay = plan.train.num_processes, plan.layout
    spec = trainers(plan)[0]
    launch_env = accelerate_launch_env(list(spec.argv), spec.launch_env)["launch_env"]
    ds = json.loads((plan.paths.deepspeed_config).read_text())
    kwargs = {k: v for k, v in plan.resolved_trainer_values.items() if k in GRPO_CONFIG}
    filled = deepspeed_filled(ds, kwargs, world, hidden_size=plan.model.hidden, launch_env=launch_env)
    parsed = deepspeed_accepts(filled, world)
    assert parsed.zero_optimization_stage == plan.train.backend.zero_stage
    assert parsed.train_batch_size == lay.per_device_train_batch_size * lay.gradient_accumulation_steps * world
    assert (parsed.zero_config.offload_optimizer is not None) == plan.train.offload.optimizer
    if plan.train.backend.zero_stage == 3:
        assert (parsed.zero_config.offload_param is not None) == plan.train.offload.params
    assert parsed.bfloat16_config.enabled is (plan.train.mixed_precision == "bf16")
    assert parsed.float16_config.enabled is (plan.train.mixed_precision == "fp16")


def test_accelerate_configs_agree_with_trls_own():
    """TRL ships accelerate configs (trl/accelerate_configs): FSDP2 with FULL_STATE_DICT, ZeRO-3 saving 16-bit
    weights and initialising under zero.Init. The rendered ones must agree on everything that matters."""
    import trl

    shipped = Path(trl.__file__).parent / "accelerate_configs"
    fsdp = next(p for i, p in PLANS.items() if p.train.backend == "fsdp")
    ours = yaml.safe_load((fsdp.paths.accelerate_config).read_text())["fsdp_config"]
    theirs = yaml.safe_load((shipped / "fsdp2.yaml").read_text())["fsdp_config"]
    assert ours == theirs
    zero3 = next(p for i, p in PLANS.items() if p.train.backend == "zero3")
    ours_ds = yaml.safe_load((zero3.paths.accelerate_config).read_text())["deepspeed_config"]
    theirs_ds = yaml.safe_load((shipped / "zero3.yaml").read_text())["deepspeed_config"]
    zero = json.loads((zero3.paths.deepspeed_config).read_text())["zero_optimization"]
    assert ours_ds["zero3_init_flag"] is theirs_ds["zero3_init_flag"] is True
    assert zero["stage"] == theirs_ds["zero_stage"] == 3
    assert zero["stage3_gather_16bit_weights_on_model_save"] is theirs_ds["zero3_save_16bit_model"] is True
