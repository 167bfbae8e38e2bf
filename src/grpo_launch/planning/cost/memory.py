"""Memory per GPU. Pure arithmetic on the constants (:mod:`.constants`).

Training GPU (bf16 weights and gradients, fp32 Adam state, mixed precision):

- model states (:func:`model_states`, as DeepSpeed's estimators count them): DDP 16 B/param in float32; ZeRO-2
  2 + 18/n; ZeRO-3 4·largest layer + 18/n; optimizer offload keeps 2 (ZeRO-2) or 4L + 2/n (ZeRO-3), parameter
  offload 4L; FSDP 4L + 16/n; LoRA only the frozen base (2 B/param, /n under ZeRO-3);
- a reference model (beta > 0): the policy's weights again (4 B/param under DDP/FSDP, 2 under ZeRO; sharded under
  ZeRO-3/FSDP);
- activations of one micro-batch, counted from what the forward saves (:mod:`.activations`): every layer's saved
  tensors, or the per-layer checkpoints plus one recomputed layer; TRL 1.16's fused LM head (tiles, never the full
  logits) and its float32 weight gradient; under DDP the bf16 weight copies autocast keeps for the backward;
- CUDA context, NCCL buffers and allocator fragmentation: a fixed amount plus a fraction.

vLLM GPU: weights/TP per GPU plus the KV cache of the concurrent sequences (2·layers·kv_heads·head_dim·2 B per
token, split over TP), plus a fixed amount for activations and CUDA graphs."""

from __future__ import annotations

import math

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.machines.gpus import GIB
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.activations import Precision, activation_memory
from grpo_launch.planning.cost.constants import (
    ADAM_STATE_BYTES,
    CONSTANTS,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    HEADROOM,
    NCCL_BUFFER_BYTES,
    OVERHEAD_FRACTION,
    VLLM_OVERHEAD_BYTES,
    VLLM_SERVER_UTILIZATION,
    VLLM_UTILIZATION_MARGIN,
    VLLM_WEIGHTS_SHARE,
    _c,
)
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.spec import frozen


@frozen
class TrainMemory:
    """One training process's memory by term, in bytes per GPU."""

    weights: float
    gradients: float
    optimizer: float
    reference: float
    activations: float  # saved for the backward (plus the recomputed layer when it outweighs the LM head)
    lm_head: float  # TRL's fused LM head: saved inputs and backward workspace
    autocast_weights: float  # bf16 weight copies under autocast (DDP)
    overhead: float
    scale: float = 1.0  # a previous run's measured-over-predicted peak (plan --calibrate-from)
    activation_scale: float = 1.0  # calibrate's measured-over-modelled activation memory (GPU, at least 1)

    @property
    def total(self) -> float:
        activations = (self.activations + self.lm_head) * self.activation_scale
        terms = self.weights + self.gradients + self.optimizer + self.reference + activations
        return ((terms + self.autocast_weights) * (1 + OVERHEAD_FRACTION) + self.overhead) * self.scale

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
        extra = (
            f"×{1 + OVERHEAD_FRACTION:.2f} allocator fragmentation + {self.overhead / GIB:.2f} GiB CUDA context, "
            "cuBLAS workspace and NCCL buffers"
        )
        if self.activation_scale != 1.0:
            body += f" (activations and LM head × {self.activation_scale:.2f} measured by calibrate)"
        if self.scale != 1.0:
            extra = f"({extra}) × {self.scale:.2f} measured"
        return [f"{body} GiB, {extra} = {self.total / GIB:.1f} GiB"]


