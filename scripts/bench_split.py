"""Benchmark the planner's choice of GPU split and training settings against an exhaustive search.

For each model × cluster it compares the predicted time per prompt group (step time / prompts per step, by
grpo_launch.planning.cost) of:
  chosen      what `grpo-launch plan` picks (split search + cheapest memory setting that fits)
  exhaustive  the best over every split (colocate, server TP 1, 2, 4, …) × backend × offload × checkpointing that
              fits in memory
  fixed       the common hand layout: one GPU for a vLLM server (TP 1), the rest train (cheapest setting)
Prints a table and the worst chosen/exhaustive ratio (target ≥ 0.95: within 5 % of the optimum), then the
predicted against the published measurements of tests/published_cases.py.

    .venv/bin/python scripts/bench_split.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan, plan_split
from grpo_launch.planning.training import TRAINING_SETTINGS
from grpo_launch.recipe import build_recipe

MODELS = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen2.5-14B": "Qwen/Qwen2.5-14B-Instruct",
    "Qwen3-32B": "Qwen/Qwen3-32B",
}
CLUSTERS = ["2xH100-80GB", "4xH100-80GB", "8xH100-80GB", "4xL20-48GB", "8xA100-40GB", "4xRTX4090"]
RECIPE = {
    "num_generations": 8,
    "per_device_train_batch_size": 8,
    "max_prompt_length": 512,
    "max_completion_length": 1024,
}


def per_prompt(plan) -> float:
    return plan.estimate.step.total_s / (plan.layout.completions_per_optimizer_step / plan.layout.num_generations)


def candidates(topology, model):
    """Every split the search considers: colocate, and a server of each TP size."""
    per_host = len(topology.hosts[0].gpus)
    return [("colocate", 1), *(("server", t) for t in model.valid_tp_sizes(per_host - 1))]


def exhaustive(topology, values, model):
    best = None
    for forced in candidates(topology, model):
        for backend, offload, ckpt in TRAINING_SETTINGS:
            launch = {"backend": str(backend), "offload": str(offload)}
            recipe = build_recipe({**values, "gradient_checkpointing": ckpt, "launch": launch})
            try:
                plan = plan_split(topology, recipe, model, *forced)
            except PlanError:
                continue
            if plan.estimate is None:
                continue
            t = per_prompt(plan)
            if best is None or t < best[0]:
                best = (t, f"{forced[0]} TP {plan.vllm.tensor_parallel_size} {backend}/{offload}/ckpt={ckpt}")
    return best


def main() -> None:
    print(
        f"{'model':14} {'cluster':13} {'chosen s':>9} {'best s':>8} {'ratio':>6} {'fixed s':>8} {'speed-up':>8}  chosen"
    )
    ratios, speedups, plan_ms = [], [], []
    for name, hub in MODELS.items():
        model = find_model_shape(hub)
        values = {**RECIPE, "model_name_or_path": hub}
        for spec in CLUSTERS:
            topology = parse_gpu_spec(spec)
            t0 = time.perf_counter()
            try:
                chosen = make_plan(topology, build_recipe(values), model)
            except PlanError:
                print(f"{name:14} {spec:13} {'refused (does not fit)':>33}")
                continue
            plan_ms.append((time.perf_counter() - t0) * 1e3)
            best = exhaustive(topology, values, model)
            c = per_prompt(chosen)
            try:
                fixed_plan = plan_split(topology, build_recipe(values), model, "server", 1)
                fixed = per_prompt(fixed_plan)
            except PlanError:
                fixed = float("nan")
            ratio = best[0] / c
            ratios.append(ratio)
            if fixed == fixed:
                speedups.append(fixed / c)
            label = dataclasses.replace(chosen.decisions[0]).value if chosen.decisions else "-"
            print(
                f"{name:14} {spec:13} {c:9.2f} {best[0]:8.2f} {ratio:6.3f} {fixed:8.2f} {fixed / c:8.2f}  "
                f"{label}, {chosen.train.backend}/{chosen.train.offload}/ckpt={chosen.train.gradient_checkpointing}"
            )
    print()
    print(
        f"cases: {len(ratios)}; chosen/optimum (optimum time ÷ chosen time): worst {min(ratios):.3f}, "
        f"mean {sum(ratios) / len(ratios):.3f}; target ≥ 0.95"
    )
    print(
        f"speed-up over the fixed 1-GPU vLLM server layout: median {sorted(speedups)[len(speedups) // 2]:.2f}×, "
        f"max {max(speedups):.2f}×"
    )
    print(
        f"planning time with the split search: median {sorted(plan_ms)[len(plan_ms) // 2]:.1f} ms, "
        f"max {max(plan_ms):.1f} ms"
    )
    published()


def published() -> None:
    """Predicted against published measurements (the table and sources: tests/published_cases.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.published_cases import CASES

    print()
    print(f"{'published case':40} {'published':>9} {'predicted':>9} {'ratio':>6} {'band':>11}  what")
    for case in CASES:
        predicted = case.predict()
        ratio = predicted / case.published
        band = f"{case.band[0]}–{case.band[1]}"
        print(f"{case.name:40} {case.published:9.2f} {predicted:9.2f} {ratio:6.2f} {band:>11}  {case.what}")


if __name__ == "__main__":
    main()
