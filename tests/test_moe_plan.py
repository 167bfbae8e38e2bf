"""Planning mixture-of-experts models: memory from the total parameters, compute from the active ones, vLLM
servers as TP × DP ranks with expert parallelism, training backends that hold them, and refusals whose fixes fit."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.errors import PlanError
from grpo_launch.machines.gpus import GIB
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning.cost.steptime import training_time
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.render.processes import vllm_server, vllm_servers

from .helpers import ROOT, plan_recipe

RECIPE = ROOT / "recipes" / "qwen3-30b-a3b.yaml"


def _plan(gpus: str, *overrides: str):
    return plan_recipe(RECIPE, gpus, *overrides)


def test_the_moe_recipe_plans_on_one_and_two_nodes_with_reasons():
    one = _plan("8xH100-80GB")
    assert one.vllm.mode == "colocate" and one.train.backend == "zero3"
    # On two nodes the search compares colocated engines with servers; asked for a server, the MoE one runs
    # TP × DP ranks over 8 GPUs (a whole node, or spread over both) with the experts spread over them.
    assert _plan("2x8xH100-80GB").vllm.mode in ("colocate", "server")
    two = _plan("2x8xH100-80GB", "launch.vllm=server", "launch.prompts_per_step=24")  # one global batch
    v = two.vllm
    assert (v.mode, v.tensor_parallel_size * v.data_parallel_size, v.expert_parallel) == ("server", 8, True)
    assert v.data_parallel_size > 1 and two.train.num_processes == 8  # the other node trains
    argv = vllm_server(two).argv
    assert argv[argv.index("--data-parallel-size") + 1] == str(v.data_parallel_size)
    assert "--enable-expert-parallel" in argv
    # The server's processes (one per host of a multi-node server) see all TP × DP GPUs between them.
    assert sum(len(p.gpus) for p in vllm_servers(two)) == 8
    why = {d.what: d.why for d in two.decisions}
    assert "mixture of experts" in why["vllm_data_parallel_size"] and "experts spread" in why[
        "vllm_data_parallel_size"]  # fmt: skip
    assert "expert parallelism" in why["vllm_tensor_parallel_size"]
    weights = two.model.weight_bytes_per_gpu(v.tensor_parallel_size, v.data_parallel_size, ep=True)
    assert weights < two.model.weight_bytes_bf16 / 4  # the experts spread over all 8 GPUs


def test_gpt_oss_20b_is_not_planned_as_a_small_dense_model():
    """The audit's case: gpt-oss-20b counted as 2.4B and planned as plain DDP on 2 × 8 × H100 (≈330 GB per GPU)."""
    plan = _plan("2x8xH100-80GB", "model_name_or_path=openai/gpt-oss-20b")
    assert plan.model.params > 20e9 and plan.train.backend != "ddp"


def test_compute_follows_the_active_parameters_and_decode_the_touched_experts():
    moe = find_model_shape("Qwen3-30B-A3B")
    dense_same_size = dataclasses.replace(moe, experts=0, experts_per_token=0, moe_layers=0)
    work = Workload(prompt_len=512, completion_len=1024, completions=64, num_generations=8, per_device=4,
                    gradient_checkpointing=False)  # fmt: skip
    from grpo_launch.machines.gpus import find_gpu_spec

    h100 = find_gpu_spec("H100")
    t_moe, _ = training_time(moe, h100, 8, DistBackend.DDP, Offload.NONE, work)
    t_dense, _ = training_time(dense_same_size, h100, 8, DistBackend.DDP, Offload.NONE, work)
    assert t_moe / t_dense == pytest.approx(moe.active_params / moe.params, rel=1e-6)
    # ZeRO-3 gathers every expert of a layer, touched or not: its gathers follow all the parameters
    z_moe, _ = training_time(moe, h100, 8, DistBackend.ZERO3, Offload.NONE, work)
    z_dense, _ = training_time(dense_same_size, h100, 8, DistBackend.ZERO3, Offload.NONE, work)
    assert z_dense - t_dense == pytest.approx(z_moe - t_moe, rel=1e-6)
    # One sequence reads about the active weights; a large batch touches every expert.
    assert moe.decode_read_bytes(1) == pytest.approx(2 * moe.active_params, rel=1e-6)
    assert moe.decode_read_bytes(1024) == pytest.approx(moe.weight_bytes_bf16, rel=1e-3)
    assert moe.decode_read_bytes(1) < moe.decode_read_bytes(8) < moe.decode_read_bytes(64)


def test_a_refusal_offers_lora_on_the_attention_and_the_fix_fits():
    with pytest.raises(PlanError) as e:
        _plan("4xH100-80GB", "launch.vllm=colocate", "launch.offload=none")
    text = e.value.render()
    assert "lora_target_modules=[q_proj,k_proj,v_proj,o_proj]" in text
    lora = next(f for f in e.value.fixes if f.setting == "use_peft")
    fixed = _plan("4xH100-80GB", "launch.vllm=colocate", "launch.offload=none", *lora.overrides())
    assert fixed.trainer_values["use_peft"] is True
    assert fixed.estimate.train_memory_gib * GIB <= 0.9 * fixed.estimate.gpu_memory_gib * GIB


def test_a_server_too_large_for_a_node_is_refused_not_misplanned():
    """DeepSeek-V3's 1.3 TB of bf16 weights cannot be served on 4 × 8 H100 with GPUs left to train, not even with
    its experts spread over 28 GPUs of a data-parallel server on every node: the refusal names the size and the
    reach instead of planning an OOM. On 16 × 8 H200 the experts fit a server spread over every node."""
    with pytest.raises(PlanError, match=r"does not fit vLLM on up to 28 GPUs of 80 GiB \(tensor parallel within"):
        _plan("4x8xH100-80GB", "model_name_or_path=deepseek-ai/DeepSeek-V3")
    v = _plan("16x8xH200", "model_name_or_path=deepseek-ai/DeepSeek-V3").vllm
    assert v.mode == "server" and v.expert_parallel and v.nodes
