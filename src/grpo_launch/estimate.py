"""Memory and step-time estimates for a GRPO step (pure arithmetic, no I/O).

Memory per training GPU (bf16 weights and gradients, fp32 Adam state, mixed precision):

- model states: DDP 16 B/param; ZeRO-2 2 + 14/n; ZeRO-3 16/n; optimizer offload moves the 12 B of Adam state
  (and the fp32 master) to CPU, parameter offload also the weights (ZeRO-3 only); LoRA trains a small adapter:
  only the frozen bf16 base remains (2 B/param, /n under ZeRO-3);
- a reference model (beta > 0): another 2 B/param (/n under ZeRO-3);
- activations for per_device × (prompt + completion) tokens: ≈ 34·h bytes per token per layer without gradient
  checkpointing (Korthikanti et al. 2022, flash attention), 2·h per token per layer with it plus one layer
  recomputed; the logits of the completion tokens in bf16 and their fp32 log-softmax;
- CUDA context, NCCL buffers and allocator fragmentation: 2 GiB + 5 %.

vLLM: weights/TP per GPU plus the KV cache of the concurrent sequences (2·layers·kv_heads·head_dim·2 B per token,
split over TP), plus ~1.5 GiB for activations and CUDA graphs.

Step time (one optimizer step; TRL 1.16 runs generation and training one after the other):

- generation: prefill is compute-bound (2·P FLOPs per prompt token, one prompt per group thanks to prefix
  caching); decode is memory-bound: each decode step reads the weights and the batch's KV cache, on each of the
  DP replicas (TP GPUs each, 85 % bandwidth efficiency, ×(1 + 0.1·log2 TP) for TP all-reduces), plus ~3 ms of
  scheduling and sampling per step whatever the model size;
- training: 6·P FLOPs per token forward + backward, +2·P with gradient checkpointing, +2·P for a reference model,
  at 40 % MFU (ZeRO-3 ×1.1, optimizer offload ×1.3, parameter offload ×2.0);
- weight sync (server mode): bf16 weights broadcast to the server at 20 GB/s within a node, 10 GB/s across nodes;
- colocate: every GPU generates then trains; vLLM sleep/wake costs ~1 s plus moving the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_launch.hardware import GIB, GpuSpec, ModelShape

ADAM_STATE_BYTES = 12.0  # fp32 master weights + two moments
OVERHEAD_BYTES = 2 * GIB
OVERHEAD_FRACTION = 0.05
HEADROOM = 0.90  # use at most 90 % of a GPU
VLLM_OVERHEAD_BYTES = 1.5 * GIB
TRAIN_MFU = 0.40
PREFILL_MFU = 0.50
DECODE_BW_EFFICIENCY = 0.85
SYNC_BYTES_PER_S_NODE = 20e9
SYNC_BYTES_PER_S_NET = 10e9
COLOCATE_SWITCH_S = 1.0
DECODE_STEP_OVERHEAD_S = 0.003  # vLLM scheduling, sampling and kernel launches per decode step, any model size


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes."""

    prompt_len: int
    completion_len: int
    completions: int  # completions per optimizer step (all processes, all accumulation steps)
    num_generations: int
    per_device: int
    gradient_checkpointing: bool
    lora: bool = False
    reference_model: bool = False  # beta > 0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len


@dataclass(frozen=True)
class TrainMemory:
    weights: float
    gradients: float
    optimizer: float
    reference: float
    activations: float
    logits: float
    overhead: float

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.reference + self.activations + self.logits) * (
            1 + OVERHEAD_FRACTION
        ) + self.overhead

    def lines(self) -> list[str]:
        parts = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer", self.optimizer),
            ("reference model", self.reference),
            ("activations", self.activations),
            ("logits", self.logits),
        ]
        body = " + ".join(f"{name} {v / GIB:.1f}" for name, v in parts if v)
        extra = f"×{1 + OVERHEAD_FRACTION:.2f} + {self.overhead / GIB:.1f} GiB CUDA/NCCL"
        return [f"{body} GiB, {extra} = {self.total / GIB:.1f} GiB"]


