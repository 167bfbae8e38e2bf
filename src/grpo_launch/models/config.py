"""A model shape from a Hugging Face ``config.json`` dict, dense or mixture-of-experts, counted the way
transformers builds the model (checked against meta-device builds in tests/test_model_shapes.py).

Families and the config keys each spells its experts with:

- Qwen2-MoE / Qwen3-MoE / OLMoE: ``num_experts``, ``moe_intermediate_size`` (OLMoE: ``intermediate_size``),
  ``decoder_sparse_step`` and ``mlp_only_layers``; Qwen2-MoE adds a gated shared expert
  (``shared_expert_intermediate_size``);
- Mixtral / gpt-oss: ``num_local_experts``, the expert width is ``intermediate_size``; gpt-oss has biases on the
  experts, the router and attention, and attention sinks;
- DeepSeek-V2/V3 (Kimi-K2) / GLM-4.5 (glm4_moe): ``n_routed_experts``, ``n_shared_experts``,
  ``moe_intermediate_size``, dense layers before ``first_k_dense_replace`` (``intermediate_size``); DeepSeek's
  multi-head latent attention (``kv_lora_rank``, ``q_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
  ``v_head_dim``). Multi-token-prediction layers (``num_nextn_predict_layers``) are not built by transformers and
  not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_launch.models.shape import ModelShape

# families whose experts' width is ``intermediate_size`` (no moe_intermediate_size key)
_EXPERT_WIDTH_IS_INTERMEDIATE = ("mixtral", "gpt_oss", "olmoe", "phimoe", "minimax")
# families with biases on q/k/v without an ``attention_bias`` key
_QKV_BIAS = ("qwen2", "qwen2_moe")
# families with per-head q/k RMSNorms
_QK_NORM = ("qwen3", "qwen3_moe", "olmoe")


def _int(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return default


def _moe_layer_flags(cfg: Mapping[str, Any], model_type: str, layers: int) -> list[bool]:
    """Which layers have experts."""
    if "first_k_dense_replace" in cfg or model_type.startswith(("deepseek", "glm4_moe", "kimi")):
        first, freq = _int(cfg, "first_k_dense_replace"), max(1, _int(cfg, "moe_layer_freq", default=1))
        return [i >= first and i % freq == 0 for i in range(layers)]
    step = max(1, _int(cfg, "decoder_sparse_step", default=1))
    dense_only = set(cfg.get("mlp_only_layers") or [])
    return [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]


def _attention(cfg: Mapping[str, Any], model_type: str, hidden: int, heads: int, kv: int, head_dim: int) -> int:
    """Parameters of one attention block."""
    if cfg.get("kv_lora_rank"):  # multi-head latent attention
        q_lora, kv_lora = _int(cfg, "q_lora_rank"), _int(cfg, "kv_lora_rank")
        rope, nope = _int(cfg, "qk_rope_head_dim"), _int(cfg, "qk_nope_head_dim")
        v_dim = _int(cfg, "v_head_dim", default=nope)
        q_head = nope + rope
        q = hidden * q_lora + q_lora + q_lora * heads * q_head if q_lora else hidden * heads * q_head
        kv_part = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        return q + kv_part + heads * v_dim * hidden
    params = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
    if cfg.get("attention_bias") or (model_type in _QKV_BIAS and "attention_bias" not in cfg):
        params += heads * head_dim + 2 * kv * head_dim
        if cfg.get("attention_bias") and model_type not in _QKV_BIAS:
            params += hidden  # o_proj bias too
    if model_type in _QK_NORM:
        params += 2 * head_dim if model_type != "olmoe" else heads * head_dim + kv * head_dim
    if model_type == "gpt_oss":
        params += heads  # attention sinks
    return params


def shape_from_config(name: str, config: Mapping[str, Any]) -> ModelShape:
    """A shape from a Hugging Face ``config.json`` dict (parameter counts computed from the dimensions)."""
    cfg = dict(config.get("text_config") or config)
    model_type = str(cfg.get("model_type") or config.get("model_type") or "")
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    vocab = int(cfg.get("vocab_size") or 0)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    experts = _int(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    per_token = _int(cfg, "num_experts_per_tok", "moe_topk", "top_k")
    inter = _int(cfg, "intermediate_size", default=4 * hidden)
    moe_inter = _int(cfg, "moe_intermediate_size")
    if experts and not moe_inter and model_type in _EXPERT_WIDTH_IS_INTERMEDIATE:
        moe_inter = inter
    flags = _moe_layer_flags(cfg, model_type, layers) if experts else [False] * layers
    shared = _int(cfg, "shared_expert_intermediate_size") or _int(cfg, "n_shared_experts") * moe_inter
    attn = _attention(cfg, model_type, hidden, heads, kv, head_dim)
    dense_mlp = 3 * hidden * inter
    biases = model_type == "gpt_oss"
    moe_mlp = experts * 3 * hidden * moe_inter + hidden * experts + 3 * hidden * shared
    if biases:
        moe_mlp += experts * (2 * moe_inter + hidden) + experts  # expert and router biases
    if cfg.get("shared_expert_intermediate_size"):
        moe_mlp += hidden  # Qwen2-MoE's shared-expert gate
    n_moe = sum(flags)
    params = layers * (attn + 2 * hidden) + n_moe * moe_mlp + (layers - n_moe) * dense_mlp
    params += vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2) + hidden
    return ModelShape(
        name,
        float(params),
        layers,
        hidden,
        heads,
        kv,
        vocab,
        inter if n_moe < layers else None,
        head_dim,
        experts=experts if n_moe else 0,
        experts_per_token=per_token if n_moe else 0,
        moe_intermediate=moe_inter or None,
        shared_intermediate=shared,
        moe_layers=n_moe,
        expert_biases=biases,
        kv_lora_rank=_int(cfg, "kv_lora_rank"),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim") if cfg.get("kv_lora_rank") else 0,
        qk_norm=model_type in _QK_NORM,
        max_positions=_int(cfg, "max_position_embeddings") or None,
        other_layer_types=tuple(sorted(set(cfg.get("layer_types") or ()) - {"full_attention", "sliding_attention"})),
        attention_sinks=model_type == "gpt_oss",
    )
