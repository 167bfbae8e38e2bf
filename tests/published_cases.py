"""Published GRPO measurements and layouts, each with its source, the configuration it ran and the check our
prediction must pass. Read by tests/test_published_cases.py and printed by scripts/bench_split.py.

A check is a band on predicted ÷ published, or one-sided where the source only tells a direction ("it fit", "colocate
was faster"). Every comparison of two layouts is like for like: the same recipe at the same prompts per optimizer
step. Where a case ran an older TRL, its configuration is translated to TRL 1.16 terms and the translation is stated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import plan_split
from grpo_launch.planning.cost.constants import HEADROOM
from grpo_launch.planning.split import Split, SplitKind
from grpo_launch.recipe import load_recipe

from .helpers import ROOT, plan_recipe


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    what: str  # what is compared
    published: float
    predict: Callable[[], float]
    low: float | None = None  # predicted ÷ published must be ≥ low (None: no lower bound)
    high: float | None = None  # … and ≤ high (None: no upper bound)

    def holds(self, predicted: float) -> bool:
        ratio = predicted / self.published
        return (self.low is None or ratio >= self.low) and (self.high is None or ratio <= self.high)

    def describe(self, predicted: float) -> str:
        bounds = " and ".join(
            f"{word} {value:g}" for word, value in (("≥", self.low), ("≤", self.high)) if value is not None
        )
        verdict = "ok" if self.holds(predicted) else "FAILS"
        return f"{verdict}: predicted ÷ published {predicted / self.published:.2f} must be {bounds} ({self.what})"


def _per_prompt(plan) -> float:
    return plan.estimate.step.total_s / (plan.layout.completions_per_optimizer_step / plan.layout.num_generations)


# ------------------------------------------------------------------ TRL's co-located vLLM blog (8 GPUs, one node)
BLOG = (
    'Hugging Face blog "No GPU left behind: Unlocking Efficiency with Co-located vLLM in TRL" '
    "(huggingface.co/blog/vllm-colocate, 2025-06-03)"
)
ONE_GPU_SERVER = Split(SplitKind.SERVER, 1, 8, 7, (0,), 1, 1, (0,), 1)  # the blog's baseline: 1 vLLM GPU, 7 trainers


def _colocate_speedup(recipe_name: str, prompts: int, tp: int = 1) -> float:
    """Step time of a 1-GPU server over colocated engines (TP ``tp``), both at ``prompts`` per step, on 8 × H100,
    with the shipped recipe: the blog's comparison, like for like."""
    recipe = load_recipe(ROOT / "recipes" / f"{recipe_name}.yaml")
    topology = parse_gpu_spec("8xH100-80GB")
    shape = find_model_shape(recipe.values["model_name_or_path"])
    colocate = Split(SplitKind.COLOCATE, 1, 8, 8, (0,), tp, 8 // tp)
    server = plan_split(topology, recipe, shape, ONE_GPU_SERVER, prompts=prompts)
    return (
        server.estimate.step.total_s
        / plan_split(topology, recipe, shape, colocate, prompts=prompts).estimate.step.total_s
    )


def _chosen_mode_is_colocate(recipe_name: str) -> float:
    """1.0 when the planner, given the shipped recipe as it is, picks colocate on 8 × H100 (else 0.0)."""
    plan = plan_recipe(ROOT / "recipes" / f"{recipe_name}.yaml", "8xH100-80GB")
    return 1.0 if plan.vllm.mode == "colocate" else 0.0


def _gain_grows_with_batch(recipe_name: str, batches: tuple[int, ...]) -> float:
    """The smallest step of the colocate gain over the batch sweep, as a ratio (≥ 1: it never falls). The blog's
    batch sweeps show the gain growing with the batch: generation dominates more as the batch grows."""
    gains = [_colocate_speedup(recipe_name, p) for p in batches]
    return min(b / a for a, b in itertools.pairwise(gains))


# ------------------------------------------------------------------ open-r1 issue #251 (8 × H100, TRL 0.15)
# github.com/huggingface/open-r1/issues/251: Qwen2.5-Math-7B, recipes/Qwen2.5-Math-7B/grpo/config_simple_rl.yaml
# as of open-r1 commit 2025-02-07 (the date), 8 × H100 SXM: 7 training processes + 1 vLLM GPU, ZeRO-2,
# num_generations 7, per-device batch 2, gradient accumulation 8, prompts ≤ 512 and completions ≤ 1024 tokens,
# gradient checkpointing; logged mean completion length 639; 68.6–70 s per step (468 steps ≈ 9 h). TRL 0.15
# generated once per micro-step (2 prompts × 7 per call), which is TRL 1.16's steps_per_generation=1.
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


def _open_r1_251():
    return plan_recipe(OPEN_R1_251, "8xH100-80GB", model="Qwen/Qwen2.5-7B")


def _open_r1_251_memory() -> float:
    """Predicted memory per training GPU over the budget (HEADROOM, 95 %, of 80 GiB)."""
    p = _open_r1_251()
    return p.estimate.train_memory_gib / (HEADROOM * p.estimate.gpu_memory_gib)


# ------------------------------------------------------------------ open-r1's Slurm layout (a dedicated vLLM node)
# github.com/huggingface/open-r1 slurm/train.slurm: on N nodes the last node runs `trl vllm-serve` with
# --tensor_parallel_size / --data_parallel_size over its 8 GPUs, accelerate trains on the other N−1.
def _chosen_over_dedicated_node(recipe_name: str, spec: str) -> float:
    """The chosen split's step time per prompt over that of open-r1's layout (the last node serves as TP × DP),
    at the chosen batch. The published layout must plan as it is; the chosen one may not be slower (≤ 1)."""
    path = ROOT / "recipes" / f"{recipe_name}.yaml"
    chosen = plan_recipe(path, spec)
    hand = plan_recipe(path, spec, "launch.vllm=server", f"launch.vllm_gpus={len(chosen.topology.hosts[0].gpus)}",
                       f"launch.prompts_per_step={_prompts(chosen)}")  # fmt: skip
    assert (
        hand.vllm.host == chosen.topology.hosts[-1].name and hand.train.num_machines == len(chosen.topology.hosts) - 1
    )
    return _per_prompt(chosen) / _per_prompt(hand)


def _prompts(plan) -> int:
    return plan.layout.completions_per_optimizer_step // plan.layout.num_generations


# ------------------------------------------------------------------ TRL's multi-node docs (72B on 4 nodes)
# huggingface.co/docs/trl/main/en/vllm_integration ("multi-node"): Qwen2.5-72B, 4 nodes of 8 GPUs, one node runs
# `trl vllm-serve --tensor_parallel_size 8`, the other 3 train with ZeRO-3.
def _trl_docs_72b() -> float:
    model = "Qwen/Qwen2.5-72B-Instruct"
    values = {"model_name_or_path": model, "num_generations": 8, "per_device_train_batch_size": 1,
              "max_prompt_length": 512, "max_completion_length": 1024, "gradient_checkpointing": True}  # fmt: skip
    docs = plan_recipe({**values, "launch": {"vllm": "server", "vllm_gpus": 8, "vllm_tensor_parallel_size": 8}},
                       "4x8xH100-80GB")  # fmt: skip
    assert docs.vllm.host == "node3" and docs.train.num_processes == 24  # the docs' layout plans as it is
    chosen = plan_recipe({**values, "launch": {"prompts_per_step": _prompts(docs)}}, "4x8xH100-80GB")
    return _per_prompt(chosen) / _per_prompt(docs)


CASES: tuple[Case, ...] = (
    Case("TRL blog: 1.5B picks colocate", BLOG + ", 8 GPUs; recipes/qwen1.5b.yaml as shipped",
         "1 when the planner picks colocate", 1.0, lambda: _chosen_mode_is_colocate("qwen1.5b"), low=1.0),
    Case("TRL blog: 7B picks colocate", BLOG + ", 8 GPUs; recipes/qwen7b-math.yaml as shipped",
         "1 when the planner picks colocate", 1.0, lambda: _chosen_mode_is_colocate("qwen7b-math"), low=1.0),
    # The blog's 1.5B figure: colocate 1.43× the throughput of a 1-GPU server on 8 GPUs. Compared at 28 prompts
    # per step (224 completions), a batch both 8 and 7 trainers take, TP 1 as in the blog's 1.5B runs.
    Case("TRL blog: 1.5B colocate speed-up", BLOG + ", Qwen2.5-1.5B, 8 GPUs, 1-GPU server baseline",
         "speed-up of colocate over a 1-GPU server, same recipe and batch", 1.43,
         lambda: _colocate_speedup("qwen1.5b", 28), low=0.8, high=1.25),
    Case("TRL blog: the gain grows with the batch", BLOG + ", batch sweeps at 1.5B and 7B",
         "each larger batch's speed-up ÷ the smaller's (7, 14, 28, 56 prompts)", 1.0,
         lambda: _gain_grows_with_batch("qwen1.5b", (7, 14, 28, 56)), low=1.0),
    # The blog's 7B batch sweep peaks at 1.35×, with its own (shorter) completions; the shipped 7B recipe generates
    # up to 3,000 tokens, where generation weighs more: only the direction is checked there.
    Case("TRL blog: 7B colocate is faster", BLOG + ", Qwen2.5-7B batch sweep, up to 1.35×",
         "colocate's speed-up over a 1-GPU server is above 1 (shipped recipe, 28 prompts)", 1.0,
         lambda: _colocate_speedup("qwen7b-math", 28), low=1.0),
    Case("open-r1 #251 step time", "github.com/huggingface/open-r1/issues/251 (8 × H100, 7 train + 1 vLLM, ZeRO-2)",
         "seconds per optimizer step", 69.3, lambda: _open_r1_251().estimate.step.total_s, low=0.75, high=1.33),
    Case("open-r1 #251 memory: it fit", "same run, open-r1 config_simple_rl.yaml of 2025-02-07: it trained "
         "without offload", "predicted memory per training GPU ÷ 95 % of 80 GiB", 1.0, _open_r1_251_memory, high=1.0),
    Case("open-r1 Slurm layout, 7B on 2 nodes", "github.com/huggingface/open-r1 slurm/train.slurm (last node serves)",
         "chosen ÷ dedicated-node layout, time per prompt", 1.0,
         lambda: _chosen_over_dedicated_node("qwen7b-math", "2x8xH100-80GB"), high=1.0),
    Case("open-r1 Slurm layout, 7B on 4 nodes", "github.com/huggingface/open-r1 slurm/train.slurm (last node serves)",
         "chosen ÷ dedicated-node layout, time per prompt", 1.0,
         lambda: _chosen_over_dedicated_node("qwen7b-math", "4x8xH100-80GB"), high=1.0),
    Case("TRL multi-node docs, 72B on 4 nodes", "huggingface.co/docs/trl/main/en/vllm_integration (1 node serves at "
         "TP 8, 3 train)", "chosen ÷ the docs' layout, time per prompt", 1.0, _trl_docs_72b, high=1.0),
)  # fmt: skip

assert all(math.isfinite(c.published) and c.published > 0 for c in CASES)
