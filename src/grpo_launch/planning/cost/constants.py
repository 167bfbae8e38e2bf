"""Every constant of the cost model, with its unit and source, in one table (the tests compare each with its
reference); the training MFU per GPU class; and TRL's own defaults the estimates assume."""

from __future__ import annotations

from grpo_launch.machines.gpus import GIB
from grpo_launch.recipe.trl_schema import DEFAULTS as TRL_DEFAULTS
from grpo_launch.spec import frozen


@frozen
class Constant:
    """A number the cost model uses, its unit and where it comes from."""

    value: float
    unit: str
    source: str


# Every number the model uses. The sources say where each comes from; the cost-model issue calibrates them.
CONSTANTS: dict[str, Constant] = {
    "adam_state_bytes": Constant(12.0, "B/param", "fp32 master weights + two fp32 Adam moments (ZeRO paper, §3)"),
    "deepspeed_host_buffer_factor": Constant(
        1.5, "×", "additional_buffer_factor of DeepSpeed's estimate_zero{2,3}_model_states_mem_needs"
    ),
    # The margin of a training GPU, term by term (was a flat 2 GiB + 5 % within 90 % of the GPU).
    "cuda_context_bytes": Constant(
        0.5 * GIB,
        "B",
        "CUDA context with lazy module loading: 274 MiB after import torch (pytorch #86509), ~400 MB "
        "with CUDA >= 11.7 (pytorch #109888), plus the cuDNN/flash-attn/Triton kernels that load later",
    ),
    "cublas_workspace_bytes": Constant(
        64 * 2**20,
        "B",
        "cuBLAS workspace, 32 MiB per (handle, stream) on Hopper (PyTorch CublasHandlePool.cpp), "
        "two streams in a trainer",
    ),
    "nccl_buffer_bytes": Constant(
        0.7 * GIB, "B", "NCCL buffers of one communicator: 544 MB for 2 GPUs, 688 MB for more (nccl #964, 4×A100)"
    ),
    "overhead_fraction": Constant(
        0.15,
        "of the tensors",
        "PyTorch caching-allocator fragmentation without expandable segments: 10-33 % of the "
        "peak (GMLake, arXiv 2401.08156; compressed-tensors #587)",
    ),
    "headroom": Constant(
        0.95,
        "of GPU memory",
        "the peak a run can reach: trl #3456 ran at 95.4 % (78,147 of 81,920 MiB), vllm #2031 "
        "at 96.9 %; compressed-tensors #587 failed at 98.6 %",
    ),
    "step_uncertainty": Constant(
        0.10,
        "of a step",
        "the step-time model's error per split, of the order of 10 % on the runs it is checked against "
        "(tests/test_field_reports.py): two layouts predicted closer than this are not told apart",
    ),
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
    # vLLM V1 (TRL 1.16 runs vLLM 0.22–0.31): the fixed cost of a decode step beside reading the weights. vLLM
    # blog "The State of FP8 KV-Cache" (blog.vllm.ai/2026/04/22/fp8-kvcache.html, v0.19.1, one H100, concurrency
    # 1): Llama-3.1-8B's inter-token latency at zero context, fitted, is 6.44 ms; its 16.06 GB of weights at
    # decode_bw_efficiency take 5.64 ms. V0 spent more (Qwen2.5 speed benchmark, vLLM 0.6.3, A100: 3.1 ms fitted;
    # vLLM RFC #6854: 5–13 ms of GPU bubble), so those are lower bounds of the older engine, not this one.
    "decode_step_overhead_s": Constant(
        0.0015, "s/decode step", "vLLM V1 scheduling, sampling and launches: H100 Llama-3.1-8B ITL 6.44 ms, fitted"
    ),
    # vLLM's custom all-reduce on 8 × H100 (NVLink), measured by sglang PR #2904 (github.com/sgl-project/sglang/
    # pull/2904, 2025-01-15, "vllm" rows, without CUDA graphs): 8.7/9.2/11.8 µs at 32 KB and 26.6/40.2/45.0 µs at
    # 1 MB for TP 2/4/8. Each is a fixed latency (the 32 KB figure) plus a cost per MiB (the slope to 1 MB).
    "tp_allreduce_latency_s_tp2": Constant(8.7e-6, "s per all-reduce", "TP 2, ≤ 32 KB: sglang PR #2904"),
    "tp_allreduce_latency_s_tp4": Constant(9.2e-6, "s per all-reduce", "TP 4, ≤ 32 KB: sglang PR #2904"),
    "tp_allreduce_latency_s_tp8": Constant(11.8e-6, "s per all-reduce", "TP 8, ≤ 32 KB: sglang PR #2904"),
    "tp_allreduce_s_per_mib_tp2": Constant(18.5e-6, "s/MiB", "TP 2: (26.6 − 8.7) µs over 1 MiB − 32 KiB, ibid."),
    "tp_allreduce_s_per_mib_tp4": Constant(32.0e-6, "s/MiB", "TP 4: (40.2 − 9.2) µs over 1 MiB − 32 KiB, ibid."),
    "tp_allreduce_s_per_mib_tp8": Constant(34.3e-6, "s/MiB", "TP 8: (45.0 − 11.8) µs over 1 MiB − 32 KiB, ibid."),
    # Beyond 1 MiB (a decode batch of a few hundred sequences: 512 × 3584 × 2 B is 3.5 MiB for a 7B) vLLM no longer
    # runs the one-shot custom all-reduce those slopes measure: since vLLM 0.11 (PR #24111, on by default) it
    # dispatches by size to two-shot or symmetric-memory all-reduces. vLLM PR #24111's own benchmark (H100, TP 4,
    # the best of its dispatch): 0.015 ms at 1 MB, 0.029 ms at 4 MB; PR #24532 (H100, TP 4): 0.014 ms at 1 MB,
    # 0.028 ms at 4 MB. The slope past 1 MiB is about 4.7 µs/MiB, 7× below the one-shot slope.
    "tp_allreduce_s_per_mib_large": Constant(
        4.7e-6, "s/MiB", "NVLink, past 1 MiB: vLLM PR #24111 (H100 TP 4, 15 µs at 1 MB, 29 µs at 4 MB), PR #24532"
    ),
    # NCCL all-reduce without NVLink (vLLM's custom all-reduce is off on more than two PCIe GPUs, vllm issue
    # #56128): nccl-tests issue #287 (4 × RTX 5090, NCCL 2.26.2) 31.64 µs at 32 KB, 93.45 µs at 1 MB; sglang-V100
    # PR #2 (4 × V100 behind one PCIe switch, in a CUDA graph) 24.2 µs at 32 KB; b12x PR #139 (16 × RTX PRO 6000)
    # 36–40 µs at 14–115 KB.
    "tp_allreduce_latency_s_pcie": Constant(
        25e-6, "s per all-reduce", "TP ≤ 4 over PCIe: nccl-tests #287, sglang-V100 #2"
    ),
    "tp_allreduce_latency_s_pcie_tp8": Constant(35e-6, "s per all-reduce", "TP ≥ 8 over PCIe: b12x PR #139"),
    "tp_allreduce_s_per_mib_pcie": Constant(66e-6, "s/MiB", "15 GB/s: nccl-tests #287 algbw 11.2 GB/s at 1 MB"),
    # Pipeline stages' sends. Within a node (NVLink): NCCL issue #1259, 8 × H100, "approximately 6us" for 2 GPUs;
    # the HF Smol Training Playbook (huggingface.co/spaces/HuggingFaceTB/smol-training-playbook) measured 364.93
    # GB/s within a node. Between nodes: nccl-tests #293 (A100, InfiniBand) 20 µs small messages, #214 (A40) 31–34
    # µs send/recv; 46–48 GB/s per NDR 400 Gb/s NIC (nccl-tests #290, an NVIDIA maintainer), 42–43 GB/s send/recv
    # over 4 EFA NICs (the playbook).
    "p2p_latency_s_node": Constant(6e-6, "s per send", "NCCL within an NVLink node: NCCL issue #1259"),
    "p2p_bytes_per_s_node": Constant(365e9, "B/s", "NCCL within an H100 node: HF Smol Training Playbook"),
    "p2p_latency_s_net": Constant(25e-6, "s per send", "NCCL between nodes: nccl-tests #293 (20 µs), #214 (31–34)"),
    "p2p_bytes_per_s_net": Constant(40e9, "B/s", "one 400 Gb/s NIC: nccl-tests #290 (46–48), the playbook (42–43)"),
    # ZeRO-3 gathers each layer's parameters before its forward, again before its backward (and its recomputed
    # forward under activation checkpointing), through per-module hooks run on the host: a fixed cost per layer and
    # pass beside the bytes, which dominates a small model. DeepSpeed #1174 and PR #1188 (5.1B BERT, 64 layers, 8 ×
    # A100 NVLink, after the fix): forward 270 ms against ZeRO-2's 60 ms, 3.3 ms a layer for 160 MB gathered; BELLE
    # #402 (BLOOM-560M, 24 layers, 2 × TITAN RTX over PCIe, batch 1 × 512): 2.6 against 6.8 batches/s, 5.0 ms a
    # layer and pass for 46 MB. Less the bytes at the links' rates, about 2.5 ms is left in both.
    "zero3_layer_pass_s": Constant(
        2.5e-3,
        "s per layer and pass",
        "ZeRO-3's per-layer gather outside its bytes: DeepSpeed #1174/#1188 (3.3 ms a layer, 5B, NVLink), BELLE #402 "
        "(5.0 ms a layer, 560M, PCIe), less their bytes",
    ),
    "zero3_gather_bytes_per_s": Constant(
        150e9, "B/s", "NCCL all-gather bus bandwidth within an NVLink node: nccl-tests on 8 × A100 (~150 GB/s algbw)"
    ),
    # transformers' generate (TRL's path without vLLM) runs eager PyTorch: about 45 operators a decoder layer and
    # decode step, each a launch from Python, so a small model's decode step is bound by the host's launches, not by
    # bytes. One H200 (tests/data/gpu-evidence/h200-2026-11-28, calibrate at batch 1): 20.7 ms a step for the
    # Qwen2.5-0.5B shape (24 layers: 0.86 ms a layer), 27.0 ms for 1.5B (28 layers: 0.96 ms); a second H200 host
    # 73–84 ms for 0.5B (3.0–3.5 ms a layer). The floor is the host's: only a calibration on the machine fixes it.
    "transformers_decode_s_per_layer": Constant(
        0.9e-3,
        "s per layer and decode step",
        "transformers generate, eager, batch 1: H200 evidence 0.86 ms (0.5B) and 0.96 ms (1.5B) a layer; a slower "
        "host 3.0–3.5 ms",
    ),
    # What each sequence adds to a decode step beside the floor (the batch's attention over its cache, the cache's
    # copy, sampling over the vocabulary), per layer: the second H200 host's curve (73 ms at batch 1, 92 ms at 128,
    # 116 ms at 256, the 0.5B shape's 24 layers): 6.2 µs (1 → 128) and 7.8 µs (128 → 256); the first host's run
    # (calibrate's 20.7 ms at batch 1, 7.4–9.8 s for 256 steps at batch 128): 2.7–3.5 µs.
    "transformers_decode_s_per_seq_layer": Constant(
        5e-6,
        "s per sequence, layer and decode step",
        "H200 evidence: 6.2–7.8 µs (second host's curve), 2.7–3.5 µs (first host's run)",
    ),
    "transformers_bw_efficiency": Constant(
        0.5,
        "of peak HBM bandwidth",
        "eager attention over repeated KV heads and a cache copied each step (DynamicCache): half vLLM's "
        "decode_bw_efficiency (assumed; the floor above bounds small models)",
    ),
    "cpu_adam_params_per_s": Constant(
        3.9e9,
        "params/s per node",
        "ZeRO-Offload (Ren et al., USENIX ATC 2021) Table 4: DeepSpeed CPU-Adam 2.57 s for 10B parameters "
        "(0.22 s for 1B) on a DGX-2 host",
    ),
    # TRL's weight sync: the trainer's rank 0 broadcasts every bf16 tensor to the vLLM workers (NCCL), after a
    # fixed cost (requests to the server, pausing and resuming it). TRL PR #5892 (vLLM ≥ 0.22 weight transfer, H100,
    # one node): "~0.18s" for Qwen3-0.6B; TRL PR #5249: 0.15 s for Qwen2 0.5B; verl PR #116 (8 × L20, PCIe, the
    # broadcast alone): 0.70 s for Llama-3-8B, 0.79 s for Qwen2.5-7B; verl PR #7263 (2 nodes, AWS EFA): 3.01 s for
    # 27B; TRL PR #7131 (16 + 16 H200): "~2.3s" for Qwen3-32B; verl issue #7167: one sender's broadcast between
    # nodes "capped at ~25 GB/s". Between nodes, an upper bound rather than an anchor: verl's own ``nccl`` checkpoint
    # engine (docs/advance/delta_weight_sync.md, "Measured results", H100 nodes) takes 5.5–6.0 s for Qwen2.5-7B
    # over 1+1 nodes with param/optimizer offload on, 14.2 s for Qwen2.5-32B over 2+2 with offload off: about 5 GB/s,
    # since that engine also pays "the full-tensor all-gather and rank-0 staging costs" the TRL path above does not
    # (TRL #7131 gathers on every rank first, then rank 0 sends at ~28 GB/s). A mixed cluster's server on one GPU
    # type and trainers on another always syncs between nodes: sync_bytes_per_s_net.
    "sync_fixed_s": Constant(0.1, "s per sync", "TRL PR #5892 (0.18 s at 0.6B), PR #5249 (0.15 s at 0.5B)"),
    "sync_bytes_per_s_node": Constant(20e9, "B/s", "NCCL broadcast within a node: verl PR #116 (19–23 GB/s)"),
    "sync_bytes_per_s_net": Constant(
        20e9, "B/s", "NCCL broadcast between nodes: verl #7263 (18 GB/s), TRL #7131 (28 GB/s), verl #7167 (≤ 25)"
    ),
    "colocate_switch_s": Constant(1.0, "s", "vLLM sleep/wake fixed cost"),
    "pcie_bytes_per_s": Constant(
        25e9,
        "B/s",
        "PCIe 4.0 x16 pinned host↔device: CUDA bandwidthTest on A100-SXM4 measures 25.7–26.1 GB/s "
        "(Gen5 parts are faster; no measured figure published, so Gen4's is kept)",
    ),
    "default_prompt_len": Constant(512, "tokens", "assumed when the recipe has no max_prompt_length"),
    # Time to first step, paid again on every restart: the vLLM server ready (H100, warm compile cache, weights in
    # the page cache), the trainers' load, DeepSpeed's engine and the communicators, then the first weight sync.
    "vllm_ready_s_1_5b": Constant(
        60.0,
        "s",
        "vLLM ready for a ~1.5B model: vllm #20264 (small Llama-3.2, first response at 59 s), #15225 (up to "
        "19 s of imports before the device)",
    ),
    "vllm_ready_s_7b": Constant(
        90.0,
        "s",
        "vLLM ready for a ~7B model: vllm #11005 (Llama-3-8B on H100: engine init 14-39 s) with the load, "
        "imports and the API server (#20264)",
    ),
    "vllm_ready_s_70b": Constant(
        240.0,
        "s",
        "vLLM ready for a 70B model at TP 8: vllm #19824 (60 s P2P check + 10 s load + 15 s Dynamo + 70 s "
        "compile + 60 s graph capture = 215 s)",
    ),
    "load_bytes_per_s": Constant(
        2e9,
        "B/s",
        "safetensors from a cold local NVMe: vllm #10647 (Llama-2-7B 7.29 s, ~1.9 GB/s), transformers "
        "#48227 (~2.5-2.9 GiB/s)",
    ),
    "deepspeed_init_s": Constant(
        30.0,
        "s",
        "DeepSpeed engine init with cached ops: transformers #17417 (18 s call, "
        "+45 s when the ops are built the first time)",
    ),
    "nccl_init_s_node": Constant(
        3.0,
        "s",
        "an NCCL communicator within a node: nccl #1646 (2.6 s outside the kernels "
        "phase), nccl #587 (4.5 s first collective)",
    ),
    "nccl_init_s_nodes": Constant(10.0, "s", "across 2-16 nodes: nccl #534 (2-4 s per communicator, several of them)"),
    # The trainers' own start, before the model loads: accelerate launch and torchrun start (each a Python that
    # imports torch), then each rank imports torch, transformers and TRL. The project's REAL-COMPONENTS notes: `from
    # trl import GRPOTrainer` ≈ 5 s of a 2-core machine's ~6 s single-process run; the H200 run's trainer start-up
    # (imports, CUDA, the 0.5B model's load and the dataset) took 14 s (tests/data/gpu-evidence).
    "trainer_imports_s": Constant(
        8.0,
        "s",
        "each rank's import of torch, transformers and TRL: ≈ 5 s for TRL (REAL-COMPONENTS), 12.4 s on this "
        "project's 2-core machines (python -c 'from trl import GRPOTrainer'), 14 s for the H200 run's whole "
        "start-up with a 1 GB model",
    ),
    "launcher_start_s": Constant(
        4.0,
        "s",
        "accelerate launch and torchrun, each a Python importing torch, before a rank starts: 5.7 s for a no-op "
        "script on this project's 2-core machines, where `import torch` alone takes 4.1 s",
    ),
    # The first call of each kernel shape pays its set-up (cuBLAS heuristics, lazy module loading on a GPU; oneDNN
    # primitives on a CPU), and transformers' decode meets a new attention shape at every step (the cache grows), so
    # the first generation is slower by a cost per decode step. H200 evidence: the first generation 22.3 s, the warm
    # ones 7.4–9.8 s, for 256 steps: 48–58 ms a step; the first training step 3.4 s against 0.7–0.9 s warm.
    "first_generation_warmup_s_per_step": Constant(
        0.05, "s per decode step", "H200 evidence: first generation 22.3 s, warm 7.4–9.8 s, 256 steps"
    ),
    "first_training_warmup_s": Constant(2.6, "s", "H200 evidence: first training step 3.4 s, warm 0.73–0.93 s"),
    # Failures: The Llama 3 Herd of Models (arXiv 2407.21783), §3.3.4 and Table 5: 466 job interruptions in a 54-day
    # snapshot of pre-training on 16,384 H100 GPUs, 419 of them unexpected (GPU and host faults, networking, software
    # bugs): one per 54 × 24 × 16,384 / 419 = 50,700 GPU-hours, one every 3.1 hours at that scale.
    "gpu_hours_between_failures": Constant(
        50_700.0, "GPU-hours per failure", "Llama 3: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs"
    ),
    # A checkpoint's write, where calibrate has not measured the disk: half the read speed load_bytes_per_s assumes
    # (a datacenter NVMe writes at about half its sequential read speed; a network file system may be slower).
    "save_bytes_per_s": Constant(1e9, "B/s", "half of load_bytes_per_s (vllm #10647's 1.9 GB/s read): assumed"),
    # The prior for a whole run's lower end when neither the recipe (launch.expected_completion_length) nor a
    # previous run (--calibrate-from) gives the mean completion length.
    "expected_completion_share": Constant(
        0.6,
        "of max_completion_length",
        "TRL #5697/#5759 (Qwen2.5-0.5B-Instruct on DeepMath-103K: ~600-700 tokens per solution, 14 % truncated at "
        "max 1024); TRL #6263 (GSM8K medians 248-315 tokens for 0.5B-1.5B models)",
    ),
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


CUDA_CONTEXT_BYTES = _c("cuda_context_bytes")


CUBLAS_WORKSPACE_BYTES = _c("cublas_workspace_bytes")


NCCL_BUFFER_BYTES = _c("nccl_buffer_bytes")


OVERHEAD_FRACTION = _c("overhead_fraction")


HEADROOM = _c("headroom")
STEP_UNCERTAINTY = _c("step_uncertainty")


HOST_HEADROOM = _c("host_headroom")


VLLM_SERVER_UTILIZATION = _c("vllm_server_utilization")


VLLM_OVERHEAD_BYTES = _c("vllm_overhead_bytes")


VLLM_WEIGHTS_SHARE = _c("vllm_weights_share")


VLLM_UTILIZATION_MARGIN = _c("vllm_utilization_margin")


PREFILL_MFU = _c("prefill_mfu")


DECODE_BW_EFFICIENCY = _c("decode_bw_efficiency")


DECODE_STEP_OVERHEAD_S = _c("decode_step_overhead_s")


DEFAULT_PROMPT_LEN = int(_c("default_prompt_len"))


EXPECTED_COMPLETION_SHARE = _c("expected_completion_share")


# TRL's own defaults (generated from TRL: grpo_launch.recipe.trl_schema).
TRL_COMPLETION_LEN = int(TRL_DEFAULTS["max_completion_length"])


TRL_COLOCATE_UTILIZATION = float(TRL_DEFAULTS["vllm_gpu_memory_utilization"])


TRL_EPOCHS = float(TRL_DEFAULTS["num_train_epochs"])
