"""Benchmark the planner's choice of GPU split against an exhaustive search and against the published hand layout.

For each model (0.5B–72B) × cluster (1–16 nodes of 8 × H100), all under the same cost model (grpo_launch.planning
.cost). The recipe sets its batch (open-r1's per-device 16 × accumulation 4), so each split runs it on its own
trainers (the batch rule, DESIGN.md) and every layout is compared per prompt (per completion):

  chosen      what `grpo-launch plan` picks (split search with its lower-bound pruning + cheapest memory setting)
  exhaustive  the best over every split the recipe allows (every kind, server size and TP × DP) × backend ×
              offload × checkpointing that fits in memory, each planned in full at the recipe's batch on its trainers
  hand        the layout open-r1 publishes: on one node a 1-GPU vLLM server and 7 trainers (README); on several,
              the last node serves as TP × DP and the others train (slurm/train.slurm), at the recipe's batch on
              its trainers (what open-r1 runs).

Prints a table, the worst chosen/exhaustive ratio of time per prompt (target ≥ 0.95) and the worst chosen/hand ratio
of time per prompt (target ≤ 1.0), then the predicted against the published measurements of tests/published_cases.py.

Mixed GPU types (issue 38; ``--mixed`` prints only these): the shipped 1.5B and 7B recipes on 8×H100 + 8×H20 and
8×H100 + 8×L40S, sync and launch.mode=auto: the chosen split's time per prompt against the best single-type use of the
same cluster, colocating on every GPU (priced at the slowest type, what the planner did before) and the H100s alone
(the others idle). Target: chosen ≤ both.

    .venv/bin/python scripts/bench_split.py [--mixed]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan, plan_split
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.planning.plan_types import Trace
from grpo_launch.planning.splits.allowed import allowed_splits
from grpo_launch.planning.splits.split import Split, SplitKind
from grpo_launch.planning.training import TRAINING_SETTINGS
from grpo_launch.recipe import build_recipe

MODELS = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen2.5-14B": "Qwen/Qwen2.5-14B-Instruct",
    "Qwen2.5-32B": "Qwen/Qwen2.5-32B-Instruct",
    "Qwen2.5-72B": "Qwen/Qwen2.5-72B-Instruct",
}
CLUSTERS = ["8xH100-80GB", "2x8xH100-80GB", "4x8xH100-80GB", "8x8xH100-80GB", "16x8xH100-80GB"]
# open-r1's demo recipe (recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml): 16 per device, accumulation 4.
RECIPE = {
    "num_generations": 16,
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 4,
    "max_prompt_length": 512,
    "max_completion_length": 1024,
}


def prompts_of(plan) -> float:
    return plan.layout.completions_per_optimizer_step / plan.layout.num_generations


def exhaustive(topology, values, model):
    """The best time per prompt over every split × training setting, each at the recipe's batch on its trainers."""
    best = None
    splits = allowed_splits(topology, build_recipe(values), model, Trace())
    for split in splits:
        for backend, offload, ckpt in TRAINING_SETTINGS:
            launch = {"backend": str(backend), "offload": str(offload)}
            recipe = build_recipe({**values, "gradient_checkpointing": ckpt, "launch": launch})
            try:
                plan = plan_split(topology, recipe, model, split)
            except PlanError:
                continue
            t = plan.estimate.step.total_s / prompts_of(plan)
            if best is None or t < best[0]:
                best = (t, f"{split.label} {backend}/{offload}/ckpt={ckpt}")
    return best, len(splits)


