"""Model shapes, dense and mixture-of-experts: the built-in MoE entries against their published totals, and
shape_from_config against transformers' own model built on the meta device (exact counts, no weights)."""

from __future__ import annotations

import functools
import json

import pytest

from grpo_launch.models.builtin import MOE_CONFIGS, find_model_shape
from grpo_launch.models.config import shape_from_config

# name → (total, active) in billions as the model cards publish them, and where. gpt-oss's card counts active
# parameters without the input embedding (a lookup, not compute), so that is compared without it.
PUBLISHED = {
    "Qwen3-30B-A3B": (30.5, 3.3, "huggingface.co/Qwen/Qwen3-30B-A3B: 30.5B total, 3.3B activated"),
    "Qwen3-235B-A22B": (235.0, 22.0, "huggingface.co/Qwen/Qwen3-235B-A22B: 235B total, 22B activated"),
    "gpt-oss-20b": (20.91, 3.61, "OpenAI gpt-oss model card, Table 1: 20.91B total, 3.61B active"),
    "gpt-oss-120b": (116.83, 5.13, "OpenAI gpt-oss model card, Table 1: 116.83B total, 5.13B active"),
    "DeepSeek-V3": (671.0, 37.0, "DeepSeek-V3 technical report: 671B total, 37B activated (MTP module excluded)"),
    "Mixtral-8x7B": (46.7, 12.9, "mistral.ai/news/mixtral-of-experts: 46.7B total, 12.9B per token"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_totals_and_active_match_the_model_cards(name):
    total, active, source = PUBLISHED[name]
    shape = find_model_shape(name)
    assert shape is not None and shape.is_moe
    assert shape.params / 1e9 == pytest.approx(total, rel=0.01), source
    counted = shape.active_params - (shape.vocab * shape.hidden if name.startswith("gpt-oss") else 0)
    assert counted / 1e9 == pytest.approx(active, rel=0.03), source
    assert shape.active_params < shape.params / 3  # what makes them MoE: memory from the total, compute from this


def test_kimi_k2_is_the_published_trillion():
    """moonshotai/Kimi-K2-Instruct's card: 1T total (rounded), 32B activated."""
    shape = find_model_shape("moonshotai/Kimi-K2-Instruct")
    assert shape.params / 1e12 == pytest.approx(1.0, rel=0.05)
    assert shape.active_params / 1e9 == pytest.approx(32, rel=0.05)


@functools.cache
def _meta_counts(config_json: str) -> tuple[int, int]:
    """(total, largest module's own parameters) of the model transformers builds from the config, on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads(config_json)
    cfg = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


SMALL = {
    "qwen3_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=1000, head_dim=32, mlp_only_layers=[0]),
    "qwen2_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                      shared_expert_intermediate_size=96, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000),
    "gpt_oss": dict(hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, head_dim=16),
    "deepseek_v3": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
                        n_shared_experts=1, num_experts_per_tok=2, num_hidden_layers=3, first_k_dense_replace=1,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=1000, kv_lora_rank=16,
                        q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1,
                        topk_group=1),
    "deepseek_v2": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
                        n_shared_experts=2, num_experts_per_tok=2, num_hidden_layers=3, first_k_dense_replace=1,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=1000, kv_lora_rank=16,
                        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    "mixtral": dict(hidden_size=64, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000),
    "olmoe": dict(hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=1000, eos_token_id=1, pad_token_id=0),
    "glm4_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
                     n_shared_experts=1, num_experts_per_tok=2, num_hidden_layers=3, first_k_dense_replace=1,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, head_dim=16),
    "qwen2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000),
    "qwen3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, head_dim=32),
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
}  # fmt: skip


def _config_dict(model_type: str, values: dict) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **values).to_dict()


@pytest.mark.parametrize("model_type", sorted(SMALL))
def test_shape_from_config_counts_what_transformers_builds(model_type):
    config = _config_dict(model_type, SMALL[model_type])
    total, largest = _meta_counts(json.dumps({"model_type": model_type, **SMALL[model_type]}))
    shape = shape_from_config(model_type, config)
    assert shape.params == total
    assert shape.largest_layer_params == largest


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "gpt-oss-20b", "Mixtral-8x7B", "DeepSeek-V3"])
def test_built_in_moe_shapes_equal_the_full_size_architecture(name):
    """The full-size architectures on the meta device: the exact total, and the largest module, which for these is
    a layer's fused experts (transformers 5 keeps them in one module: what ZeRO-3 gathers whole)."""
    values = {k: v for k, v in MOE_CONFIGS[name].items() if k != "model_type"}
    if name == "DeepSeek-V3":
        values |= {"n_group": 8, "topk_group": 4}
    total, largest = _meta_counts(json.dumps({"model_type": MOE_CONFIGS[name]["model_type"], **values}))
    shape = find_model_shape(name)
    assert shape.params == total
    assert shape.largest_layer_params == largest
    assert largest == shape.experts * shape.expert_params


def test_a_hub_model_is_read_from_the_local_hub_cache(tmp_path):
    """A hub id that is not in the table but is in the Hugging Face cache (pre-downloaded, as on most clusters) gets
    its exact shape from the cached config.json, the snapshot refs/main names; nothing is downloaded."""
    from grpo_launch.probe.model import resolve_model_shape

    repo = tmp_path / "models--org--tiny-moe"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    config = _config_dict("qwen3_moe", SMALL["qwen3_moe"])
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(config))
    shape, warning = resolve_model_shape("org/tiny-moe", {"HF_HUB_CACHE": str(tmp_path)})
    assert (
        warning is None
        and shape.is_moe
        and shape.experts == 8
        and shape.params == shape_from_config("x", config).params
    )
    missing, warning = resolve_model_shape("org/elsewhere", {"HF_HUB_CACHE": str(tmp_path)})
    assert missing is None and "not in the built-in table" in warning
