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

Step time (:mod:`.steptime`) uses the constants below; the training MFU is per GPU class (:data:`TRAIN_MFU`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_launch.catalog import GIB, ModelShape
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
    "prefill_mfu": Constant(0.50, "of peak bf16", "vLLM prefill is compute-bound at large batch"),
    "decode_bw_efficiency": Constant(0.85, "of peak HBM bandwidth", "memory-bound decode kernels"),
    "decode_step_overhead_s": Constant(0.003, "s/decode step", "vLLM scheduling, sampling and kernel launches"),
    "tp_allreduce_factor": Constant(0.1, "per doubling of TP", "decode slowdown from TP all-reduces"),
    "zero3_slowdown": Constant(1.1, "×", "ZeRO-3 parameter gathers not hidden behind compute (assumed)"),
    "cpu_adam_params_per_s": Constant(
        3.9e9,
        "params/s per node",
        "ZeRO-Offload (Ren et al., USENIX ATC 2021) Table 4: DeepSpeed CPU-Adam 2.57 s for 10B parameters "
        "(0.22 s for 1B) on a DGX-2 host",
    ),
    "sync_bytes_per_s_node": Constant(20e9, "B/s", "NCCL broadcast within a node"),
    "sync_bytes_per_s_net": Constant(10e9, "B/s", "NCCL broadcast across nodes"),
    "colocate_switch_s": Constant(1.0, "s", "vLLM sleep/wake fixed cost"),
    "pcie_bytes_per_s": Constant(
        25e9,
        "B/s",
        "PCIe 4.0 x16 pinned host↔device: CUDA bandwidthTest on A100-SXM4 measures 25.7–26.1 GB/s "
        "(Gen5 parts are faster; no measured figure published, so Gen4's is kept)",
    ),
    "default_prompt_len": Constant(512, "tokens", "assumed when the recipe has no max_prompt_length"),
}


def _c(name: str) -> float:
    return CONSTANTS[name].value


# Training MFU (model FLOPs over peak dense bf16) per GPU class, from published dense-transformer training runs.
TRAIN_MFU: dict[str, Constant] = {
    "H100": Constant(
        0.40,
        "of peak bf16",
        "llm-foundry benchmarks (8×H100, seq 2048): 41.8 % at 1B, 46.4 % at 7B; Llama 3 "
        "paper Table 4: 38–43 %; torchtitan Llama 3.1 8B: 33–39 %",
    ),
    "H200": Constant(0.40, "of peak bf16", "same Hopper cores as H100 (no published bf16 MFU): H100's figure"),
    "H20": Constant(0.40, "of peak bf16", "Hopper (no published bf16 MFU): H100's figure"),
    "A100": Constant(
        0.50,
        "of peak bf16",
        "Megatron-LM (Narayanan et al. 2021) Table 1: 44 % at 1.7B, 52 % at 1T; "
        "llm-foundry A100-80GB: 60 % at 1B, 64 % at 7B",
    ),
    "B200": Constant(0.38, "of peak bf16", "no published dense bf16 MFU; third-party 70B report 38 % on 8×B200"),
}
# GPUs without a published training MFU (L40S, L4, A10, RTX…): assumed below the data-centre parts.
FALLBACK_MFU = Constant(0.35, "of peak bf16", "no published figure for this GPU class: assumed")


def train_mfu(gpu_name: str) -> Constant:
    """The training MFU of a GPU class (the longest table key the GPU's name starts with)."""
    keys = sorted((k for k in TRAIN_MFU if gpu_name.upper().startswith(k)), key=len, reverse=True)
    return TRAIN_MFU[keys[0]] if keys else FALLBACK_MFU


