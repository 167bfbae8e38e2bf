"""Published GRPO measurements, each with its source, the configuration it ran and the band our prediction must
fall in. Read by tests/test_published_cases.py and printed by scripts/bench_split.py (predicted vs published).

Where a case ran an older TRL, its configuration is translated to TRL 1.16 terms and the translation is stated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import plan_split
from grpo_launch.recipe import build_recipe

from .helpers import plan_recipe


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    what: str  # what is compared
    published: float
    band: tuple[float, float]  # predicted / published must lie in it
    predict: Callable[[], float]


def _plan(values: dict, spec: str, model: str | None = None):
    return plan_recipe(values, spec, model=model or values["model_name_or_path"])


def _per_prompt(p) -> float:
    return p.estimate.step.total_s / (p.layout.completions_per_optimizer_step / p.layout.num_generations)


def _colocate_advantage(model: str) -> Callable[[], float]:
    """Time per prompt group of a 1-GPU vLLM server over that of the split the planner chooses (colocate)."""

    def predict() -> float:
        values = {"model_name_or_path": model, "num_generations": 8, "per_device_train_batch_size": 8,
                  "max_prompt_length": 512, "max_completion_length": 1024}  # fmt: skip
        chosen = _plan(values, "8xH100-80GB")
        if chosen.vllm.mode != "colocate":
            return 0.0  # the published winner was not chosen: outside any band
        topology, shape = parse_gpu_spec("8xH100-80GB"), find_model_shape(model)
        server = plan_split(topology, build_recipe(values), shape, "server", 1)
        return _per_prompt(server) / _per_prompt(chosen)

    return predict


# open-r1 issue #251 (github.com/huggingface/open-r1/issues/251): Qwen2.5-Math-7B, config_simple_rl.yaml of
# 2025-02-07, 8 × H100 SXM: 7 training processes + 1 vLLM GPU, ZeRO-2, num_generations 7, per-device batch 2,
# gradient accumulation 8, prompts ≤ 512 and completions ≤ 1024 tokens, gradient checkpointing; logged mean
# completion length 639; 68.6–70 s per step (468 steps ≈ 9 h). TRL 0.15 generated once per micro-step (2 prompts
# × 7 per call), which is TRL 1.16's steps_per_generation=1.
OPEN_R1_251 = {
    "model_name_or_path": "Qwen/Qwen2.5-Math-7B",
    "num_generations": 7,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 8,
    "steps_per_generation": 1,
    "max_prompt_length": 512,
    "max_completion_length": 1024,
    "gradient_checkpointing": True,
    "bf16": True,
    "launch": {"vllm": "server", "vllm_gpus": 1, "backend": "zero2", "offload": "none",
               "expected_completion_length": 639},
}  # fmt: skip


def _open_r1_251_step() -> float:
    return _plan(OPEN_R1_251, "8xH100-80GB", "Qwen/Qwen2.5-7B").estimate.step.total_s


def _open_r1_251_memory() -> float:
    """Predicted memory per training GPU over the budget: the run trained, so it must fit (≤ 1)."""
    p = _plan(OPEN_R1_251, "8xH100-80GB", "Qwen/Qwen2.5-7B")
    return p.estimate.train_memory_gib / (0.9 * p.estimate.gpu_memory_gib)


CASES: tuple[Case, ...] = (
    Case(
        "TRL colocate vs server, Qwen2.5-1.5B",
        'Hugging Face blog "No GPU left behind: Unlocking Efficiency with Co-located vLLM in TRL" '
        "(huggingface.co/blog/vllm-colocate, 2025-06-03), 8 GPUs",
        "speed-up of colocate over a 1-GPU server (the planner must pick colocate)",
        1.43,
        (0.7, 1.4),
        _colocate_advantage("Qwen/Qwen2.5-1.5B-Instruct"),
    ),
    Case(
        "TRL colocate vs server, Qwen2.5-7B",
        "same blog, 8 GPUs, TP sweep",
        "speed-up of colocate over a 1-GPU server (the planner must pick colocate)",
        1.73,
        (0.7, 1.4),
        _colocate_advantage("Qwen/Qwen2.5-7B-Instruct"),
    ),
    Case(
        "open-r1 #251 step time",
        "github.com/huggingface/open-r1/issues/251 (8 × H100, 7 train + 1 vLLM, ZeRO-2)",
        "seconds per optimizer step",
        69.3,
        (0.75, 1.33),
        _open_r1_251_step,
    ),
    Case(
        "open-r1 #251 memory",
        "same run: it trained without offload",
        "predicted memory per training GPU ÷ 90 % of 80 GiB (published: it fit)",
        1.0,
        (0.2, 1.0),
        _open_r1_251_memory,
    ),
)
