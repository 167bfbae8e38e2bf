"""Activation memory of one training micro-batch, counted from what the model's forward saves for its backward
(transformers' Llama/Qwen2-style decoder layer under SDPA) and from TRL 1.16's fused LM head. Pure arithmetic.

Per token and decoder layer, with ``b`` the activation width (2 for bf16, 4 for float32), ``w`` the parameter
width (4 when float32 weights run under bf16 autocast) and ``h``/``i`` the hidden and MLP widths:

- two RMSNorms: the float32 upcast of their input (4h, the input itself when it already is float32), the
  normalised input the weight multiplies (w·h) and the output the next projection reads (b·h): 4h + w·h + b·h each;
- attention with a padding mask (GRPO batches are padded, so transformers passes a mask and repeats the KV heads
  for SDPA): the rotated queries, the repeated keys and values, SDPA's output and the contiguous copy o_proj reads,
  each ``heads × head_dim`` wide (``q_proj``'s output width, transformers' Qwen3Attention/LlamaAttention: it is
  the hidden size only where ``head_dim`` is ``hidden / heads``; Qwen3-0.6B's is 16 × 128 = 2048 over a hidden
  1024, Qwen3-4B's 32 × 128 = 4096 over 2560): 5·b·heads·head_dim, plus SDPA's float32 log-sum-exp (4 bytes per
  head); Qwen3's per-head query and key RMSNorms at the query and key widths, like the other norms less their
  output: RoPE multiplies it by cos and sin, which need no gradient, so nothing keeps it (4w + w·width each);
- the SwiGLU MLP: gate output, its SiLU, up output and their product (4·b·i); in a mixture-of-experts layer the
  router's logits and softmax, and per routed expert the token's dispatched copy, the expert's intermediates and
  its weighted output (k·b·(2h + 4·i_expert)), plus the shared experts.

Gradient checkpointing (transformers' per-layer checkpoint) keeps each layer's input (b·h, float32 under autocast)
and recomputes one layer at a time during the backward, whose own gradients are a further workspace.

TRL 1.16 never materialises the logits: ``trl.trainer.utils.add_fused_lm_head`` projects tiles of 4096 tokens ×
32768 vocabulary entries (``TOKEN_CHUNK_SIZE``, ``_CHUNKED_LOGPROB_CHUNK_SIZE``). Its forward saves the hidden
states it scores; its backward holds a float32 weight gradient (vocab × h), a float32 hidden gradient and the tile
workspace: one tile where Triton folds the tiles (CUDA), about eight float32 tiles where torch does (CPU). On
CUDA only the completion tokens are projected; elsewhere every position is.

The embedding's gradient (vocab × h at the parameter width) is a transient at the very end of the backward, when
the activations are gone; the peak is the larger of the two moments.
"""

from __future__ import annotations

from grpo_launch.models.shape import ModelShape
from grpo_launch.spec import frozen

# trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE and trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE (TRL 1.16)
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
# float32 tiles alive at once in TRL's torch fallback backward (_backward_tile, counted from its code: the tile,
# its scaled copy, z, log p, p, the gradient, the target mask and two expression temporaries)
TORCH_TILE_COPIES = 8.25


@frozen
class Precision:
    """Byte widths of a training process: activations, parameters, and whether Triton runs TRL's LM-head kernels."""

    activation_bytes: int = 2
    param_bytes: int = 2
    triton: bool = True

    @property
    def autocast(self) -> bool:
        return self.param_bytes > self.activation_bytes


@frozen
class ActivationMemory:
    """The activation terms of one training process's peak, in bytes."""

    saved: float  # kept for the backward: every layer's saved tensors, or the checkpoints
    recompute: float  # one layer recomputed under checkpointing, and one layer's backward gradients
    lm_head: float  # the fused LM head's saved inputs and its backward workspace
    embedding_grad: float  # the embedding's gradient, at the end of the backward
    mask: float  # the 4-D padding mask SDPA reads

    @property
    def peak(self) -> float:
        during = self.saved + self.mask + max(self.lm_head, self.recompute)
        return max(during, self.embedding_grad)


