"""Benchmark the planning path.

1. `grpo-launch plan recipes/qwen1.5b.yaml --gpus 8xH100-80GB` wall time (median of N runs; target ≤ 150 ms on a
   quiet machine, with no private API of any library), beside `python -c "import yaml"` measured in the same run,
   interleaved, to tell a slow machine from a slow plan; the table (rich) and the --json path are measured
   separately. Bytecode caching is
   on for the measured commands, as for any installed package (this workplace sets PYTHONDONTWRITEBYTECODE=1,
   which would compile grpo-launch's sources on every start while site-packages' yaml loads precompiled).
2. `python -X importtime` of that command: torch/trl/transformers/deepspeed/accelerate must not appear.
3. make_plan for 128 nodes × 8 GPUs in-process (median; target ≤ 50 ms).

Usage: python scripts/bench_plan.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "trl", "transformers", "deepspeed", "accelerate")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "grpo_launch", "plan", "recipes/qwen1.5b.yaml", "--gpus", "8xH100-80GB", "--no-write"]
    commands = {"import yaml": [sys.executable, "-c", "import yaml"], "plan": cmd, "plan --json": [*cmd, "--json"]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)  # writes the bytecode caches
    walls: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, argv in commands.items():  # interleaved, so load changes hit all three alike
            t = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, env=env)
            walls[name].append(time.perf_counter() - t)
    base = statistics.median(walls["import yaml"])
    for name, times in walls.items():
        med = statistics.median(times)
        print(
            f"{name:12} median {med * 1000:4.0f} ms (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}) "
            f"= {med / base:.2f}× import yaml" + ("" if name == "import yaml" else " (target ≤ 150 ms)")
        )

    proc = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], cwd=ROOT, capture_output=True, text=True)
    modules = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    heavy = sorted(m for m in HEAVY if m in modules)
    print(f"-X importtime: {len(modules)} top-level packages imported; heavy ones: {heavy or 'none'}")

    sys.path.insert(0, str(ROOT / "src"))
    from grpo_launch.machines.topology import parse_gpu_spec
    from grpo_launch.models.builtin import find_model_shape
    from grpo_launch.planning import make_plan
    from grpo_launch.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "qwen1.5b.yaml")
    topology = parse_gpu_spec("128x8xH100-80GB")
    model = find_model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    times = []
    for _ in range(20):
        t = time.perf_counter()
        plan = make_plan(topology, recipe, model)
        times.append(time.perf_counter() - t)
    print(
        f"make_plan 128 × 8 GPUs in-process: median {statistics.median(times) * 1000:.2f} ms "
        f"({plan.train.num_processes} trainers, vLLM TP {plan.vllm.tensor_parallel_size}) (target ≤ 50 ms)"
    )
    return 1 if heavy else 0


if __name__ == "__main__":
    raise SystemExit(main())
