"""The cost model: every memory and time term of a GRPO step, and every constant it uses, in one table with a
source per constant. Pure arithmetic, no I/O.

Memory per training GPU (bf16 weights and gradients, fp32 Adam state, mixed precision):

- model states (:func:`model_states`, as DeepSpeed's estimators count them): DDP 16 B/param in float32; ZeRO-2
  2 + 18/n; ZeRO-3 4·largest layer + 18/n; optimizer offload keeps 2 (ZeRO-2) or 4L + 2/n (ZeRO-3), parameter
  offload 4L; FSDP 4L + 16/n; LoRA only the frozen base (2 B/param, /n under ZeRO-3);
- a reference model (beta > 0): the policy's weights again (4 B/param under DDP/FSDP, 2 under ZeRO; sharded under
  ZeRO-3/FSDP);
- activations of one micro-batch, counted from what the forward saves (:mod:`.activations`): every layer's saved
  tensors, or the per-layer checkpoints plus one recomputed layer; TRL 1.16's fused LM head (tiles, never the full
  logits) and its float32 weight gradient; under DDP the bf16 weight copies autocast keeps for the backward;
- CUDA context, NCCL buffers and allocator fragmentation: a fixed amount plus a fraction.

vLLM: weights/TP per GPU plus the KV cache of the concurrent sequences (2·layers·kv_heads·head_dim·2 B per token,
split over TP), plus a fixed amount for activations and CUDA graphs.

Step time (one optimizer step; TRL 1.16 runs generation and training one after the other):

- generation: prefill is compute-bound (2·P FLOPs per prompt token, one prompt per group thanks to prefix
  caching); decode is memory-bound: each decode step reads the weights and the batch's KV cache, on each of the
  DP replicas (TP GPUs each, at a bandwidth efficiency, slowed by TP all-reduces), plus a fixed scheduling and
  sampling cost per step whatever the model size;
- training: 6·P FLOPs per token forward + backward, +2·P with gradient checkpointing, +2·P for a reference model,
  at a fixed MFU, with multipliers for ZeRO-3 and offload;
- weight sync (server mode): bf16 weights broadcast to the server; colocate: vLLM sleep/wake and weight moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_launch.catalog import GIB, GpuSpec, ModelShape
from grpo_launch.enums import DistBackend, Offload
from grpo_launch.planning.activations import Precision, activation_memory
from grpo_launch.trl_schema import DEFAULTS as TRL_DEFAULTS


@dataclass(frozen=True)
class Constant:
    value: float
    unit: str
    source: str


# Every number the model uses. The sources say where each comes from; the cost-model issue calibrates them.
CONSTANTS: dict[str, Constant] = {
    "adam_state_bytes": Constant(12.0, "B/param", "fp32 master weights + two fp32 Adam moments (ZeRO paper, §3)"),
    "deepspeed_host_buffer_factor": Constant(
        1.5, "×", "additional_buffer_factor of DeepSpeed's estimate_zero{2,3}_model_states_mem_needs"
    ),
    "overhead_bytes": Constant(2 * GIB, "B", "CUDA context + NCCL buffers, typical of a PyTorch process on H100"),
    "overhead_fraction": Constant(0.05, "of the total", "allocator fragmentation allowance (rule of thumb)"),
    "headroom": Constant(0.90, "of GPU memory", "planning margin: use at most 90 % of a training GPU"),
    "host_headroom": Constant(
        0.80, "of host RAM", "leave a fifth of a node's RAM to the OS, dataloaders and page cache"
    ),
    "autocast_weight_bytes": Constant(
        2.0, "B/param", "bf16 copies of float32 weights that torch.autocast caches for the forward and backward"
    ),
    "vllm_server_utilization": Constant(
        0.90, "of GPU memory", "TRL's vllm-serve default --gpu-memory-utilization (vLLM 0.31's own is 0.92)"
    ),
    "vllm_overhead_bytes": Constant(1.5 * GIB, "B", "vLLM activations + CUDA graphs outside the KV cache"),
    "vllm_weights_share": Constant(0.5, "of a vLLM GPU", "leave at least half of a server GPU for the KV cache"),
    "vllm_utilization_margin": Constant(0.02, "of GPU memory", "slack on a sized colocate share"),
    "vllm_max_num_seqs": Constant(1024, "sequences", "upper bound on the planned --max-num-seqs"),
    "train_mfu": Constant(0.40, "of peak bf16", "typical dense-transformer training MFU (Megatron/DeepSpeed reports)"),
    "prefill_mfu": Constant(0.50, "of peak bf16", "vLLM prefill is compute-bound at large batch"),
    "decode_bw_efficiency": Constant(0.85, "of peak HBM bandwidth", "memory-bound decode kernels"),
    "decode_step_overhead_s": Constant(0.003, "s/decode step", "vLLM scheduling, sampling and kernel launches"),
    "tp_allreduce_factor": Constant(0.1, "per doubling of TP", "decode slowdown from TP all-reduces"),
    "zero3_slowdown": Constant(1.1, "×", "ZeRO-3 parameter gathers"),
    "optimizer_offload_slowdown": Constant(1.3, "×", "CPU Adam + PCIe transfers"),
    "param_offload_slowdown": Constant(2.0, "×", "parameters streamed over PCIe every step"),
    "sync_bytes_per_s_node": Constant(20e9, "B/s", "NCCL broadcast within a node"),
    "sync_bytes_per_s_net": Constant(10e9, "B/s", "NCCL broadcast across nodes"),
    "colocate_switch_s": Constant(1.0, "s", "vLLM sleep/wake fixed cost"),
    "pcie_bytes_per_s": Constant(25e9, "B/s", "PCIe 4.0 x16 effective host↔device bandwidth"),
    "default_prompt_len": Constant(512, "tokens", "assumed when the recipe has no max_prompt_length"),
}


def _c(name: str) -> float:
    return CONSTANTS[name].value


ADAM_STATE_BYTES = _c("adam_state_bytes")
OVERHEAD_BYTES = _c("overhead_bytes")
OVERHEAD_FRACTION = _c("overhead_fraction")
HEADROOM = _c("headroom")
HOST_HEADROOM = _c("host_headroom")
VLLM_SERVER_UTILIZATION = _c("vllm_server_utilization")
VLLM_OVERHEAD_BYTES = _c("vllm_overhead_bytes")
VLLM_WEIGHTS_SHARE = _c("vllm_weights_share")
VLLM_UTILIZATION_MARGIN = _c("vllm_utilization_margin")
TRAIN_MFU = _c("train_mfu")
PREFILL_MFU = _c("prefill_mfu")
DECODE_BW_EFFICIENCY = _c("decode_bw_efficiency")
DECODE_STEP_OVERHEAD_S = _c("decode_step_overhead_s")
DEFAULT_PROMPT_LEN = int(_c("default_prompt_len"))
# TRL's own defaults (generated from TRL: grpo_launch.trl_schema).
TRL_COMPLETION_LEN = int(TRL_DEFAULTS["max_completion_length"])
TRL_COLOCATE_UTILIZATION = float(TRL_DEFAULTS["vllm_gpu_memory_utilization"])
TRL_EPOCHS = float(TRL_DEFAULTS["num_train_epochs"])


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
    generation_batch: int = 0  # completions per generation round (TRL sends them in one request); 0: completions
    old_logprobs: bool = False  # TRL's extra forward pass over the completions for the old log-probs

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len


@dataclass(frozen=True)
class TrainMemory:
    weights: float
    gradients: float
    optimizer: float
    reference: float
    activations: float  # saved for the backward (plus the recomputed layer when it outweighs the LM head)
    lm_head: float  # TRL's fused LM head: saved inputs and backward workspace
    autocast_weights: float  # bf16 weight copies under autocast (DDP)
    overhead: float

    @property
    def total(self) -> float:
        terms = self.weights + self.gradients + self.optimizer + self.reference + self.activations + self.lm_head
        return (terms + self.autocast_weights) * (1 + OVERHEAD_FRACTION) + self.overhead

    def lines(self) -> list[str]:
        parts = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer", self.optimizer),
            ("reference model", self.reference),
            ("activations", self.activations),
            ("LM head", self.lm_head),
            ("autocast weights", self.autocast_weights),
        ]
        body = " + ".join(f"{name} {v / GIB:.1f}" for name, v in parts if v)
        extra = f"×{1 + OVERHEAD_FRACTION:.2f} + {self.overhead / GIB:.1f} GiB CUDA/NCCL"
        return [f"{body} GiB, {extra} = {self.total / GIB:.1f} GiB"]


def model_states(model: ModelShape, n: int, backend: str, offload: str, *, lora: bool = False) -> tuple[float, ...]:
    """(weights, gradients, optimizer) bytes per training GPU, term by term as DeepSpeed's own estimators count them
    (``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``; the 18 bytes per
    parameter are 2 bf16 gradients + 4 fp32 gradients + 4 fp32 master weights + 8 Adam moments):

    - ZeRO-2: bf16 weights 2P whole, gradients 6P/n, optimizer 12P/n; optimizer offload keeps only the 2P.
    - ZeRO-3: bf16 weight shards 2P/n plus the largest layer gathered whole (4L), gradients 4P/n, optimizer 12P/n;
      optimizer offload keeps 4L + 2P/n, parameter offload 4L.
    - DDP: float32 weights, gradients and Adam moments (4 + 4 + 8 = 16P): the planner loads float32 under DDP, so
      there is no separate master copy.
    - FSDP2: the same 16P in float32, sharded (/n), plus the gathered largest layer (4L); parameter offload keeps 4L.
    - LoRA: the frozen bf16 base (2P, /n under ZeRO-3); the adapters are negligible.
    """
    b, o = DistBackend(backend), Offload(offload)
    p, big = model.params, 4 * model.largest_layer_params
    if lora:
        return (2 * p / (n if b == DistBackend.ZERO3 else 1), 0.0, 0.0)
    if b == DistBackend.ZERO2:
        return (2 * p, 0.0, 0.0) if o.optimizer else (2 * p, 6 * p / n, ADAM_STATE_BYTES * p / n)
    if b == DistBackend.ZERO3:
        if o.params:
            return (big, 0.0, 0.0)
        return (big + 2 * p / n, 0.0, 0.0) if o.optimizer else (big + 2 * p / n, 4 * p / n, ADAM_STATE_BYTES * p / n)
    if b == DistBackend.FSDP:
        return (big, 0.0, 0.0) if o.params else (big + 4 * p / n, 4 * p / n, 8 * p / n)
    return (4 * p, 4 * p, 8 * p)


def host_memory_per_node(model: ModelShape, gpus_per_node: int, nodes: int, backend: str, offload: str) -> float:
    """Host RAM per node that offload needs, as DeepSpeed's estimators count it (with their 1.5 buffer factor)."""
    b, o = DistBackend(backend), Offload(offload)
    p, buffer = model.params, _c("deepspeed_host_buffer_factor")
    if b == DistBackend.ZERO2 and o.optimizer:
        return p * max(4 * gpus_per_node * nodes, 16) * buffer
    if b == DistBackend.ZERO3 and o.optimizer:  # zero_init (zero3_init_flag: true, as rendered)
        return p * (18 if o.params else 16) / nodes * buffer
    return 0.0