def model_states(
    model: ModelShape, n: int, backend: DistBackend, offload: Offload, *, lora: bool = False, lora_base_bytes: int = 2
) -> tuple[float, ...]:
    """(weights, gradients, optimizer) bytes per training GPU, term by term as DeepSpeed's own estimators count them
    (``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``; the 18 bytes per
    parameter are 2 bf16 gradients + 4 fp32 gradients + 4 fp32 master weights + 8 Adam moments):

    - ZeRO-2: bf16 weights 2P whole, gradients 6P/n, optimizer 12P/n; optimizer offload keeps only the 2P.
    - ZeRO-3: bf16 weight shards 2P/n plus the largest layer gathered whole (4L), gradients 4P/n, optimizer 12P/n;
      optimizer offload keeps 4L + 2P/n, parameter offload 4L.
    - DDP: float32 weights, gradients and Adam moments (4 + 4 + 8 = 16P): the planner loads float32 under DDP, so
      there is no separate master copy.
    - FSDP2: the same 16P in float32, sharded (/n), plus the gathered largest layer (4L); parameter offload keeps 4L.
    - LoRA: the frozen bf16 base (2P, /n under ZeRO-3 and FSDP); the adapters are negligible. AsyncGRPOTrainer
      loads the base in float32 by default (``lora_base_bytes`` 4: async_grpo_config.py:178).
    """
    b, o = backend, offload
    p, big = model.params, 4 * model.largest_layer_params
    if lora and (lora_base_bytes != 2 or b == DistBackend.FSDP):  # FSDP shards the frozen base too
        return (lora_base_bytes * p / (n if b in (DistBackend.ZERO3, DistBackend.FSDP) else 1), 0.0, 0.0)
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


def host_memory_per_node(
    model: ModelShape, gpus_per_node: int, nodes: int, backend: DistBackend, offload: Offload
) -> float:
    """Host RAM per node that offload needs, as DeepSpeed's estimators count it (with their 1.5 buffer factor)."""
    b, o = backend, offload
    p, buffer = model.params, _c("deepspeed_host_buffer_factor")
    if b == DistBackend.ZERO2 and o.optimizer:
        return p * max(4 * gpus_per_node * nodes, 16) * buffer
    if b == DistBackend.ZERO3 and o.optimizer:  # zero_init (zero3_init_flag: true, as rendered)
        return p * (18 if o.params else 16) / nodes * buffer
    return 0.0


def train_memory(model: ModelShape, n: int, backend: DistBackend, offload: Offload, work: Workload) -> TrainMemory:
    """Memory per training GPU for ``n`` training processes."""
    p = model.params
    weights, grads, optim = model_states(
        model, n, backend, offload, lora=work.lora, lora_base_bytes=work.lora_base_bytes
    )
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
    return TrainMemory(
        weights,
        grads,
        optim,
        reference,
        activations,
        lm_head,
        autocast,
        process_overhead(n),
        work.scale.memory * work.scale.measured_memory,
        work.scale.activation_memory,
    )


def margin_lines(n: int) -> list[str]:
    """The memory margin of a training GPU, term by term, each with its source (plan --explain)."""

    def said(key: str) -> str:
        return CONSTANTS[key].source

    lines = [
        f"margin: plan at most {HEADROOM:.0%} of each training GPU ({said('headroom')})",
        f"margin: allocator fragmentation {OVERHEAD_FRACTION:.0%} of the tensors ({said('overhead_fraction')})",
        f"margin: CUDA context {CUDA_CONTEXT_BYTES / GIB:.1f} GiB ({said('cuda_context_bytes')}); cuBLAS "
        f"workspace {CUBLAS_WORKSPACE_BYTES / 2**20:.0f} MiB ({said('cublas_workspace_bytes')})",
    ]
    if n > 1:
        lines.append(f"margin: NCCL buffers {NCCL_BUFFER_BYTES / GIB:.1f} GiB ({said('nccl_buffer_bytes')})")
    return lines


def process_overhead(n: int) -> float:
    """Memory a training process holds beside its tensors: the CUDA context, cuBLAS workspaces, and the NCCL
    buffers of its communicator when it has peers (constants.py gives each term's source)."""
    return CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + (NCCL_BUFFER_BYTES if n > 1 else 0.0)


