"""The built-in model table: shapes of popular models (dense ones as numbers, mixtures of experts from their
published config.json), so planning never downloads anything."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from grpo_launch.models.config import shape_from_config
from grpo_launch.models.shape import ModelShape


def _m(
    name: str,
    params_b: float,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    vocab: int,
    inter: int,
    head_dim: int | None = None,
) -> ModelShape:
    qk_norm = name.startswith("Qwen3")  # Qwen3 normalises queries and keys per head
    return ModelShape(name, params_b * 1e9, layers, hidden, heads, kv, vocab, inter, head_dim, qk_norm=qk_norm)


MODEL_SHAPES: tuple[ModelShape, ...] = (
    _m("Qwen2.5-0.5B", 0.49, 24, 896, 14, 2, 151936, 4864),
    _m("Qwen2.5-1.5B", 1.54, 28, 1536, 12, 2, 151936, 8960),
    _m("Qwen2.5-3B", 3.09, 36, 2048, 16, 2, 151936, 11008),
    _m("Qwen2.5-7B", 7.62, 28, 3584, 28, 4, 152064, 18944),
    _m("Qwen2.5-14B", 14.7, 48, 5120, 40, 8, 152064, 13824),
    _m("Qwen2.5-32B", 32.5, 64, 5120, 40, 8, 152064, 27648),
    _m("Qwen2.5-72B", 72.7, 80, 8192, 64, 8, 152064, 29568),
    _m("Qwen2.5-Math-1.5B", 1.54, 28, 1536, 12, 2, 151936, 8960),
    _m("Qwen2.5-Math-7B", 7.62, 28, 3584, 28, 4, 152064, 18944),
    _m("Qwen2.5-Coder-1.5B", 1.54, 28, 1536, 12, 2, 151936, 8960),
    _m("Qwen2.5-Coder-3B", 3.09, 36, 2048, 16, 2, 151936, 11008),
    _m("Qwen2.5-Coder-7B", 7.62, 28, 3584, 28, 4, 152064, 18944),
    _m("Qwen2.5-Coder-32B", 32.5, 64, 5120, 40, 8, 152064, 27648),
    _m("Qwen3-0.6B", 0.6, 28, 1024, 16, 8, 151936, 3072, 128),
    _m("Qwen3-1.7B", 1.7, 28, 2048, 16, 8, 151936, 6144, 128),
    _m("Qwen3-4B", 4.0, 36, 2560, 32, 8, 151936, 9728, 128),
    _m("Qwen3-8B", 8.2, 36, 4096, 32, 8, 151936, 12288, 128),
    _m("Qwen3-14B", 14.8, 40, 5120, 40, 8, 151936, 17408, 128),
    _m("Qwen3-32B", 32.8, 64, 5120, 64, 8, 151936, 25600, 128),
    _m("Llama-3.2-1B", 1.24, 16, 2048, 32, 8, 128256, 8192),
    _m("Llama-3.2-3B", 3.21, 28, 3072, 24, 8, 128256, 8192),
    _m("Llama-3.1-8B", 8.03, 32, 4096, 32, 8, 128256, 14336),
    _m("Llama-3.1-70B", 70.6, 80, 8192, 64, 8, 128256, 28672),
    _m("Llama-3.3-70B", 70.6, 80, 8192, 64, 8, 128256, 28672),
    _m("Llama-3.1-405B", 405.8, 126, 16384, 128, 8, 128256, 53248),
    _m("Mistral-7B", 7.25, 32, 4096, 32, 8, 32768, 14336),
    _m("DeepSeek-R1-Distill-Qwen-1.5B", 1.78, 28, 1536, 12, 2, 151936, 8960),
    _m("DeepSeek-R1-Distill-Qwen-7B", 7.62, 28, 3584, 28, 4, 152064, 18944),
    _m("DeepSeek-R1-Distill-Qwen-14B", 14.8, 48, 5120, 40, 8, 152064, 13824),
    _m("DeepSeek-R1-Distill-Qwen-32B", 32.8, 64, 5120, 40, 8, 152064, 27648),
    _m("DeepSeek-R1-Distill-Llama-8B", 8.03, 32, 4096, 32, 8, 128256, 14336),
    _m("DeepSeek-R1-Distill-Llama-70B", 70.6, 80, 8192, 64, 8, 128256, 28672),
)


# Mixture-of-experts models, as their published config.json files spell them (the shapes are computed from these,
# as from a local config.json; tests/test_model_shapes.py checks the totals against the model cards).
_QWEN3_MOE: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "num_experts_per_tok": 8,
    "num_experts": 128,
}


_GPT_OSS: dict[str, Any] = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "num_experts_per_tok": 4,
    "attention_bias": True,
}


_DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "vocab_size": 129280,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}


MOE_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3-30B-A3B": _QWEN3_MOE | {"hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                                   "num_hidden_layers": 48},
    "Qwen3-235B-A22B": _QWEN3_MOE | {"hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                                     "num_hidden_layers": 94, "num_attention_heads": 64},
    "gpt-oss-20b": _GPT_OSS | {"num_hidden_layers": 24, "num_local_experts": 32},
    "gpt-oss-120b": _GPT_OSS | {"num_hidden_layers": 36, "num_local_experts": 128},
    "DeepSeek-V3": _DEEPSEEK_V3,
    "DeepSeek-R1": _DEEPSEEK_V3,
    "Kimi-K2-Instruct": _DEEPSEEK_V3 | {"num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840,
                                       "n_routed_experts": 384, "first_k_dense_replace": 1},
    "Mixtral-8x7B": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2},
}  # fmt: skip


MODEL_SHAPES += tuple(shape_from_config(name, cfg) for name, cfg in MOE_CONFIGS.items())


_SUFFIXES = re.compile(r"(-(instruct|chat|base|it|hf|v0\.\d|v\d(\.\d)?|\d{4}))+$", re.IGNORECASE)


# max_position_embeddings of the dense models' config.json on the Hub (huggingface.co/ORG/NAME/blob/main/config.json),
# by family, first match; vLLM refuses a --max-model-len beyond it. Qwen2.5's -Instruct models say 32768 (a longer
# context needs YaRN, which vLLM must be told), some of its base models 131072: a base model gets the family's largest,
# so no length is refused that its config allows. Qwen2.5-Math: 4096; Qwen3 (dense): 40960; Llama 3.x and the
# DeepSeek-R1 distills: 131072; Mistral-7B: 32768.
_POSITIONS: tuple[tuple[str, int, int], ...] = (  # (family prefix, -Instruct models, others)
    ("qwen2.5-math", 4096, 4096),
    ("qwen2.5", 32768, 131072),
    ("qwen3", 40960, 40960),
    ("llama-3", 131072, 131072),
    ("deepseek-r1-distill", 131072, 131072),
    ("mistral-7b", 32768, 32768),
)


def _max_positions(name: str, shape: ModelShape) -> int | None:
    if shape.max_positions is not None:
        return shape.max_positions
    low = name.lower()
    instruct = "-instruct" in low
    return next((i if instruct else other for family, i, other in _POSITIONS if low.startswith(family)), None)


def find_model_shape(model: str) -> ModelShape | None:
    """The built-in shape for a hub id such as ``Qwen/Qwen2.5-1.5B-Instruct`` (suffixes ignored), or None."""
    base = model.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"^Meta-", "", base, flags=re.IGNORECASE)
    by_name = {s.name.lower(): s for s in MODEL_SHAPES}
    for candidate in (base, _SUFFIXES.sub("", base)):
        shape = by_name.get(candidate.lower())
        if shape:
            return dataclasses.replace(shape, max_positions=_max_positions(base, shape))
    return None