def train_memory(model: ModelShape, n: int, backend: str, offload: str, work: Workload) -> TrainMemory:
    """Memory per training GPU for ``n`` training processes."""
    backend, offload = DistBackend(backend), Offload(offload)
    p = model.params
    weights, grads, optim = model_states(model, n, backend, offload, lora=work.lora)
    # The reference model loads like the policy: float32 under DDP/FSDP (see trainer_values), bf16 under ZeRO;
    # sharded under ZeRO-3 and FSDP.
    ref_bytes = 2 if backend.is_deepspeed else 4
    reference = ref_bytes * p / (n if backend in (DistBackend.ZERO3, DistBackend.FSDP) else 1)
    reference = reference if work.reference_model else 0.0
    prec = precision(backend, lora=work.lora)
    act = activation_memory(
        model, work.per_device, work.seq_len, work.completion_len, work.gradient_checkpointing, prec, lora=work.lora
    )
    activations = act.saved + act.mask + max(0.0, act.recompute - act.lm_head)
    lm_head = act.lm_head
    autocast = _c("autocast_weight_bytes") * p if prec.autocast and backend == DistBackend.DDP else 0.0
    return TrainMemory(weights, grads, optim, reference, activations, lm_head, autocast, OVERHEAD_BYTES)


def precision(backend: str, *, lora: bool) -> Precision:
    """Byte widths on a GPU: bf16 activations; float32 weights under DDP and FSDP (the trainer's master weights,
    see trainer_values) unless LoRA freezes a bf16 base."""
    fp32 = DistBackend(backend) in (DistBackend.DDP, DistBackend.FSDP) and not lora
    return Precision(activation_bytes=2, param_bytes=4 if fp32 else 2, triton=True)


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
    model: ModelShape,
    tp: int,
    gpu_bytes: float,
    work: Workload,
    *,
    share: float | None,
    replicas: int = 1,
    limit: float | None = None,
) -> VllmMemory | None:
    """vLLM sizing on GPUs of ``gpu_bytes``: with ``share`` (colocate) the fraction it may use and the utilization
    sized to what it needs; else a server at ``limit`` (its --gpu-memory-utilization, default TRL's 0.9).

    ``max_num_seqs`` covers the sequences one replica decodes at once (its part of a generation round), capped by
    what the KV cache holds; None when not even one sequence fits.
    """
    max_len = work.seq_len
    weights = model.weight_bytes_bf16 / tp
    kv_seq = model.kv_bytes_per_token_per_gpu(tp) * max_len
    server_util = limit if limit is not None else VLLM_SERVER_UTILIZATION
    room = (share if share is not None else server_util) * gpu_bytes - weights - VLLM_OVERHEAD_BYTES
    capacity = int(room // kv_seq) if kv_seq > 0 else 0
    if capacity < 1:
        return None
    wanted = max(1, math.ceil((work.generation_batch or work.completions) / replicas))
    seqs = max(1, min(capacity, wanted, int(_c("vllm_max_num_seqs"))))
    if share is None:
        util = server_util
    else:
        util = min(share, (weights + VLLM_OVERHEAD_BYTES + seqs * kv_seq) / gpu_bytes + VLLM_UTILIZATION_MARGIN)
    return VllmMemory(round(util, 2), max_len, seqs, weights, kv_seq)


def vllm_share_needed(model: ModelShape, tp: int, gpu_bytes: float, seq_len: int) -> float:
    """The gpu_memory_utilization that holds the weights and one sequence's KV cache (for a refusal's fix)."""
    weights = model.weight_bytes_bf16 / tp
    return (weights + VLLM_OVERHEAD_BYTES + model.kv_bytes_per_token_per_gpu(tp) * seq_len) / gpu_bytes + (
        VLLM_UTILIZATION_MARGIN
    )


def fits_server_gpu(model: ModelShape | None, gpu_bytes: int | None, tp: int) -> bool:
    """The weights take at most the allowed share of each server GPU at tensor-parallel size ``tp``."""
    if model is None or gpu_bytes is None:
        return True
    return model.weight_bytes_bf16 / tp <= VLLM_WEIGHTS_SHARE * gpu_bytes


# ------------------------------------------------------------------------------------------------ time


def generation_time(
    model: ModelShape, gpu: GpuSpec, tp: int, replicas: int, max_num_seqs: int, work: Workload
) -> tuple[float, str]:
    """Seconds to generate one optimizer step's completions on ``replicas`` × TP ``tp`` GPUs, and the arithmetic."""
    flops = gpu.bf16_tflops * 1e12
    bw = gpu.bandwidth_tbs * 1e12 * DECODE_BW_EFFICIENCY
    tp_factor = 1 + _c("tp_allreduce_factor") * math.log2(tp) if tp > 1 else 1.0
    prompts = work.completions / max(1, work.num_generations)
    prefill = 2 * model.params * prompts * work.prompt_len / (replicas * tp * flops * PREFILL_MFU)
    per_replica = math.ceil(work.completions / replicas)
    batches = math.ceil(per_replica / max(1, max_num_seqs))
    batch = min(per_replica, max_num_seqs)
    avg_ctx = work.prompt_len + work.completion_len / 2
    read = model.weight_bytes_bf16 / tp + batch * avg_ctx * model.kv_bytes_per_token_per_gpu(tp)
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


def transformers_generation_time(model: ModelShape, gpu: GpuSpec, n: int, work: Workload) -> float:
    """Generation without vLLM: the trainers decode with transformers at about half the bandwidth efficiency."""
    per_token = 2 * model.weight_bytes_bf16 / (gpu.bandwidth_tbs * 1e12 * 0.5)
    return work.completion_len * per_token * math.ceil(work.completions / max(1, n * work.per_device))


def training_time(
    model: ModelShape, gpu: GpuSpec, n: int, backend: str, offload: str, work: Workload
) -> tuple[float, str]:
    """Seconds of forward + backward over one optimizer step's tokens on ``n`` training GPUs, and the arithmetic."""
    backend, offload = DistBackend(backend), Offload(offload)
    tokens = work.completions * work.seq_len
    per_token = 6.0 + (2.0 if work.gradient_checkpointing else 0.0) + (2.0 if work.reference_model else 0.0)
    if work.lora:
        per_token -= 2.0  # no weight gradients for the frozen base
    factor = 1.0
    if backend == DistBackend.ZERO3:
        factor *= _c("zero3_slowdown")
    if offload == Offload.OPTIMIZER:
        factor *= _c("optimizer_offload_slowdown")
    elif offload == Offload.OPTIMIZER_PARAMS:
        factor *= _c("param_offload_slowdown")
    seconds = per_token * model.params * tokens * factor / (n * gpu.bf16_tflops * 1e12 * TRAIN_MFU)
    why = (
        f"{per_token:.0f}·{model.params / 1e9:.2f}B·{tokens:,} tok"
        + (f" ×{factor:.2f} ({backend}, offload {offload})" if factor != 1.0 else "")
        + f" / ({n} GPU · {gpu.bf16_tflops:.0f} TFLOP/s · {TRAIN_MFU:.0%} MFU) = {seconds:.1f} s"
    )
    return seconds, why


def old_logprobs_time(model: ModelShape, gpu: GpuSpec, n: int, work: Workload) -> float:
    """TRL's extra forward pass (2·P FLOPs per token) that computes the old log-probs before training, at the
    training MFU; 0 when TRL skips it."""
    if not work.old_logprobs:
        return 0.0
    tokens = work.completions * work.seq_len
    return 2.0 * model.params * tokens / (n * gpu.bf16_tflops * 1e12 * TRAIN_MFU)


def sync_time(model: ModelShape, *, across_nodes: bool) -> float:
    rate = _c("sync_bytes_per_s_net") if across_nodes else _c("sync_bytes_per_s_node")
    return model.weight_bytes_bf16 / rate


def colocate_switch_time(model: ModelShape, n: int, *, sleep_mode: bool) -> float:
    """Colocated vLLM per step: with sleep mode, a fixed sleep/wake cost plus moving the weights off and back over
    PCIe; without it nothing moves (vLLM keeps its memory share while the trainers run)."""
    if not sleep_mode:
        return 0.0
    return _c("colocate_switch_s") + 2 * model.weight_bytes_bf16 / n / _c("pcie_bytes_per_s")
