"""This machine's speed as ``grpo-launch calibrate`` measured it: the terms the planner uses in place of the GPU
table's (planning/cost/measured_time.py), stored by probe/calibration.py. Pure data."""

from __future__ import annotations

from itertools import pairwise

from grpo_launch.spec import frozen


@frozen
class MeasuredTerms:
    """The time terms ``grpo-launch calibrate`` measured on this machine, in place of the GPU table's (on CPU,
    where the table has none, the only step time there is). Per process, at ``threads`` threads on CPU.

    ``decode``: (batch, seconds per decode step) pairs at the recipe's completion length through transformers'
    generate (TRL's path without vLLM); ``vllm_decode``: the same through vLLM (empty: not measured);
    ``prefill_s``: one micro-batch's prompt pass; ``train_tokens_per_s`` (``_ckpt``: with activation
    checkpointing) and ``forward_tokens_per_s``: one optimizer step's forward/backward, and a forward alone, over
    padded tokens; ``sync_s`` (the weights sent trainer → server, :mod:`grpo_launch.probe.bench_sync`), ``load_s``,
    ``engine_start_s``: None where not measured; ``overhead_*``: TRL's own per-step time, from a short real run."""

    device: str
    decode: tuple[tuple[int, float], ...] = ()
    vllm_decode: tuple[tuple[int, float], ...] = ()
    prefill_s: float = 0.0
    train_tokens_per_s: float = 0.0
    train_tokens_per_s_ckpt: float = 0.0
    forward_tokens_per_s: float = 0.0
    sync_s: float | None = None
    load_s: float | None = None
    engine_start_s: float | None = None
    peak_memory_bytes: int | None = None  # the training step's peak (GPU: CUDA's max allocated; CPU: the RSS)
    peak_memory_bytes_ckpt: int | None = None  # the same with activation checkpointing
    threads: int = 0
    # One micro-batch's forward and backward as GRPOTrainer runs them, above what the process held before (the
    # memory model's activation terms; None: not measured), with activations ``value_bytes`` wide (4: float32).
    activation_peak_bytes: int | None = None
    activation_peak_bytes_ckpt: int | None = None  # the same with activation checkpointing
    value_bytes: int = 0
    # The training step's whole peak as GRPOTrainer runs it (TRL's fused LM head, the weights, gradients and AdamW's
    # moments held: GPU, CUDA's max allocated; CPU, the resident high-water mark, libraries included), and the memory
    # model's tensors at the same point (planning/calibration.py ``step_peak_prediction``), stored beside it.
    step_peak_bytes: int | None = None
    step_peak_bytes_ckpt: int | None = None
    step_peak_predicted_bytes: int | None = None
    step_peak_predicted_bytes_ckpt: int | None = None
    # How ``sync_s`` was measured: "nccl" between two GPUs of this machine (TRL's path within a node), "gloo" on CPU
    # (not TRL's path: it is never used for a GPU plan).
    sync_path: str = ""
    # What TRL's trainer adds per step beyond these kernels (prompt handling, rewards, gathering, logging, the
    # gradient all-reduce between processes), from a few real steps of the recipe: measured − the terms above.
    overhead_generation_s: float = 0.0  # per generation round
    overhead_training_s: float = 0.0  # per optimizer step
    overhead_steps: int = 0  # the real steps it was measured over (0: not measured)

    def decode_step_s(self, batch: int, *, vllm: bool = False) -> float:
        """Seconds per decode step at ``batch`` (``vllm``: vLLM's, when measured): the measured batch nearest it,
        scaled linearly between the two measured batches around it (beyond the largest: per sequence, as at the
        largest)."""
        points = sorted(self.vllm_decode if vllm and self.vllm_decode else self.decode)
        b = max(1, batch)
        if b <= points[0][0]:
            return points[0][1]
        for (b0, s0), (b1, s1) in pairwise(points):
            if b <= b1:
                return s0 + (s1 - s0) * (b - b0) / (b1 - b0)
        top, s = points[-1]
        return s * b / top
