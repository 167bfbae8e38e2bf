"""This machine's speed as ``grpo-launch calibrate`` measured it: the terms the planner uses in place of the GPU
table's (planning/cost/measured_time.py), stored by probe/calibration_store.py. Pure data."""

from __future__ import annotations

from itertools import pairwise

from grpo_launch.spec import frozen


@frozen
class MeasuredTerms:
    """The time terms ``grpo-launch calibrate`` measured on this machine, in place of the GPU table's (on CPU,
    where the table has none, the only step time there is). Per process, at ``threads`` threads on CPU.

    ``decode``: (batch, seconds per decode step) of transformers' ``generate`` as TRL calls it (its generation
    config, left-padded prompts), at the mean context (the prompt plus half the completion); ``cb_decode``: the
    same through transformers' continuous batching (TRL's ``use_transformers_continuous_batching``);
    ``vllm_decode``: through vLLM (each empty: not measured); ``prefill_s``: ``prefill_batch`` prompts' pass;
    ``train_tokens_per_s`` (``_ckpt``: with activation checkpointing) and ``forward_tokens_per_s``: one optimizer
    step's forward/backward, and a forward alone, over padded tokens, without a distributed engine (DDP's compute on
    one device); ``backend_train``: (backend, checkpointing, tokens/s) through DeepSpeed's or FSDP2's engine at world
    size 1; ``fused_head``: the training rates were measured as TRL runs them, through its fused LM head (False:
    torch's log-softmax over the whole logits, as calibrations before it did); ``sync_s`` (the weights sent trainer
    → server, :mod:`grpo_launch.probe.bench_sync`), ``load_s`` (of ``load_bytes`` from disk; ``load_bytes`` 0: an
    initialisation, not a load), ``engine_start_s``: None where not measured; ``imports_s``, ``warmup_*``,
    ``deepspeed_init_s``: the first step's phases; ``overhead_*``: TRL's own per-step time, from a short real run."""

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
    # One micro-batch's forward and backward as GRPOTrainer runs it, above what the process held before (the
    # memory model's activation terms; None: not measured), with activations ``value_bytes`` wide (4: float32).
    activation_peak_bytes: int | None = None
    activation_peak_bytes_ckpt: int | None = None  # the same with activation checkpointing
    value_bytes: int = 0
    # The training step's whole peak as GRPOTrainer runs it (TRL's fused LM head, the weights, gradients and AdamW's
    # moments held: GPU, CUDA's max allocated; CPU, the resident high-water mark, libraries included), and the memory
    # model's tensors at the same point (planning/measured_scales.py ``step_peak_prediction``), stored beside it.
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
    cb_decode: tuple[tuple[int, float], ...] = ()
    prefill_batch: int = 0  # the prompts ``prefill_s`` passed (0: the calibration's micro-batch)
    backend_train: tuple[tuple[str, bool, float], ...] = ()
    fused_head: bool = False
    load_bytes: int = 0
    save_bytes_per_s: float | None = None  # the disk's write speed (a checkpoint's), with fsync
    imports_s: float | None = None  # import torch, transformers and TRL in a fresh interpreter
    warmup_decode_s_per_step: float | None = None  # the first generate's extra per decode step over a warm one
    warmup_training_s: float | None = None  # the first training step's extra over a warm one
    deepspeed_init_s: float | None = None  # deepspeed.initialize of the model (the ZeRO measurement's)
    cuda_init_s: float | None = None  # the CUDA context's start in a fresh process (None: a CPU, or not measured)
    process_group_s: float | None = None  # torch.distributed's start at world size 1 (NCCL on a GPU, gloo on CPU)

    def decode_step_s(self, batch: int, *, engine: str = "generate", per_sequence_s: float = 0.0) -> float:
        """Seconds per decode step at ``batch`` through ``engine`` ("generate", "continuous" or "vllm"): linear between
        the two measured batches around it; below the smallest, the smallest's; beyond the largest, on along the
        last two points' line (a decode step is a floor plus a cost per sequence), or with one point measured,
        ``per_sequence_s`` (the table's) per sequence more."""
        points = sorted(self.curve(engine))
        b = max(1, batch)
        if b <= points[0][0]:
            return points[0][1]
        for (b0, s0), (b1, s1) in pairwise(points):
            if b <= b1:
                return s0 + (s1 - s0) * (b - b0) / (b1 - b0)
        top, s = points[-1]
        slope = max(0.0, (s - points[-2][1]) / (top - points[-2][0])) if len(points) > 1 else per_sequence_s
        return s + slope * (b - top)

    def curve(self, engine: str) -> tuple[tuple[int, float], ...]:
        """The measured (batch, seconds per decode step) of one generation engine (empty: not measured)."""
        return {"generate": self.decode, "continuous": self.cb_decode, "vllm": self.vllm_decode}[engine]

    def training_rate(self, backend: str, checkpointing: bool) -> float | None:
        """Tokens/s of one process's training step through ``backend`` ("ddp": no engine), or None."""
        if backend == "ddp":
            rate = self.train_tokens_per_s_ckpt if checkpointing else self.train_tokens_per_s
            return rate or None
        for name, ckpt, value in self.backend_train:
            if name == backend and ckpt == checkpointing and value > 0:
                return value
        return None
