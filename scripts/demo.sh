#!/usr/bin/env bash
# The main job on a fresh machine: set up, build the tiny local model and dataset, and run a real GRPO training
# with 2 CPU processes through grpo-launch (no GPU, nothing downloaded). About two minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/make_tiny_assets.py .cache/tiny
exec .venv/bin/grpo-launch recipes/tiny-cpu.yaml "$@"