def hand_split(topology, model) -> Split:
    hosts, per_host = len(topology.hosts), len(topology.hosts[0].gpus)
    if hosts == 1:
        return Split(SplitKind.SERVER, 1, per_host, per_host - 1, (0,), Parallelism(1), (0,), 1)
    tps = [t for t in model.valid_tp_sizes(per_host) if per_host % t == 0]
    tp = next(t for t in tps if model.weight_bytes_bf16 / t <= 0.5 * topology.min_gpu_memory_bytes)
    return Split(SplitKind.NODES, hosts, per_host, per_host, tuple(range(hosts - 1)),
                 Parallelism(tp, dp=per_host // tp), (hosts - 1,), per_host)  # fmt: skip


def hand(topology, values, model):
    """Time per prompt of the published hand layout at the recipe's batch on its trainers."""
    split = hand_split(topology, model)
    try:
        plan = plan_split(topology, build_recipe(values), model, split)
        own = int(prompts_of(plan))
    except PlanError as exc:
        return None, f"refused: {exc.message}"
    return plan.estimate.step.total_s / own, f"{split.label} at {own} prompts"


def main() -> None:
    print(f"{'model':13} {'cluster':15} {'P':>4} {'chosen s':>9} {'best s/P':>8} {'ratio':>6} {'hand s/P':>9} "
          f"{'chosen/hand':>11}  chosen")  # fmt: skip
    ratios, hand_ratios, plan_ms = [], [], []
    for name, hub in MODELS.items():
        model = find_model_shape(hub)
        values = {**RECIPE, "model_name_or_path": hub}
        for spec in CLUSTERS:
            topology = parse_gpu_spec(spec)
            t0 = time.perf_counter()
            try:
                chosen = make_plan(topology, build_recipe(values), model)
            except PlanError as exc:
                print(f"{name:13} {spec:15} refused: {exc.message[:80]}")
                continue
            plan_ms.append((time.perf_counter() - t0) * 1e3)
            prompts = int(prompts_of(chosen))
            (best, _how), count = exhaustive(topology, values, model)
            c = chosen.estimate.step.total_s
            ratio = best / (c / prompts)
            ratios.append(ratio)
            per_hand, hand_how = hand(topology, values, model)
            vs_hand = (c / prompts) / per_hand if per_hand else float("nan")
            if per_hand:
                hand_ratios.append(vs_hand)
            split = next(d.value for d in chosen.decisions if d.what == "split")
            print(f"{name:13} {spec:15} {prompts:4d} {c:9.2f} {best:8.3f} {ratio:6.3f} "
                  f"{per_hand or float('nan'):9.3f} {vs_hand:11.2f}  {split} "
                  f"({count} splits; hand: {hand_how})")  # fmt: skip
    print()
    print(
        f"cases: {len(ratios)}; chosen/optimum (optimum ÷ chosen, time per prompt): worst {min(ratios):.3f}, "
        f"mean {statistics.mean(ratios):.3f}; target ≥ 0.95"
    )
    if hand_ratios:
        print(
            f"chosen ÷ published hand layout, time per prompt: worst {max(hand_ratios):.2f}, median "
            f"{statistics.median(hand_ratios):.2f}; target ≤ 1.0"
        )
    print(f"planning time: median {statistics.median(plan_ms):.1f} ms, max {max(plan_ms):.1f} ms")
    published()


MIXED_CLUSTERS = [("8xH100-80GB+8xH20-96GB", "8xH100-80GB"), ("8xH100-80GB+8xL40S-48GB", "8xH100-80GB")]
MIXED_RECIPES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "recipes").glob("qwen1.5b*.yaml"))
MIXED_RECIPES.append("qwen7b-math.yaml")


def colocate_on_all(topology, recipe, model) -> float | None:
    """The best time per prompt of colocating on every GPU of a mixed cluster (priced at its slowest type)."""
    from grpo_launch.planning.splits.split import enumerate_splits

    times = []
    for split in enumerate_splits(len(topology.hosts), topology.gpus_per_host[0], model):
        if split.kind != SplitKind.COLOCATE:
            continue
        try:
            plan = plan_split(topology, recipe, model, split)
        except PlanError:
            continue
        times.append(plan.estimate.step.total_s / prompts_of(plan))
    return min(times) if times else None


def mixed() -> None:
    """Chosen split on a mixed cluster against colocate-on-all and the fast type alone, time per prompt."""
    from grpo_launch.recipe import load_recipe

    root = Path(__file__).resolve().parents[1] / "recipes"
    print(f"{'recipe':22} {'cluster':24} {'mode':5} {'chosen s/P':>10} {'colocate-all':>12} {'fast alone':>10} "
          f"{'×colocate':>9} {'×alone':>6}  chosen")  # fmt: skip
    for name in MIXED_RECIPES:
        for spec, fast in MIXED_CLUSTERS:
            for mode in ("sync", "auto"):
                recipe = load_recipe(root / name, [f"launch.mode={mode}"])
                model = find_model_shape(str(recipe.values["model_name_or_path"]))
                topology = parse_gpu_spec(spec)
                try:
                    chosen = make_plan(topology, recipe, model)
                    alone = make_plan(parse_gpu_spec(fast), recipe, model)
                except PlanError as exc:
                    print(f"{name:22} {spec:24} {mode:5} refused: {exc.message[:80]}")
                    continue
                c = chosen.estimate.step.total_s / prompts_of(chosen)
                a = alone.estimate.step.total_s / prompts_of(alone)
                everyone = colocate_on_all(topology, load_recipe(root / name), model)
                e = everyone or float("nan")
                print(f"{name:22} {spec:24} {mode:5} {c:10.3f} {e:12.3f} {a:10.3f} {e / c:9.2f} {a / c:6.2f}  "
                      f"{chosen.split}")  # fmt: skip


def published() -> None:
    """Predicted against published measurements (the table and sources: tests/published_cases.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.published_cases import CASES

    print()
    print(f"{'published case':44} {'published':>9} {'predicted':>9}  check")
    for case in CASES:
        predicted = case.predict()
        print(f"{case.name:44} {case.published:9.2f} {predicted:9.2f}  {case.describe(predicted)}")


if __name__ == "__main__":
    if "--mixed" in sys.argv[1:]:
        mixed()
    else:
        main()
        print()
        mixed()
