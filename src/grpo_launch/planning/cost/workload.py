"""What one optimizer step processes (the Workload every memory and time term reads), and a previous run's
calibration of it. Pure data."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from grpo_launch.machines.calibrated_speed import MeasuredTerms
from grpo_launch.spec import frozen

__all__ = ["Calibration", "MeasuredTerms", "Workload"]


@frozen
class Calibration:
    """Measured over predicted, from a previous run (``grpo-launch plan --calibrate-from RUN_DIR``): generation
    and training time, peak training memory, and the mean completion length measured; and the time terms
    ``grpo-launch calibrate`` measured on this machine (``measured``), which the scales multiply."""

    generation: float = 1.0
    training: float = 1.0
    memory: float = 1.0
    mean_completion_len: float | None = None
    source: str = ""
    measured: MeasuredTerms | None = None
    measured_source: str = ""  # the calibration file the measured terms came from
    # On GPUs, the measured terms over the table's at the point calibrate measured (generation, training): already
    # multiplied into ``generation`` and ``training``; kept apart so a run's own scales can be told from them.
    measured_generation: float = 1.0
    measured_training: float = 1.0
    # On GPUs, the measured activation memory of one micro-batch over the memory model's (calibrate), when above 1:
    # it multiplies the activation terms. Below 1 the model stays (an underestimate costs an out-of-memory failure).
    activation_memory: float = 1.0
    # On GPUs, calibrate's measured training-step peak over the memory model's tensors at that point (activations
    # already raised by ``activation_memory``), when above 1: it multiplies the memory per training GPU, like a run's
    # ``memory``. Kept apart from ``memory`` so a run's own scale can be told from it (see ``measured_generation``).
    measured_memory: float = 1.0

    @property
    def run_generation(self) -> float:
        """A run's own generation scale, without the calibration file's part (a measured term takes that part's
        place rather than multiplying it)."""
        return self.generation / self.measured_generation

    @property
    def run_training(self) -> float:
        """A run's own training scale, without the calibration file's part."""
        return self.training / self.measured_training


@frozen
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
    num_iterations: int = 1  # TRL's num_iterations: each generation is trained on that many times
    expected_completion_len: float = 0.0  # the mean completion length; 0: every completion runs to the maximum
    overlapped: bool = False  # AsyncGRPOTrainer: generation and training overlap (planning/cost/overlap.py)
    lora_base_bytes: int = 2  # bytes per parameter of a frozen LoRA base (4: AsyncGRPOConfig's float32 default)
    sync_weight_bytes: int = 2  # bytes per parameter the weight sync streams (4: float32 trainer weights)
    continuous_batching: bool = False  # vLLM off: TRL's use_transformers_continuous_batching (generate_batch)
    scale: Calibration = Calibration()

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    @property
    def generation_completions(self) -> int:
        """Completions per generation round (all processes)."""
        return self.generation_batch or self.completions

    @property
    def generations_per_step(self) -> float:
        """Generation rounds per optimizer step. TRL 1.16 generates once every steps_per_generation × num_iterations
        micro-steps (trl/trainer/grpo_trainer.py, ``_prepare_inputs``: ``generate_every``), and an optimizer step is
        gradient_accumulation_steps micro-steps: GA / (spg × num_iterations), which is completions per step over
        completions per round × num_iterations. Below 1 when one generation serves several optimizer steps."""
        return self.completions / (self.generation_completions * max(1, self.num_iterations))

    def per_generation(self) -> Workload:
        """The workload of one generation round (what vLLM generates, and the old log-probs are computed over)."""
        return replace(self, completions=self.generation_completions)

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

    def to_dict(self) -> dict[str, Any]:
        """The workload as plan.json records it (its calibration is recorded beside it), with the derived figures
        a reader may want: the mean completion length assumed."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "scale"}
        return out | {"mean_completion_len": self.mean_completion_len}

    @classmethod
    def from_dict(cls, data: dict[str, Any], scale: Calibration | None = None) -> Workload:
        """The workload :meth:`to_dict` recorded (derived figures ignored)."""
        names = {f.name for f in fields(cls)} - {"scale"}
        return cls(**{k: v for k, v in data.items() if k in names}, scale=scale or Calibration())
