"""After the CPU demo: did training really change the model, and did the reward rise?

Compares the saved model with the initial tiny model tensor by tensor and reads the per-step rewards from the
trainer's log. Exits 1 when no weight moved.

Usage: python scripts/demo_check.py RUN_DIR [INITIAL_MODEL_DIR]
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    run = Path(argv[1])
    initial = Path(argv[2] if len(argv) > 2 else ".cache/tiny/model")
    from safetensors.torch import load_file

    before, after = load_file(str(initial / "model.safetensors")), load_file(str(run / "output" / "model.safetensors"))
    moved = [n for n, w in before.items() if n in after and not bool((w.to(after[n].dtype) == after[n]).all())]
    rewards = []
    for log in sorted((run / "logs").glob("train-*.log")):
        for m in re.finditer(r"(\{'loss'.*?\})\s*$", log.read_text(errors="replace"), flags=re.M):
            rewards.append(float(ast.literal_eval(m.group(1))["reward"]))
    print(f"weights: {len(moved)} of {len(before)} tensors changed by training ({after[next(iter(after))].dtype})")
    if len(rewards) >= 10:
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        print(f"reward: mean of the first 10 steps {first:.3f}, of the last 10 steps {last:.3f}")
    return 0 if moved else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
