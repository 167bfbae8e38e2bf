"""Launcher overhead and time to first step, on CPU with the tiny recipe.

A: `grpo-launch recipes/tiny-cpu.yaml` (plan + render + supervise), B: the same rendered `accelerate launch`
command run by hand with the same environment. Runs are interleaved, alternating which goes first; the ratio of
medians is the overhead (target ≤ 1.03). For A, the time from the command to milestones seen in its output:
trainer processes up (imports + process group), trainer ready (model, dataset, GRPOTrainer built), first step.

Usage: python scripts/bench_launch.py [--runs N] [--steps S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MILESTONES = {"processes up": "trainer process 0/", "trainer ready": "starting fresh", "first step": "{'loss'"}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    t0 = time.perf_counter()
    seen: dict[str, float] = {}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        for name, needle in MILESTONES.items():
            if name not in seen and needle in line:
                seen[name] = time.perf_counter() - t0
    if proc.wait() != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    return time.perf_counter() - t0, seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    subprocess.run(
        [sys.executable, "scripts/make_tiny_assets.py", ".cache/tiny"], cwd=ROOT, check=True, capture_output=True
    )
    run_a, run_b = Path("/tmp/grpo-bench-a"), Path("/tmp/grpo-bench-b")
    grpo = [sys.executable, "-m", "grpo_launch", "recipes/tiny-cpu.yaml", f"max_steps={args.steps}", "save_strategy=no"]
    # Render once to get B's exact command and environment.
    plan = subprocess.run(
        [*grpo[:3], "plan", *grpo[3:], "--run-dir", str(run_b), "--json"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    train = json.loads(plan.stdout)["train"]["commands"][0]
    env_b = {**os.environ, **train["env"], "PYTHONUNBUFFERED": "1"}
    a_times, b_times, marks = [], [], []
    for i in range(args.runs):
        for p in (run_a, run_b):
            subprocess.run(["rm", "-rf", str(p / "output")], check=False)
        # Alternate which goes first, so that warm caches favour neither.
        if i % 2:
            tb, _ = timed(train["argv"], env_b)
            ta, seen = timed([*grpo, "--run-dir", str(run_a)], dict(os.environ))
        else:
            ta, seen = timed([*grpo, "--run-dir", str(run_a)], dict(os.environ))
            tb, _ = timed(train["argv"], env_b)
        a_times.append(ta)
        b_times.append(tb)
        marks.append(seen)
        print(f"run {i + 1}: grpo-launch {ta:.2f} s, by hand {tb:.2f} s", flush=True)
    ma, mb = statistics.median(a_times), statistics.median(b_times)
    print(
        f"\nmedian: grpo-launch {ma:.2f} s, accelerate launch by hand {mb:.2f} s, ratio {ma / mb:.3f} (target ≤ 1.03)"
    )
    print(f"time to milestones with grpo-launch ({args.steps} steps, 2 CPU processes), median over {args.runs} runs:")
    for name in MILESTONES:
        vals = [m[name] for m in marks if name in m]
        if vals:
            print(f"  {name:14s} {statistics.median(vals):6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