def train_memory(model: ModelShape, n: int, backend: str, offload: str, work: Workload) -> TrainMemory:
    """Memory per training GPU for ``n`` training processes."""
    p = model.params
    shard = n if backend == "zero3" else 1
    if work.lora:
        weights, grads, optim = 2 * p / shard, 0.0, 0.0
    else:
        weights = 2 * p / shard
        grads = 2 * p / (n if backend in ("zero2", "zero3") else 1)
        optim = ADAM_STATE_BYTES * p / (n if backend in ("zero2", "zero3", "fsdp") else 1)
        if backend == "fsdp":
            weights, grads = 2 * p / n, 2 * p / n
        if offload in ("optimizer", "optimizer+params"):
            optim = 0.0
        if offload == "optimizer+params" and backend == "zero3":
            weights = 0.0
    reference = (2 * p / shard) if work.reference_model else 0.0
    tokens = work.per_device * work.seq_len
    h, layers = model.hidden, model.layers
    if work.gradient_checkpointing:
        activations = 2.0 * h * tokens * layers + 34.0 * h * tokens
    else:
        activations = 34.0 * h * tokens * layers
    logits = work.per_device * work.completion_len * model.vocab * (2 + 4)
    return TrainMemory(weights, grads, optim, reference, activations, logits, OVERHEAD_BYTES)


def fits(total: float, gpu_bytes: float) -> bool:
    return total <= HEADROOM * gpu_bytes


# ------------------------------------------------------------------------------------------------ vLLM


@dataclass(frozen=True)
class VllmMemory:
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    weights_per_gpu: float
    kv_per_seq: float  # bytes per sequence of max_model_len, per GPU

    def lines(self) -> list[str]:
        return [
            f"weights {self.weights_per_gpu / GIB:.1f} GiB/GPU + KV {self.kv_per_seq / GIB * 1024:.0f} MiB/sequence "
            f"× {self.max_num_seqs} sequences + {VLLM_OVERHEAD_BYTES / GIB:.1f} GiB → "
            f"gpu_memory_utilization {self.gpu_memory_utilization:.2f}"
        ]


