#!/usr/bin/env bash
# The main job on a fresh machine: set up, build the tiny local model and dataset, and run a real GRPO training
# with 2 CPU processes through grpo-launch (no GPU, nothing downloaded), then check that the weights changed and
# the reward rose. About two minutes on 2 cores. Each demo starts fresh in grpo_runs/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/make_tiny_assets.py .cache/tiny
run=grpo_runs/demo
rm -rf "$run"
.venv/bin/grpo-launch recipes/tiny-cpu.yaml --run-dir "$run" "$@"
.venv/bin/python scripts/demo_check.py "$run" .cache/tiny/model
