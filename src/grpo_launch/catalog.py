"""Built-in tables: GPU specs and popular model shapes, so planning never downloads anything."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense
    bandwidth_tbs: float


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H100-80GB", 79.6, 989.0, 3.35),
    GpuSpec("H100-PCIe", 79.6, 756.0, 2.0),
    GpuSpec("H200", 139.8, 989.0, 4.8),
    GpuSpec("H20", 95.6, 148.0, 4.0),
    GpuSpec("B200", 178.0, 2250.0, 8.0),
    GpuSpec("A100-80GB", 79.2, 312.0, 2.0),
    GpuSpec("A100-40GB", 39.4, 312.0, 1.55),
    GpuSpec("L20", 44.5, 119.5, 0.86),
    GpuSpec("L40S", 44.5, 362.0, 0.86),
    GpuSpec("L40", 44.5, 181.0, 0.86),
    GpuSpec("L4", 22.0, 121.0, 0.3),
    GpuSpec("A6000", 47.5, 155.0, 0.77),
    GpuSpec("A10G", 22.0, 70.0, 0.6),
    GpuSpec("A10", 22.0, 125.0, 0.6),
    GpuSpec("RTX4090", 23.6, 165.0, 1.0),
    GpuSpec("RTX3090", 23.6, 71.0, 0.94),
)

# NVML names ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090") → table names.
_GPU_ALIASES: tuple[tuple[str, str], ...] = (
    (r"h100.*pcie", "H100-PCIe"),
    (r"h100", "H100-80GB"),
    (r"h200", "H200"),
    (r"h20\b", "H20"),
    (r"b200", "B200"),
    (r"a100.*40", "A100-40GB"),
    (r"a100", "A100-80GB"),
    (r"l40s", "L40S"),
    (r"l40\b", "L40"),
    (r"l20\b", "L20"),
    (r"\bl4\b", "L4"),
    (r"a6000", "A6000"),
    (r"a10g", "A10G"),
    (r"\ba10\b", "A10"),
    (r"4090", "RTX4090"),
    (r"3090", "RTX3090"),
)


def find_gpu_spec(name: str) -> GpuSpec | None:
    """The table entry for a GPU name as NVML or a ``--gpus`` spec spells it, or None."""
    key = name.lower().replace("_", " ").replace("nvidia", "").replace("geforce", "").strip()
    by_name = {s.name.lower(): s for s in GPU_SPECS}
    if key in by_name:
        return by_name[key]
    for pattern, target in _GPU_ALIASES:
        if re.search(pattern, key):
            return by_name[target.lower()]
    return None


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a model: size and attention layout."""

    name: str
    params: float  # parameters
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int | None = None
    head_dim: int | None = None

    @property
    def weight_bytes_bf16(self) -> float:
        return 2.0 * self.params

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """What one token's KV cache takes on each GPU at tensor-parallel size ``tp``, as vLLM lays it out: the KV
        heads are split over TP, and replicated once TP exceeds them (``max(1, kv_heads // tp)`` per GPU)."""
        head_dim = self.head_dim or self.hidden // self.heads
        return 2.0 * 2 * self.layers * max(1, self.kv_heads // tp) * head_dim

    @property
    def largest_layer_params(self) -> float:
        """The largest single module: the (untied or tied) embedding, or one MLP projection. ZeRO-3 and FSDP
        gather it whole (DeepSpeed's estimate_zero3_model_states_mem_needs counts 4 bytes per parameter of it)."""
        return float(max(self.vocab * self.hidden, self.hidden * (self.intermediate or 4 * self.hidden)))

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
    return ModelShape(name, params_b * 1e9, layers, hidden, heads, kv, vocab, inter, head_dim)


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
    _m("Mistral-7B", 7.25, 32, 4096, 32, 8, 32768, 14336),
    _m("DeepSeek-R1-Distill-Qwen-1.5B", 1.78, 28, 1536, 12, 2, 151936, 8960),
    _m("DeepSeek-R1-Distill-Qwen-7B", 7.62, 28, 3584, 28, 4, 152064, 18944),
    _m("DeepSeek-R1-Distill-Qwen-14B", 14.8, 48, 5120, 40, 8, 152064, 13824),
    _m("DeepSeek-R1-Distill-Qwen-32B", 32.8, 64, 5120, 40, 8, 152064, 27648),
    _m("DeepSeek-R1-Distill-Llama-8B", 8.03, 32, 4096, 32, 8, 128256, 14336),
    _m("DeepSeek-R1-Distill-Llama-70B", 70.6, 80, 8192, 64, 8, 128256, 28672),
)

_SUFFIXES = re.compile(r"(-(instruct|chat|base|it|hf|v0\.\d|v\d(\.\d)?|\d{4}))+$", re.IGNORECASE)


def find_model_shape(model: str) -> ModelShape | None:
    """The built-in shape for a hub id such as ``Qwen/Qwen2.5-1.5B-Instruct`` (suffixes ignored), or None."""
    base = model.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"^Meta-", "", base, flags=re.IGNORECASE)
    by_name = {s.name.lower(): s for s in MODEL_SHAPES}
    for candidate in (base, _SUFFIXES.sub("", base)):
        shape = by_name.get(candidate.lower())
        if shape:
            return shape
    return None


def shape_from_config(name: str, config: Mapping[str, Any]) -> ModelShape:
    """A shape from a Hugging Face ``config.json`` dict (parameter count computed from the dimensions)."""
    cfg = dict(config.get("text_config") or config)
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    vocab = int(cfg.get("vocab_size") or 0)
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    attn = hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden
    mlp = 3 * hidden * inter
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    params = layers * (attn + mlp + 2 * hidden) + embed + hidden
    return ModelShape(name, float(params), layers, hidden, heads, kv, vocab, inter, head_dim)
