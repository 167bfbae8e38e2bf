"""After the CPU demo: did training really change the model, and did the reward rise?

Compares the saved model with the initial tiny model tensor by tensor and reads the per-step rewards from the
run's metrics.jsonl (what the run report plots). Exits 1 when no weight moved or the reward did not rise.

Usage: python scripts/demo_check.py RUN_DIR [INITIAL_MODEL_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    run = Path(argv[1])
    initial = Path(argv[2] if len(argv) > 2 else ".cache/tiny/model")
    from safetensors.torch import load_file

    before, after = load_file(str(initial / "model.safetensors")), load_file(str(run / "output" / "model.safetensors"))
    moved = [n for n, w in before.items() if n in after and not bool((w.to(after[n].dtype) == after[n]).all())]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rewards = [float(x["log"]["reward"]) for x in lines if "reward" in (x.get("log") or {})]
    print(f"weights: {len(moved)} of {len(before)} tensors changed by training ({after[next(iter(after))].dtype})")
    rose = True
    if len(rewards) >= 10:
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        rose = last > first
        print(f"reward: mean of the first 10 steps {first:.3f}, of the last 10 steps {last:.3f}")
    report = run / "report" / "report.html"
    if report.is_file():
        print(f"run report (reward curve and more): {report}")
    return 0 if moved and rose else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
