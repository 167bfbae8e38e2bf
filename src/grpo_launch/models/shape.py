"""The model shape the planner works from: sizes, attention layout and experts, and what vLLM can shard it over.
Pure data; :mod:`grpo_launch.models.config` builds one from a ``config.json``, :mod:`grpo_launch.models.builtin`
holds the built-in ones."""

from __future__ import annotations

import math

from grpo_launch.spec import frozen


@frozen
class ModelShape:
    """What the planner needs of a model: size and attention layout, and for a mixture of experts its experts.

    ``params`` is the total (what memory holds); :attr:`active_params` what one token runs through (what compute
    costs). A dense model has ``experts == 0``. ``kv_lora_rank`` marks multi-head latent attention (DeepSeek):
    the KV cache holds one compressed latent per token and layer instead of K and V heads."""

    name: str
    params: float  # parameters
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int | None = None  # the dense MLP's width (the dense layers' of a MoE)
    head_dim: int | None = None
    experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0
    moe_intermediate: int | None = None  # one expert's width
    shared_intermediate: int = 0  # the shared experts' total width (DeepSeek n_shared_experts × width, Qwen2-MoE)
    moe_layers: int = 0  # layers with experts (the others are dense)
    expert_biases: bool = False  # gpt-oss: biases on each expert's projections
    kv_lora_rank: int = 0  # MLA latent width (0: plain attention)
    qk_rope_head_dim: int = 0  # MLA: the rotary part cached beside the latent
    qk_norm: bool = False  # RMSNorms on the queries and keys per head (Qwen3, OLMoE)
    max_positions: int | None = None  # config.json's max_position_embeddings (None: not known)
    # config.json's layer_types other than full and sliding attention (linear attention, mamba, conv: hybrid
    # recurrent models), and attention sinks (gpt-oss): what AsyncGRPOTrainer's tree packing refuses.
    other_layer_types: tuple[str, ...] = ()
    attention_sinks: bool = False

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_params(self) -> float:
        """One expert: gate, up and down projections (and their biases)."""
        i = self.moe_intermediate or 0
        return 3.0 * self.hidden * i + (2 * i + self.hidden if self.expert_biases else 0)

    @property
    def active_params(self) -> float:
        """Parameters one token runs through: the total less the routed experts it does not use."""
        unused = self.moe_layers * max(0, self.experts - self.experts_per_token) * self.expert_params
        return self.params - unused

    @property
    def weight_bytes_bf16(self) -> float:
        return 2.0 * self.params

    @property
    def routed_params(self) -> float:
        """Parameters of every routed expert of every MoE layer (what expert parallelism spreads)."""
        return self.moe_layers * self.experts * self.expert_params

    def weight_bytes_per_gpu(self, tp: int, dp: int = 1, *, ep: bool = False, pp: int = 1) -> float:
        """bf16 weights on each GPU of a vLLM engine of ``tp`` × ``dp`` GPUs: split over TP and replicated per DP
        rank; with expert parallelism the routed experts are split over all ``tp × dp`` GPUs instead. With ``pp``
        pipeline stages, the largest stage's: ⌈layers ÷ pp⌉ layers plus one vocabulary matrix (the first stage
        holds the embedding, the last the LM head; vLLM's ``get_pp_indices`` gives the remainder layers to some
        stages)."""
        if pp > 1:
            embed = 2.0 * self.vocab * self.hidden
            body = max(0.0, self.weight_bytes_bf16 - 2 * embed)
            return (body * self.stage_fraction(pp) + embed) / tp
        if not ep:
            return self.weight_bytes_bf16 / tp
        return 2.0 * ((self.params - self.routed_params) / tp + self.routed_params / (tp * dp))

    def stage_fraction(self, pp: int) -> float:
        """The share of the layers the largest of ``pp`` pipeline stages holds."""
        return math.ceil(self.layers / pp) / self.layers if pp > 1 else 1.0

    def decode_read_bytes(self, batch: int) -> float:
        """bf16 weight bytes one decode step reads for ``batch`` sequences: everything but the routed experts, plus
        the experts the batch's tokens touch, E·(1 − (1 − k/E)^batch) per MoE layer (uniform routing): the active
        experts at batch 1, all of them at a large batch."""
        if not self.is_moe:
            return self.weight_bytes_bf16
        e, k = self.experts, min(self.experts_per_token, self.experts)
        touched = e * (1 - (1 - k / e) ** max(1, batch))
        routed = self.moe_layers * self.expert_params
        return 2.0 * (self.params - e * routed + touched * routed)

    def kv_bytes_per_token_per_gpu(self, tp: int, pp: int = 1) -> float:
        """What one token's KV cache takes on each GPU at tensor-parallel size ``tp``, as vLLM lays it out: the KV
        heads are split over TP, and replicated once TP exceeds them (``max(1, kv_heads // tp)`` per GPU); an MLA
        latent (``kv_lora_rank + qk_rope_head_dim``) is one head on every GPU. A pipeline stage holds its own
        layers' (the largest stage's share with ``pp`` stages)."""
        share = self.stage_fraction(pp)
        if self.kv_lora_rank:
            return 2.0 * self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * share
        head_dim = self.head_dim or self.hidden // self.heads
        return 2.0 * 2 * self.layers * max(1, self.kv_heads // tp) * head_dim * share

    @property
    def largest_layer_params(self) -> float:
        """The largest single module's own parameters: the (untied or tied) embedding, one MLP projection, or a
        layer's experts, which transformers 5 fuses into one module (3-D gate_up/down tensors). ZeRO-3 and FSDP
        gather it whole (DeepSpeed's estimate_zero3_model_states_mem_needs counts 4 bytes per parameter of it)."""
        dense = self.hidden * (self.intermediate or 4 * self.hidden)
        return float(max(self.vocab * self.hidden, dense, self.experts * self.expert_params))

    def tp_problems(self, tp: int) -> list[str]:
        """Why vLLM cannot shard this model over ``tp`` GPUs (empty when it can).

        vLLM splits the attention heads, the KV heads (split when TP divides them, replicated when TP is a multiple
        of them), the MLP intermediate size and the vocabulary padded to a multiple of 64; anything that does not
        divide is an assertion while the model is built.
        """
        out = []
        if self.heads % tp:
            out.append(f"{self.heads} attention heads")
        if self.kv_heads % tp and tp % self.kv_heads:
            out.append(f"{self.kv_heads} KV heads (TP must divide them or be a multiple of them)")
        if self.intermediate and self.intermediate % tp:
            out.append(f"MLP intermediate size {self.intermediate}")
        if self.moe_intermediate and self.moe_intermediate % tp:
            out.append(f"expert intermediate size {self.moe_intermediate}")
        if self.vocab and padded_vocab(self.vocab) % tp:
            out.append(f"vocabulary {self.vocab} (padded to {padded_vocab(self.vocab)})")
        return out

    def valid_tp_sizes(self, limit: int) -> tuple[int, ...]:
        """Tensor-parallel sizes vLLM can shard this model over, up to ``limit``."""
        return tuple(t for t in range(1, max(1, min(limit, self.heads)) + 1) if not self.tp_problems(t))


VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vllm/model_executor/layers/vocab_parallel_embedding.py)


def padded_vocab(vocab: int) -> int:
    """The vocabulary size vLLM shards: rounded up to a multiple of 64."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