def precision(backend: DistBackend, *, lora: bool) -> Precision:
    """Byte widths on a GPU: bf16 activations; float32 weights under DDP and FSDP (the trainer's master weights,
    see trainer_values) unless LoRA freezes a bf16 base."""
    fp32 = backend in (DistBackend.DDP, DistBackend.FSDP) and not lora
    return Precision(activation_bytes=2, param_bytes=4 if fp32 else 2, triton=True)


@frozen
class VllmMemory:
    """vLLM's memory on one server GPU: its share, context length, concurrent sequences, weights and KV cache."""

    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    weights_per_gpu: float
    kv_per_seq: float  # bytes per sequence of max_model_len, per GPU

    def lines(self, given: float | None = None) -> list[str]:
        """The terms; with ``given``, the share the plan gives vLLM (a colocated engine's vllm_gpu_memory_utilization),
        which the sized need is compared with rather than named as the share: the plan does not use the need."""
        terms = (
            f"weights {self.weights_per_gpu / GIB:.1f} GiB/GPU + KV {self.kv_per_seq / GIB * 1024:.0f} MiB/sequence "
            f"× {self.max_num_seqs} sequences + {VLLM_OVERHEAD_BYTES / GIB:.1f} GiB"
        )
        if given is not None and round(given, 2) != self.gpu_memory_utilization:
            return [
                f"{terms} = {self.gpu_memory_utilization:.2f} of each GPU, within the {given:.2f} vLLM is given "
                "(vllm_gpu_memory_utilization)"
            ]
        return [f"{terms} → gpu_memory_utilization {self.gpu_memory_utilization:.2f}"]


def vllm_memory(
    model: ModelShape,
    par: Parallelism,
    gpu_bytes: float,
    work: Workload,
    *,
    share: float | None,
    limit: float | None = None,
) -> VllmMemory | None:
    """vLLM sizing of ``par`` on GPUs of ``gpu_bytes``: with ``share`` (colocate) the fraction it may use and the
    utilization sized to what it needs; else a server at ``limit`` (its --gpu-memory-utilization, default TRL's 0.9).

    ``max_num_seqs`` covers the sequences one replica (a colocated engine, a server's data-parallel rank) decodes
    at once (its part of a generation round), capped by what the KV cache holds; None when not even one sequence
    fits. With ``par.ep`` the routed experts are spread over all TP × DP GPUs (expert parallelism); with
    ``par.pp`` stages each GPU holds its stage's layers and their KV cache.
    """
    max_len, replicas = work.seq_len, par.dp
    weights = vllm_weights(model, par)
    kv_seq = model.kv_bytes_per_token_per_gpu(par.tp, par.pp) * max_len
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


def vllm_share_needed(model: ModelShape, par: Parallelism, gpu_bytes: float, seq_len: int) -> float:
    """The gpu_memory_utilization that holds the weights and one sequence's KV cache (for a refusal's fix)."""
    kv = model.kv_bytes_per_token_per_gpu(par.tp, par.pp) * seq_len
    return (vllm_weights(model, par) + VLLM_OVERHEAD_BYTES + kv) / gpu_bytes + VLLM_UTILIZATION_MARGIN


def vllm_weights(model: ModelShape, par: Parallelism) -> float:
    """bf16 weight bytes on each of ``par``'s GPUs (the routed experts spread over all of them with ``par.ep``)."""
    return model.weight_bytes_per_gpu(par.tp, par.dp, ep=par.ep, pp=par.pp)


def weights_fit(weights_per_gpu: float, gpu_bytes: float | None, share: float = 1.0) -> bool:
    """The weights-fit rule, the one the planner uses everywhere: vLLM's bf16 weights per GPU take at most
    :data:`VLLM_WEIGHTS_SHARE` of the memory vLLM may use (``share`` of a GPU: all of a server's, the colocated
    share), leaving the rest for the KV cache. Unknown memory fits."""
    return gpu_bytes is None or weights_per_gpu <= VLLM_WEIGHTS_SHARE * share * gpu_bytes
