"""The cost model against the libraries' own accounting (the cost-model issue's first references):

- model states per GPU against DeepSpeed's own estimators (estimate_zero2_model_states_mem_needs,
  estimate_zero3_model_states_mem_needs), fed the parameter count and largest layer that DeepSpeed's own
  model_to_params reads from the real architecture built on the meta device, within ±2 % (the worst case of the
  grid is 0.8 %: a 20 % error in any term fails);
- the KV cache per token per GPU against vLLM 0.31's own layout for every built-in model at every TP size the
  planner offers (tests/conformance/vllm_oracle.py, `kv` cases), exactly.

DeepSpeed's host-memory estimate carries an additional_buffer_factor (1.5); only the GPU side is compared here,
the host side is the same formula with the same factor (costmodel.host_memory_per_node).
"""

from __future__ import annotations

import functools

import pytest

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.models.builtin import MODEL_SHAPES, find_model_shape
from grpo_launch.planning.cost.memory import host_memory_per_node, model_states

from ..helpers import require_vllm
from .grid import hf_config, vllm_oracle

pytestmark = pytest.mark.conformance
MODELS = ["Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B", "Qwen3-8B", "Qwen2.5-14B", "Qwen2.5-32B"]
MODELS += ["Llama-3.1-70B", "Qwen2.5-72B"]
# (backend, offload) → DeepSpeed estimator arguments
SETTINGS = {
    ("zero2", "none"): ("zero2", {"cpu_offload": False}),
    ("zero2", "optimizer"): ("zero2", {"cpu_offload": True}),
    ("zero3", "none"): ("zero3", {"cpu_offload": False, "cpu_offload_params": False}),
    ("zero3", "optimizer"): ("zero3", {"cpu_offload": True, "cpu_offload_params": False}),
    ("zero3", "optimizer+params"): ("zero3", {"cpu_offload": True, "cpu_offload_params": True}),
}


@functools.cache
def _deepspeed_params(name: str) -> tuple[int, int]:
    """(total, largest layer) as DeepSpeed's model_to_params reads them (deepspeed/runtime/zero/stage3.py), from
    the architecture transformers builds on the meta device. model_to_params itself deduplicates shared parameters
    by data_ptr(), which is 0 for every meta tensor; model.parameters() deduplicates them by identity instead."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = hf_config(find_model_shape(name))
    cfg = AutoConfig.for_model(config.pop("model_type"), **{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@pytest.mark.parametrize("name", MODELS)
def test_parameter_counts_match_the_architecture(name):
    total, largest = _deepspeed_params(name)
    shape = find_model_shape(name)
    assert shape.params == pytest.approx(total, rel=0.03)
    assert shape.largest_layer_params == pytest.approx(largest, rel=0.01)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
def test_model_states_match_deepspeeds_estimators(name, setting, gpus):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    total, largest = _deepspeed_params(name)
    stage, kwargs = SETTINGS[setting]
    if stage == "zero2":
        cpu, gpu = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=gpus, **kwargs)
    else:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, num_gpus_per_node=gpus, **kwargs)
    backend, offload = DistBackend(setting[0]), Offload(setting[1])
    ours = sum(model_states(find_model_shape(name), gpus, backend, offload))
    assert ours == pytest.approx(gpu, rel=0.02)
    if setting[1] != "none":  # offload: the host side, per node, with DeepSpeed's buffer factor
        host = host_memory_per_node(find_model_shape(name), gpus, 1, backend, offload)
        assert host == pytest.approx(cpu, rel=0.02)


@pytest.fixture(scope="module")
def vllm_kv() -> dict[str, dict]:
    require_vllm()
    cases = [
        {"id": f"{shape.name}@{tp}", "kv": {"config": hf_config(shape), "tp": tp}}
        for shape in MODEL_SHAPES
        for tp in (*shape.valid_tp_sizes(8), 16)
    ]
    return vllm_oracle(cases)


@pytest.mark.parametrize("shape", MODEL_SHAPES, ids=lambda s: s.name)
def test_kv_bytes_per_token_per_gpu_equal_vllms_layout(vllm_kv, shape):
    """Including TP 16, beyond every model's KV heads: vLLM replicates them (max(1, kv_heads // tp) per GPU)."""
    for tp in (*shape.valid_tp_sizes(8), 16):
        verdict = vllm_kv[f"{shape.name}@{tp}"]
        assert verdict["kv_error"] is None, verdict["kv_error"]
        assert shape.kv_bytes_per_token_per_gpu(tp) == verdict["kv_bytes_per_token_per_gpu"], tp