def layer_bytes_per_token(model: ModelShape, prec: Precision) -> float:
    """What one decoder layer saves for its backward, per token (see the module docstring), averaged over the
    layers of a mixture of experts (its dense layers and its MoE layers differ)."""
    h, i, b = model.hidden, model.intermediate or 4 * model.hidden, prec.activation_bytes

    def norm_bytes(width: int, output: bool = True) -> int:  # float32 upcast of its input, normalised input, output
        return 4 * width + prec.param_bytes * width + (b * width if output else 0)

    norm = norm_bytes(h)
    head_dim = model.head_dim or h // model.heads
    # the attention tensors' width: q_proj's output (heads × head_dim); multi-head latent attention kept at h
    q_width = model.heads * head_dim if not model.kv_lora_rank else h
    qk_norms = 0
    if model.qk_norm:  # Qwen3's per-head RMSNorms on the queries and keys
        qk_norms = norm_bytes(model.heads * head_dim, False) + norm_bytes(model.kv_heads * head_dim, False)
    dense_mlp = 4 * b * i
    mlp = float(dense_mlp)
    if model.is_moe:
        # the router's logits and float32 softmax; per routed expert the token's dispatched copy, the expert's
        # SwiGLU intermediates and its weighted output; the shared experts like a dense MLP
        e, k, mi = model.experts, model.experts_per_token, model.moe_intermediate or i
        moe_mlp = e * (b + 4) + k * b * (2 * h + 4 * mi) + 4 * b * model.shared_intermediate
        mlp = (model.moe_layers * moe_mlp + (model.layers - model.moe_layers) * dense_mlp) / model.layers
    return 2 * norm + qk_norms + 5 * b * q_width + 4 * model.heads + mlp


def activation_memory(
    model: ModelShape,
    batch: int,
    seq_len: int,
    completion_len: int,
    checkpointing: bool,
    prec: Precision,
    *,
    lora: bool = False,
) -> ActivationMemory:
    """Activation memory of one micro-batch of ``batch`` sequences of ``seq_len`` tokens, ``completion_len`` of
    them scored. With ``lora`` the LM head and the embedding are frozen: no weight gradients for them."""
    h, v, b = model.hidden, model.vocab, prec.activation_bytes
    i = model.intermediate or (0 if model.is_moe else 4 * h)
    tokens = batch * seq_len
    layer = layer_bytes_per_token(model, prec) * tokens
    saved: float
    residual = prec.param_bytes if prec.autocast else b  # the residual stream's width
    final_norm = (4 * h + prec.param_bytes * h + b * h) * tokens
    # one layer's backward: the residual gradient and the MLP's gradients (down input, SiLU, gate, up)
    width = max(i, model.experts_per_token * (model.moe_intermediate or 0) + model.shared_intermediate)
    backward = (2 * residual * h + 3 * b * width) * tokens
    if checkpointing:
        saved = residual * h * tokens * model.layers + final_norm
        recompute = layer + backward
    else:
        saved = layer * model.layers + final_norm
        recompute = backward
    scored = batch * completion_len if prec.triton else batch * (seq_len - 1)
    tile = min(scored, TRL_TOKEN_CHUNK) * min(v, TRL_VOCAB_CHUNK)
    tiles = tile * b if prec.triton else tile * 4 * TORCH_TILE_COPIES
    head_saved = scored * (h * b + 8)  # the hidden states it scores, log Z and the entropy
    head_backward = 4 * scored * h + tiles
    if not lora:
        head_backward += 4 * v * h  # the float32 weight gradient
        if prec.param_bytes != 4:
            head_backward += prec.param_bytes * v * h  # cast back to the weights' dtype
    mask = batch * seq_len * seq_len  # bool
    embedding_grad = 0.0 if lora else prec.param_bytes * v * h
    return ActivationMemory(saved, recompute, head_saved + head_backward, embedding_grad, mask)