ADAM_STATE_BYTES = _c("adam_state_bytes")
OVERHEAD_BYTES = _c("overhead_bytes")
OVERHEAD_FRACTION = _c("overhead_fraction")
HEADROOM = _c("headroom")
HOST_HEADROOM = _c("host_headroom")
VLLM_SERVER_UTILIZATION = _c("vllm_server_utilization")
VLLM_OVERHEAD_BYTES = _c("vllm_overhead_bytes")
VLLM_WEIGHTS_SHARE = _c("vllm_weights_share")
VLLM_UTILIZATION_MARGIN = _c("vllm_utilization_margin")
PREFILL_MFU = _c("prefill_mfu")
DECODE_BW_EFFICIENCY = _c("decode_bw_efficiency")
DECODE_STEP_OVERHEAD_S = _c("decode_step_overhead_s")
DEFAULT_PROMPT_LEN = int(_c("default_prompt_len"))
# TRL's own defaults (generated from TRL: grpo_launch.trl_schema).
TRL_COMPLETION_LEN = int(TRL_DEFAULTS["max_completion_length"])
TRL_COLOCATE_UTILIZATION = float(TRL_DEFAULTS["vllm_gpu_memory_utilization"])
TRL_EPOCHS = float(TRL_DEFAULTS["num_train_epochs"])


@dataclass(frozen=True)
class Calibration:
    """Measured over predicted, from a previous run (``grpo-launch plan --calibrate-from RUN_DIR``): generation
    and training time, peak training memory, and the mean completion length measured."""

    generation: float = 1.0
    training: float = 1.0
    memory: float = 1.0
    mean_completion_len: float | None = None
    source: str = ""


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes, and a previous run's calibration when there is one."""

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
    expected_completion_len: float = 0.0  # the mean completion length; 0: every completion runs to the maximum
    scale: Calibration = Calibration()

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    @property
    def mean_completion_len(self) -> float:
        return min(self.completion_len, self.expected_completion_len or self.completion_len)

    def longest_of(self, batch: int) -> float:
        """The expected longest of ``batch`` completions, which a padded batch (or a decode batch) runs to, for
        lengths spread evenly around the mean up to the maximum (order statistics of a uniform distribution:
        mean + (max − mean)·(B − 1)/(B + 1))."""
        mean, top = self.mean_completion_len, self.completion_len
        b = max(1, batch)
        return mean + (top - mean) * (b - 1) / (b + 1)


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
    scale: float = 1.0  # a previous run's measured-over-predicted peak (plan --calibrate-from)

    @property
    def total(self) -> float:
        terms = self.weights + self.gradients + self.optimizer + self.reference + self.activations + self.lm_head
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
        extra = f"×{1 + OVERHEAD_FRACTION:.2f} + {self.overhead / GIB:.1f} GiB CUDA/NCCL"
        if self.scale != 1.0:
            extra = f"({extra}) × {self.scale:.2f} measured"
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
    return TrainMemory(
        weights, grads, optim, reference, activations, lm_head, autocast, OVERHEAD_BYTES, work.scale.memory
    )


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
    ep: bool = False,
) -> VllmMemory | None:
    """vLLM sizing on GPUs of ``gpu_bytes``: with ``share`` (colocate) the fraction it may use and the utilization
    sized to what it needs; else a server at ``limit`` (its --gpu-memory-utilization, default TRL's 0.9).

    ``max_num_seqs`` covers the sequences one replica (a colocated engine, a server's data-parallel rank) decodes
    at once (its part of a generation round), capped by what the KV cache holds; None when not even one sequence
    fits. With ``ep`` the routed experts are spread over all ``tp × replicas`` GPUs (expert parallelism).
    """
    max_len = work.seq_len
    weights = model.weight_bytes_per_gpu(tp, replicas, ep=ep)
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


def vllm_share_needed(
    model: ModelShape, tp: int, gpu_bytes: float, seq_len: int, dp: int = 1, *, ep: bool = False
) -> float:
    """The gpu_memory_utilization that holds the weights and one sequence's KV cache (for a refusal's fix)."""
    weights = model.weight_bytes_per_gpu(tp, dp, ep=ep)
    return (weights + VLLM_OVERHEAD_BYTES + model.kv_bytes_per_token_per_gpu(tp) * seq_len) / gpu_bytes + (
        VLLM_UTILIZATION_MARGIN
    )


def fits_server_gpu(model: ModelShape | None, gpu_bytes: int | None, tp: int) -> bool:
    """The weights take at most the allowed share of each server GPU at tensor-parallel size ``tp``."""
    if model is None or gpu_bytes is None:
        return True
    return model.weight_bytes_bf16 / tp <= VLLM_WEIGHTS_SHARE * gpu_bytes