def vllm_memory(
    model: ModelShape, tp: int, gpu_bytes: float, work: Workload, *, share: float | None, replicas: int = 1
) -> VllmMemory | None:
    """vLLM sizing on GPUs of ``gpu_bytes``: with ``share`` (colocate) the fraction it may use, else up to 0.9.

    ``max_num_seqs`` covers the sequences one replica decodes at once (its part of a generation round), capped by
    what the KV cache holds; None when not even one sequence fits.
    """
    max_len = work.seq_len
    weights = model.weight_bytes_bf16 / tp
    kv_seq = model.kv_bytes_per_token_bf16 * max_len / tp
    limit = (share if share is not None else 0.90) * gpu_bytes
    room = limit - weights - VLLM_OVERHEAD_BYTES
    capacity = int(room // kv_seq) if kv_seq > 0 else 0
    if capacity < 1:
        return None
    wanted = max(1, math.ceil(work.completions / replicas))
    seqs = max(1, min(capacity, wanted, 1024))
    util = 0.90 if share is None else min(share, (weights + VLLM_OVERHEAD_BYTES + seqs * kv_seq) / gpu_bytes + 0.02)
    return VllmMemory(round(util, 2), max_len, seqs, weights, kv_seq)


# ------------------------------------------------------------------------------------------------ time


@dataclass(frozen=True)
class StepTime:
    generation_s: float
    training_s: float
    sync_s: float

    @property
    def total_s(self) -> float:
        return self.generation_s + self.training_s + self.sync_s

    @property
    def bottleneck(self) -> str:
        return "generation" if self.generation_s >= self.training_s else "training"


def generation_time(
    model: ModelShape, gpu: GpuSpec, tp: int, replicas: int, max_num_seqs: int, work: Workload
) -> tuple[float, str]:
    """Seconds to generate one optimizer step's completions on ``replicas`` × TP ``tp`` GPUs, and the arithmetic."""
    flops = gpu.bf16_tflops * 1e12
    bw = gpu.bandwidth_tbs * 1e12 * DECODE_BW_EFFICIENCY
    tp_factor = 1 + 0.1 * math.log2(tp) if tp > 1 else 1.0
    prompts = work.completions / max(1, work.num_generations)
    prefill = 2 * model.params * prompts * work.prompt_len / (replicas * tp * flops * PREFILL_MFU)
    per_replica = math.ceil(work.completions / replicas)
    batches = math.ceil(per_replica / max(1, max_num_seqs))
    batch = min(per_replica, max_num_seqs)
    avg_ctx = work.prompt_len + work.completion_len / 2
    read = (model.weight_bytes_bf16 + batch * avg_ctx * model.kv_bytes_per_token_bf16) / tp
    step_mem = read / bw
    step_compute = 2 * model.params * batch / (tp * flops * PREFILL_MFU)
    decode = batches * work.completion_len * (max(step_mem, step_compute) * tp_factor + DECODE_STEP_OVERHEAD_S)
    why = (
        f"prefill 2·{model.params / 1e9:.2f}B·{prompts:.0f} prompts·{work.prompt_len} tok / ({replicas}×{tp} GPU · "
        f"{gpu.bf16_tflops:.0f} TFLOP/s · {PREFILL_MFU:.0%}) = {prefill:.2f} s; decode {batches} batch(es) × "
        f"{work.completion_len} steps × ({max(step_mem, step_compute) * 1e3:.1f} ms "
        f"{'memory' if step_mem >= step_compute else 'compute'}-bound at batch {batch}"
        + (f" × TP {tp_factor:.2f}" if tp > 1 else "")
        + f" + {DECODE_STEP_OVERHEAD_S * 1e3:.0f} ms overhead) = {decode:.1f} s"
    )
    return prefill + decode, why


def training_time(
    model: ModelShape, gpu: GpuSpec, n: int, backend: str, offload: str, work: Workload
) -> tuple[float, str]:
    """Seconds of forward + backward over one optimizer step's tokens on ``n`` training GPUs, and the arithmetic."""
    tokens = work.completions * work.seq_len
    per_token = 6.0 + (2.0 if work.gradient_checkpointing else 0.0) + (2.0 if work.reference_model else 0.0)
    if work.lora:
        per_token -= 2.0  # no weight gradients for the frozen base
    factor = 1.0
    if backend == "zero3":
        factor *= 1.1
    if offload == "optimizer":
        factor *= 1.3
    elif offload == "optimizer+params":
        factor *= 2.0
    seconds = per_token * model.params * tokens * factor / (n * gpu.bf16_tflops * 1e12 * TRAIN_MFU)
    why = (
        f"{per_token:.0f}·{model.params / 1e9:.2f}B·{tokens:,} tok"
        + (f" ×{factor:.2f} ({backend}, offload {offload})" if factor != 1.0 else "")
        + f" / ({n} GPU · {gpu.bf16_tflops:.0f} TFLOP/s · {TRAIN_MFU:.0%} MFU) = {seconds:.1f} s"
    )
    return seconds, why


def sync_time(model: ModelShape, *, across_nodes: bool) -> float:
    return model.weight_bytes_bf16 / (SYNC_BYTES_PER_S_NET if across_nodes else SYNC_BYTES_PER_S_NODE)


def colocate_switch_time(model: ModelShape, n: int) -> float:
    """vLLM sleep/wake per step: a fixed cost plus moving the weights off and back (PCIe ~25 GB/s)."""
    return COLOCATE_SWITCH_S + 2 * model.weight_bytes_bf16 / n / 25e9
